"""The rollout worker: envs, the policies acting in them, samples out.

One worker for every env. Its `ActingPolicies` hold a copy of each policy an agent maps to (a
gymnasium env's one policy, `default`) and load the broadcasts; its sampler steps the envs: a
gymnasium vector env, where every lane acts at every step (`vector_sampler`), or PettingZoo envs
taking turns (`agent_sampler`). No Ray here: `actors.RolloutActor` is a thin shell around it,
and tests drive it directly.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from impala_api.spec import ImpalaJobSpec
from impala_trainer.batches import Gradients, Sample, concat_fragments
from impala_trainer.rollouts.acting_policies import ActingPolicies, ActingPolicy
from impala_trainer.rollouts.agent_envs import PolicyModel
from impala_trainer.rollouts.agent_sampler import AgentEnvSampler
from impala_trainer.rollouts.vector_sampler import VectorEnvSampler


class RolloutWorker:
    """Samples `rolloutFragmentLength` steps of each of `numEnvsPerWorker` envs per `sample()`
    (one fragment per trained policy), by the weights of the last broadcast."""

    def __init__(self, spec: ImpalaJobSpec, worker_id: str, seed: int) -> None:
        # Each worker owns about one core; intra-op threads would only fight the other workers.
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        self.spec = spec
        self.worker_id = worker_id
        self.sampler: VectorEnvSampler | AgentEnvSampler
        if spec.env.is_pettingzoo:
            self.sampler = AgentEnvSampler(spec, worker_id, seed)
        else:
            self.sampler = VectorEnvSampler(spec, worker_id, seed)
        self.acting = ActingPolicies(spec, self.sampler.models)
        self._busy_seconds = 0.0  # loading weights since the last sample

    @property
    def policies(self) -> dict[str, ActingPolicy]:
        """policy -> its acting copy."""
        return self.acting.policies

    @property
    def models(self) -> dict[str, PolicyModel]:
        """policy -> the spaces its model is built for."""
        return self.sampler.models

    @property
    def policy_version(self) -> int:
        """The driver's count of broadcasts at the weights loaded last."""
        return self.acting.version

    @property
    def env_steps(self) -> int:
        return self.sampler.env_steps

    def set_weights(self, weights: Mapping[str, Any] | bytes, policy_version: int) -> None:
        """Load every policy's weights out of a broadcast (`batches.policy_layout`, or those
        pickled); samples from now on carry their versions."""
        start = time.perf_counter()
        # Bytes: pickled once by the driver for every actor (its own, trusted as Ray's are).
        layout = pickle.loads(weights) if isinstance(weights, bytes) else weights
        self.acting.load(layout, policy_version)
        self._busy_seconds += time.perf_counter() - start

    def get_weights(self) -> dict[str, np.ndarray]:
        """This worker's current weights in the broadcast layout (tests compare them with the
        learner's)."""
        return self.acting.layout()

    def sample(self) -> Sample:
        """One sample, stamped with the seconds spent on it since the last one
        (`busy_seconds`: this sampling and any weights loaded in between)."""
        start = time.perf_counter()
        with torch.inference_mode():
            sample = self.sampler.sample(self.acting)
        sample.busy_seconds = self._busy_seconds + time.perf_counter() - start
        self._busy_seconds = 0.0
        return sample

    def compute_gradients(self, global_timestep: int = 0) -> Gradients:
        """A3C mode: one sample on-policy, and each trained policy's loss gradients on its own
        fragment of it: those of a Learner copy holding this worker's weights, so the exact
        gradients the driver's learner would compute on the same data."""
        learners = self.acting.learners
        if not learners:
            raise RuntimeError("compute_gradients needs training.mode: async-gradients")
        sample = self.sample()
        start = time.perf_counter()
        grads: dict[str, list[np.ndarray]] = {}
        stats: dict[str, float] = {}
        for fragment in sample.parts():
            learner = learners[fragment.policy_id]
            learner.global_timestep = global_timestep
            with torch.enable_grad():
                grads[fragment.policy_id], own = learner.compute_gradients(
                    concat_fragments([fragment])
                )
            stats.update({f"{fragment.policy_id}/{k}": v for k, v in own.items()})
        sample.busy_seconds += time.perf_counter() - start  # the actor's time: gradients too
        return Gradients(grads, sample.meta(), stats)
