"""A trained policy played outside training: greedy (the distribution's mode) or sampled
actions, numpy in and out, a recurrent policy's state carried per env and zeroed where an
episode ends, as the rollout worker does. No fragments, no noise buffers: evaluation is not the
hot path."""

from __future__ import annotations

import numpy as np

from impala_trainer.learning.distributions import ActionDistribution
from impala_trainer.learning.inference import acting_policy, carried_state, recurrent_policy
from impala_trainer.learning.models import ActorCritic


class Player:
    """Actions for `num_envs` envs at a time from `model`."""

    def __init__(
        self,
        model: ActorCritic,
        actions: ActionDistribution,
        num_envs: int,
        explore: bool = False,
        seed: int = 0,
        clip_rewards: bool = False,
    ) -> None:
        self.model = model
        self.dist = actions
        self.explore = explore
        self.clip_rewards = clip_rewards
        self.rng = np.random.default_rng(seed)
        self.recurrent = model.state_size > 0
        self._carry = carried_state(model)
        self._act_recurrent = recurrent_policy(model) if self.recurrent else None
        self._act = None if self.recurrent else acting_policy(model)
        self.state = model.initial_state(num_envs).numpy()

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Actions [B, *action_shape] (as the learner stores them) for observations [B, ...]."""
        if self._act_recurrent is not None:
            outputs, self.state = self._act_recurrent(obs, self.state)
        else:
            assert self._act is not None
            outputs = self._act(obs)
        if not self.explore:
            return np.asarray(self.dist.greedy(outputs), self.dist.action_dtype)
        out: np.ndarray = self.dist.empty_actions(1, len(obs))[0]
        self.dist.sample(outputs, self.dist.noise(self.rng, 1, len(obs))[0], out)
        return out

    def observe(self, actions: np.ndarray, rewards: np.ndarray, done: np.ndarray) -> None:
        """After the env step: the previous action and reward into the state (for models that
        take them, with the rewards the learner saw), and a fresh state where episodes ended."""
        if not self.recurrent:
            return
        if self._carry is not None:
            seen = np.sign(rewards) if self.clip_rewards else rewards
            self.state = self._carry(self.state, actions, seen.astype(np.float32))
        self.state = np.where(done[:, None], np.float32(0.0), self.state)
