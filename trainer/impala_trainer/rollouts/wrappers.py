"""Wrappers the product ships for `env.wrappers` (`import: impala_trainer.rollouts.wrappers:Name`).

`KeepObservations` makes a partially observed problem of a fully observed one: CartPole keeping
only position and angle (indices [0, 2]) is RLlib's StatelessCartPole, the standard check that a
recurrent policy remembers what a feed-forward one cannot see (the velocities).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class KeepObservations(gym.ObservationWrapper):  # type: ignore[misc]  # gymnasium is untyped here
    """Keep the listed entries of a 1-D Box observation, in the order given."""

    def __init__(self, env: gym.Env, indices: list[int]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"KeepObservations needs a 1-D Box observation space, not {space}")
        size = space.shape[0]
        bad = [i for i in indices if not -size <= i < size]
        if not indices or bad:
            raise ValueError(f"indices {indices} must be non-empty and within [0, {size})")
        self.indices = np.asarray(indices, np.int64)
        self.observation_space = gym.spaces.Box(
            space.low[self.indices], space.high[self.indices], dtype=space.dtype
        )

    def observation(self, observation: Any) -> np.ndarray:
        return np.asarray(observation)[self.indices]
