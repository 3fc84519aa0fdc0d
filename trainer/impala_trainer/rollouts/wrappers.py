"""Wrappers the product ships for `env.wrappers` (`import: impala_trainer.rollouts.wrappers:Name`).

`KeepObservations` makes a partially observed problem of a fully observed one: CartPole keeping
only position and angle (indices [0, 2]) is RLlib's StatelessCartPole, the standard check that a
recurrent policy remembers what a feed-forward one cannot see (the velocities).
`RescaleObservations` maps a bounded Box observation onto [low, high] by its bounds: a fixed
scale, which plays the same in evaluation and in an exported policy (a running mean/std filter
lives in each env and starts over in every new one). `ScaleRewards` multiplies every reward
by a constant.
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


class RescaleObservations(gym.wrappers.RescaleObservation):  # type: ignore[misc]
    """gymnasium's RescaleObservation onto [low, high] in every dimension, with float32 bounds
    (given Python floats, gymnasium's own builds float64 bounds and warns in every process)."""

    def __init__(self, env: gym.Env, low: float = -1.0, high: float = 1.0) -> None:
        space = env.observation_space
        bounded = isinstance(space, gym.spaces.Box) and np.isfinite([space.low, space.high]).all()
        if not bounded:
            raise ValueError(f"RescaleObservations needs a Box with finite bounds, not {space}")
        dtype = space.dtype
        super().__init__(env, np.full(space.shape, low, dtype), np.full(space.shape, high, dtype))


class ScaleRewards(gym.RewardWrapper):  # type: ignore[misc]
    """Every reward times `scale`: a problem's returns at another scale, as a user's own rewards
    come (what `model.popart` makes no difference to; docs/models.md, "PopArt")."""

    def __init__(self, env: gym.Env, scale: float) -> None:
        super().__init__(env)
        self.scale = float(scale)

    def reward(self, reward: float) -> float:
        return float(reward) * self.scale
