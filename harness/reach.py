"""A continuous-control problem as a new user brings one: a point reaching a target in the plane
(`env.id: "harness.reach:PointReach-v0"`, registered when this module is imported).

Observation Box(4): the point's position and the target's. Action Box(2) in [-1, 1]: the step,
0.1 per unit (the env clips what it is given to the space, as gymnasium's continuous envs do).
Reward: minus the L1 distance to the target after the step. Each episode starts at the origin
with a target drawn uniformly in [-1, 1]^2 and is truncated after 50 steps: nothing terminates,
so every value target at the cut is a bootstrap.

Acting at random scores about -54; the best policy (full steps towards the target, then exactly
the rest) about -2.9. The point is not confined: a policy whose actions saturate at one bound walks
away from every target, and scores far below random.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

STEP = 0.1
"""Distance moved per unit of action, per axis."""
HORIZON = 50
"""Steps per episode (a time limit: truncated, never terminated)."""
RANDOM_RETURN = -54.0
"""About what a uniform policy scores (2,000 episodes: -53.8)."""
BEST_RETURN = -2.85
"""About what the best policy (`best_action`) scores (2,000 episodes: -2.85)."""


class PointReach(gym.Env):  # type: ignore[misc]
    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self._pos = np.zeros(2, np.float32)
        self._target = np.zeros(2, np.float32)

    def _obs(self) -> np.ndarray:
        return np.concatenate([self._pos, self._target])

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._pos = np.zeros(2, np.float32)
        self._target = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        step = np.clip(np.asarray(action, np.float32), -1.0, 1.0) * STEP
        self._pos = (self._pos + step).astype(np.float32)
        reward = -float(np.abs(self._pos - self._target).sum())
        return self._obs(), reward, False, False, {}


class UnboundedPointReach(PointReach):
    """The same task with actions declared unbounded (the env still clips them): a Box a
    squashed Gaussian cannot fit."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)


def best_action(obs: np.ndarray) -> np.ndarray:
    """The best policy's action: the rest of the way to the target, at most a full step."""
    return np.clip((obs[..., 2:] - obs[..., :2]) / STEP, -1.0, 1.0).astype(np.float32)


gym.register("PointReach-v0", entry_point=PointReach, max_episode_steps=HORIZON)
gym.register("UnboundedPointReach-v0", entry_point=UnboundedPointReach, max_episode_steps=HORIZON)
