"""A gymnasium vector env's fragments: the case where every lane acts at every step.

Each of the `numEnvsPerWorker` envs is one lane of the job's one policy (`default`), and all of
them act at each step, so a fragment is written straight into its `[T, B]` arrays with one
batched forward per vector step: no per-step objects, numpy inference for MLPs. Actions come from
the action distribution with noise drawn once per fragment (Gumbel-max for the discrete spaces),
cheaper than a torch distribution per step, and a worker's actions are a pure function of its
seed and weights. A recurrent policy's state is carried across steps and fragments and zeroed
where an episode ends.
"""

from __future__ import annotations

import numpy as np

from impala_api.spec import DEFAULT_POLICY, ImpalaJobSpec
from impala_trainer.batches import Fragment, no_final_steps, no_state, split_sequences
from impala_trainer.learning.distributions import action_distribution
from impala_trainer.rollouts.acting_policies import ActingPolicies
from impala_trainer.rollouts.agent_envs import PolicyModel
from impala_trainer.rollouts.envs import final_observations, make_vector_env


class VectorEnvSampler:
    """Steps `numEnvsPerWorker` envs for `rolloutFragmentLength` steps per `sample`."""

    def __init__(self, spec: ImpalaJobSpec, worker_id: str, seed: int) -> None:
        self.worker_id = worker_id
        self.num_envs = spec.env.num_envs_per_worker
        self.fragment_length = spec.training.rollout_fragment_length
        self.clip_rewards = spec.env.clips_rewards
        self.env = make_vector_env(spec.env, self.num_envs, seed)
        space = self.env.single_observation_space
        assert space.shape is not None
        self.obs_shape: tuple[int, ...] = tuple(space.shape)
        self.obs_dtype = space.dtype
        actions = action_distribution(self.env.single_action_space, spec.model.squash_actions)
        self.models = {DEFAULT_POLICY: PolicyModel([], self.obs_shape, space.dtype, actions)}
        """The one policy's model spaces (what `ActingPolicies` builds it for)."""
        self.seq_len = spec.model.max_seq_len or self.fragment_length
        self.rng = np.random.default_rng(seed)
        self.obs, _ = self.env.reset(seed=seed)
        self.state: np.ndarray | None = None
        """A recurrent policy's state per env (zeros until the first step), else `no_state`."""
        self.episode_return = np.zeros(self.num_envs, np.float64)
        self.episode_length = np.zeros(self.num_envs, np.int64)
        self.env_steps = 0

    def sample(self, acting: ActingPolicies) -> Fragment:
        """One fragment of `[T, B]` transitions (as `[maxSeqLen, T / maxSeqLen * B]` sequences
        when a recurrent model sets maxSeqLen)."""
        policy = acting.policies[DEFAULT_POLICY]
        t_len, b, dist = self.fragment_length, self.num_envs, policy.actions
        recurrent = policy.recurrent
        if self.state is None:
            self.state = policy.model.initial_state(b).numpy() if recurrent else no_state(b)
        obs_buf = np.empty((t_len, b, *self.obs_shape), self.obs_dtype)
        actions = dist.empty_actions(t_len, b)
        logits_buf = np.empty((t_len, b, dist.num_inputs), np.float32)
        rewards = np.empty((t_len, b), np.float32)
        terminateds = np.empty((t_len, b), np.bool_)
        truncateds = np.empty((t_len, b), np.bool_)
        noise = dist.noise(self.rng, t_len, b)
        starts: list[np.ndarray] = []
        final_steps: list[np.ndarray] = []
        final_obs: list[np.ndarray] = []
        returns: list[float] = []
        lengths: list[int] = []
        obs, state, logits, carry = self.obs, self.state, policy.logits, policy.carry
        for t in range(t_len):
            obs_buf[t] = obs
            if recurrent:
                if t % self.seq_len == 0:
                    starts.append(state)
                logits_buf[t], state = logits(obs_buf[t], state)
            else:
                logits_buf[t] = logits(obs_buf[t])
            dist.sample(logits_buf[t], noise[t], actions[t])
            obs, reward, term, trunc, infos = self.env.step(dist.to_env(actions[t]))
            # The learner sees clipped rewards; the episode return reports the env's own.
            rewards[t] = np.sign(reward) if self.clip_rewards else reward
            terminateds[t] = term
            truncateds[t] = trunc
            if carry is not None:
                # The previous action and reward ride in the state (zeroed below at a new
                # episode, as the learner's unroll does).
                state = carry(state, actions[t], rewards[t])
            self.episode_return += reward
            self.episode_length += 1
            done = term | trunc
            if done.any():
                if trunc.any():
                    # Only truncated-but-not-terminated steps bootstrap from the final state.
                    cut = trunc & ~term
                    if cut.any():
                        cols = np.flatnonzero(cut)
                        final_steps.append(np.stack([np.full_like(cols, t), cols], axis=1))
                        final_obs.append(final_observations(infos, cut))
                self._episodes_ended(done, returns, lengths)
                if recurrent:
                    state = np.where(done[:, None], np.float32(0.0), state)  # a new episode
        self.obs, self.state = obs, state
        self.env_steps += t_len * b
        if final_obs:
            cut_obs, cut_steps = np.concatenate(final_obs), np.concatenate(final_steps)
        else:
            cut_obs, cut_steps = no_final_steps(self.obs_shape, self.obs_dtype)
        fragment = Fragment(
            obs=obs_buf,
            actions=actions,
            behaviour_logits=logits_buf,
            rewards=rewards,
            terminateds=terminateds,
            truncateds=truncateds,
            final_obs=cut_obs,
            final_steps=cut_steps.astype(np.int64, copy=False),
            bootstrap_obs=np.array(obs, copy=True),
            policy_version=policy.version,
            state_in=starts[0] if starts else no_state(b),
            episode_returns=returns,
            episode_lengths=lengths,
            worker_id=self.worker_id,
        )
        if len(starts) > 1:
            return split_sequences(fragment, self.seq_len, np.stack(starts))
        return fragment

    def _episodes_ended(self, done: np.ndarray, returns: list[float], lengths: list[int]) -> None:
        """The returns and lengths of the episodes that ended at this step, and new ones."""
        idx = np.flatnonzero(done)
        returns.extend(self.episode_return[idx].tolist())
        lengths.extend(self.episode_length[idx].tolist())
        self.episode_return[idx] = 0.0
        self.episode_length[idx] = 0
