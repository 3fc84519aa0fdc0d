"""A user's environment as a new user brings one: a module that registers `Corridor-v0` when
imported (`env.id: "tests.support.corridor:Corridor-v0"`), and a wrapper of their own.

The agent starts at cell 0 of a corridor and earns 1 for reaching its far end; each step costs
0.01, so the best return is 1 - 0.01 * (length - 1) and a uniform policy scores far below it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):  # type: ignore[misc]
    def __init__(self, length: int = 6) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = gym.spaces.Discrete(2)  # 0: back, 1: forward
        self.position = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.length, np.float32)
        obs[self.position] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.position = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.position = max(0, self.position + (1 if action == 1 else -1))
        done = self.position == self.length - 1
        return self._obs(), (1.0 if done else 0.0) - 0.01, done, False, {}


class RewardScale(gym.RewardWrapper):  # type: ignore[misc]
    """The user's wrapper: every reward times `scale`."""

    def __init__(self, env: gym.Env, scale: float = 1.0) -> None:
        super().__init__(env)
        self.scale = scale

    def reward(self, reward: float) -> float:
        return reward * self.scale


class DictCorridor(Corridor):
    """The same corridor observed as a Dict: the cell index (Discrete) and the distance left."""

    def __init__(self, length: int = 6) -> None:
        super().__init__(length)
        self.observation_space = gym.spaces.Dict(
            {
                "cell": gym.spaces.Discrete(length),
                "left": gym.spaces.Box(0.0, 1.0, (1,), np.float32),
            }
        )

    def _obs(self) -> dict[str, Any]:  # type: ignore[override]
        left = (self.length - 1 - self.position) / (self.length - 1)
        return {"cell": self.position, "left": np.array([left], np.float32)}


class SlidingCorridor(Corridor):
    """A corridor with a continuous push (a Box action): forward when the push is positive."""

    def __init__(self, length: int = 6) -> None:
        super().__init__(length)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert self.action_space.contains(action), action  # clipped to the space by the worker
        return super().step(1 if float(action[0]) > 0.0 else 0)


class TupleCorridor(Corridor):
    """Actions as a Tuple: a space the trainer refuses (flatten it in a wrapper)."""

    def __init__(self, length: int = 6) -> None:
        super().__init__(length)
        self.action_space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(2)))


class ShiftActions(gym.ActionWrapper):  # type: ignore[misc]
    """Actions numbered from 1: a Discrete space the trainer refuses (it samples from 0)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.action_space = gym.spaces.Discrete(2, start=1)

    def action(self, action: int) -> int:
        return action - 1


NotAWrapper = 42

gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=50)
gym.register("DictCorridor-v0", entry_point=DictCorridor, max_episode_steps=50)
gym.register("SlidingCorridor-v0", entry_point=SlidingCorridor, max_episode_steps=50)
gym.register("TupleCorridor-v0", entry_point=TupleCorridor, max_episode_steps=50)
