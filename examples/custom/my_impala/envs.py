"""TwinCorridor: two walkers, one MultiDiscrete action (a step per walker).

Both start at cell 0 of their corridor; the episode pays 1 once both stand at the far end, and
each step costs 0.01, so the best return is 1 - 0.01 * (length - 1), 0.94 for the default 7
cells. A uniform policy averages about -0.23: it rarely gets both there within the time limit.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class TwinCorridor(gym.Env):  # type: ignore[misc]
    def __init__(self, length: int = 7) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2 * length,), np.float32)
        self.action_space = gym.spaces.MultiDiscrete([2, 2])  # per walker: 0 back, 1 forward
        self.positions = [0, 0]

    def _obs(self) -> np.ndarray:
        obs = np.zeros(2 * self.length, np.float32)
        obs[self.positions[0]] = obs[self.length + self.positions[1]] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.positions = [0, 0]
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        end = self.length - 1
        self.positions = [
            min(end, max(0, p + (1 if a == 1 else -1)))
            for p, a in zip(self.positions, action, strict=True)
        ]
        done = self.positions == [end, end]
        return self._obs(), (1.0 if done else 0.0) - 0.01, done, False, {}


gym.register("TwinCorridor-v0", entry_point=TwinCorridor, max_episode_steps=50)
