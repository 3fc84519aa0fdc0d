"""A gymnasium env of random observations, so RLlib builds the learner for arbitrary shapes.

Learner-only runs need RLlib to construct its RLModule and learner connector for CartPole-shaped
and Atari-shaped ([84, 84, 4] uint8) inputs without paying for a real emulator.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class SyntheticEnv(gym.Env):
    """Random observations of a fixed shape/dtype, random rewards, episodes of 100 steps."""

    def __init__(self, shape: tuple[int, ...], dtype: str, num_actions: int) -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype == np.uint8:
            self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        else:
            self.observation_space = gym.spaces.Box(-1.0, 1.0, shape, self.dtype)
        self.action_space = gym.spaces.Discrete(num_actions)
        self._rng = np.random.default_rng(0)
        self._t = 0
        # A few pre-drawn observations, cycled: drawing 28 KB of random bytes per step would
        # dominate the (untimed) episode collection for Atari shapes.
        self._pool = [self.observation_space.sample() for _ in range(8)]

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        return self._pool[0], {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._t += 1
        obs = self._pool[self._t % len(self._pool)]
        return obs, float(self._rng.normal()), False, self._t >= 100, {}
