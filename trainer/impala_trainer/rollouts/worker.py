"""A plain rollout worker: one vector env, one policy copy, fragments out.

No Ray here: `actors.RolloutActor` is a thin shell around it, and tests drive it directly.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from impala_api.spec import DEFAULT_POLICY, ImpalaJobSpec
from impala_trainer.batches import (
    Fragment,
    Gradients,
    concat_fragments,
    no_final_steps,
    no_state,
    policy_layout,
    policy_weights,
    split_sequences,
)
from impala_trainer.learning.acting import (
    WeightLoader,
    acting_policy,
    carried_state,
    recurrent_policy,
)
from impala_trainer.learning.distributions import action_distribution
from impala_trainer.learning.learner import Learner
from impala_trainer.learning.model_factory import build_model
from impala_trainer.learning.precision import acting_dtype
from impala_trainer.rollouts.envs import final_observations, make_vector_env

if TYPE_CHECKING:
    from impala_trainer.rollouts.multi_agent_worker import MultiAgentRolloutWorker


class RolloutWorker:
    """Steps `numEnvsPerWorker` envs for `rolloutFragmentLength` steps per `sample()` call.

    Inference is one batched forward per vector step (in numpy for MLPs, see
    `models.NumpyPolicy`). Actions come from the action distribution with noise drawn once per
    fragment (Gumbel-max for the discrete spaces), which is cheaper than a torch distribution per
    step and makes a worker's actions a pure function of its seed and weights. A recurrent
    policy's state lives here: carried across steps and fragments, zeroed where an episode ends.
    """

    def __init__(self, spec: ImpalaJobSpec, worker_id: str, seed: int) -> None:
        # Each worker owns about one core; intra-op threads would only fight the other workers.
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        self.spec = spec
        self.worker_id = worker_id
        self.num_envs = spec.env.num_envs_per_worker
        self.fragment_length = spec.training.rollout_fragment_length
        self.clip_rewards = spec.env.clips_rewards
        self.env = make_vector_env(spec.env, self.num_envs, seed)
        shape = self.env.single_observation_space.shape
        assert shape is not None
        self.obs_shape: tuple[int, ...] = tuple(shape)
        self.actions = action_distribution(
            self.env.single_action_space, spec.model.squash_actions
        )
        self.obs_dtype = self.env.single_observation_space.dtype
        self._learner: Learner | None = None
        if spec.training.mode == "async-gradients":
            # A3C: a Learner copy owns the acting model, so gradients are of the acting policy.
            self._learner = Learner(spec, self.obs_shape, self.actions)
            self.model = self._learner.model
        else:
            self.model = build_model(spec.model, self.obs_shape, self.actions)
        self.model.eval()
        self._load_weights = WeightLoader(self.model)
        self.recurrent = self.model.state_size > 0
        if self.recurrent:
            self._act_recurrent = recurrent_policy(self.model)
            self._carry = carried_state(self.model)
            self.state = self.model.initial_state(self.num_envs).numpy()
        else:
            self._policy_logits = acting_policy(self.model, acting_dtype(spec.learner.precision))
            self._carry = None
            self.state = no_state(self.num_envs)
        self.seq_len = spec.model.max_seq_len or self.fragment_length
        self.policy_id = DEFAULT_POLICY
        """The one policy every step acts by."""
        self.policy_version = 0
        self.rng = np.random.default_rng(seed)
        self.obs, _ = self.env.reset(seed=seed)
        self.episode_return = np.zeros(self.num_envs, np.float64)
        self.episode_length = np.zeros(self.num_envs, np.int64)
        self.env_steps = 0
        self._busy_seconds = 0.0  # loading weights since the last fragment

    @property
    def num_actions(self) -> int:
        """The policy's outputs per step (the number of actions for Discrete)."""
        return self.actions.num_inputs

    def set_weights(self, weights: Mapping[str, np.ndarray] | bytes, policy_version: int) -> None:
        """Load the policy's weights out of a broadcast (`batches.policy_layout`, or those
        pickled); fragments sampled from now on carry its version. `policy_version`: the
        driver's count, the same for a job of one policy."""
        start = time.perf_counter()
        # Bytes: pickled once by the driver for every actor (its own, trusted as Ray's are).
        layout = pickle.loads(weights) if isinstance(weights, bytes) else weights
        arrays, version = policy_weights(layout)[self.policy_id]
        self._load_weights(arrays)
        self.policy_version = version
        self._busy_seconds += time.perf_counter() - start

    def get_weights(self) -> dict[str, np.ndarray]:
        """This worker's current weights in the broadcast layout (tests compare them with the
        learner's)."""
        arrays = {k: v.detach().numpy().copy() for k, v in self.model.state_dict().items()}
        return policy_layout(self.policy_id, arrays, self.policy_version)

    def sample(self) -> Fragment:
        """One fragment of `[T, B]` transitions from the current policy (as `[maxSeqLen,
        T / maxSeqLen * B]` sequences when a recurrent model sets maxSeqLen), stamped with the
        seconds spent on it since the last one (`Fragment.busy_seconds`: this sampling and any
        weights loaded in between)."""
        start = time.perf_counter()
        fragment = self._sample()
        fragment.busy_seconds = self._busy_seconds + time.perf_counter() - start
        self._busy_seconds = 0.0
        return fragment

    @torch.inference_mode()
    def _sample(self) -> Fragment:
        t_len, b, dist = self.fragment_length, self.num_envs, self.actions
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
        obs, state = self.obs, self.state
        for t in range(t_len):
            obs_buf[t] = obs
            if self.recurrent:
                if t % self.seq_len == 0:
                    starts.append(state)
                logits_buf[t], state = self._act_recurrent(obs_buf[t], state)
            else:
                logits_buf[t] = self._policy_logits(obs_buf[t])
            dist.sample(logits_buf[t], noise[t], actions[t])
            obs, reward, term, trunc, infos = self.env.step(dist.to_env(actions[t]))
            # The learner sees clipped rewards; the episode return reports the env's own.
            rewards[t] = np.sign(reward) if self.clip_rewards else reward
            terminateds[t] = term
            truncateds[t] = trunc
            if self._carry is not None:
                # The previous action and reward ride in the state (zeroed below at a new
                # episode, as the learner's unroll does).
                state = self._carry(state, actions[t], rewards[t])
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
                idx = np.flatnonzero(done)
                returns.extend(self.episode_return[idx].tolist())
                lengths.extend(self.episode_length[idx].tolist())
                self.episode_return[idx] = 0.0
                self.episode_length[idx] = 0
                if self.recurrent:
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
            policy_version=self.policy_version,
            state_in=starts[0] if starts else no_state(b),
            episode_returns=returns,
            episode_lengths=lengths,
            worker_id=self.worker_id,
        )
        if len(starts) > 1:
            return split_sequences(fragment, self.seq_len, np.stack(starts))
        return fragment

    def compute_gradients(self, global_timestep: int = 0) -> Gradients:
        """A3C mode: sample one fragment on-policy and return the loss gradients on it.

        The gradients come from a Learner copy holding this worker's weights, so they are the
        exact gradients the driver's learner would compute on the same data.
        """
        if self._learner is None:
            raise RuntimeError("compute_gradients needs training.mode: async-gradients")
        fragment = self.sample()
        start = time.perf_counter()
        self._learner.global_timestep = global_timestep
        with torch.enable_grad():
            grads, stats = self._learner.compute_gradients(concat_fragments([fragment]))
        fragment.busy_seconds += time.perf_counter() - start  # the actor's time: gradients too
        own = {f"{self.policy_id}/{k}": v for k, v in stats.items()}
        return Gradients({self.policy_id: grads}, fragment.meta(), own)


def rollout_worker(
    spec: ImpalaJobSpec, worker_id: str, seed: int
) -> RolloutWorker | MultiAgentRolloutWorker:
    """The worker the job's env takes: a PettingZoo env's (spec.env.pettingzoo), else a
    gymnasium vector env's; both offer the same surface to the actors and the driver."""
    if spec.env.multi_agent:
        from impala_trainer.rollouts.multi_agent_worker import MultiAgentRolloutWorker

        return MultiAgentRolloutWorker(spec, worker_id, seed)
    return RolloutWorker(spec, worker_id, seed)
