"""`training.mode: async-gradients`: A3C-style training (RLlib AsyncGradientsOptimizer, seeds/003).

Each rollout actor samples one fragment with its current weights and returns the loss gradients
on it, one set per trained policy (a gymnasium env's one, `default`; a PettingZoo env's each on
its own agents' columns); the driver applies each set to its policy's learner as they arrive and
sends that actor the fresh weights with its next request. One request per actor is in flight
(gradients computed on stale weights are the price of A3C's asynchrony; fewer in flight keeps
them fresh). The weights are put in the object store once per update and shared by every
request made before the next one.
"""

from __future__ import annotations

import time
from typing import Any

from impala_api.spec import ImpalaJob
from impala_trainer.backend import Ref, Weights
from impala_trainer.batches import Gradients
from impala_trainer.driver.actor_manager import ManagedActor
from impala_trainer.driver.base import WAIT_SECONDS, Driver
from impala_trainer.learners.learner_thread import LearnerStarvedError, starved_message
from impala_trainer.learners.policies import (
    NOTHING_TO_TRAIN,
    LearnerState,
    PolicySetState,
    self_play_pool,
)
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.rundir.writer import RunDir


class AsyncGradientsDriver(Driver):
    """The driver applies worker gradients; no learner thread."""

    learner: LearnerState
    learners: dict[str, Learner]
    """Each trained policy's learner, which its gradients step."""

    def __init__(self, job: ImpalaJob, run_dir: RunDir, **collaborators: Any) -> None:
        super().__init__(job, run_dir, **collaborators)
        # Every policy's weights go out (a gymnasium env's one); the trained ones learn.
        every = {
            name: Learner(LearnerConfig.of(self.spec, name), model.obs_shape, model.actions)
            for name, model in self.models.items()
        }
        trained = set(self.spec.agents.trained)
        self.learners = {name: ls for name, ls in every.items() if name in trained}
        if not self.learners:
            raise ValueError(NOTHING_TO_TRAIN)
        self.learner = PolicySetState(dict(every), self_play_pool(self.spec))
        self.grad_refs: dict[Ref, str] = {}  # gradients ref -> actor id
        self._weights: tuple[Weights, int] | None = None  # (ref, version) of current weights
        self._last_update = time.monotonic()
        self._apply_ms = 0.0
        self._wait_ms = 0.0

    def _begin(self) -> None:
        self._last_update = time.monotonic()

    def _current_weights(self) -> tuple[Weights, int]:
        version = self.learner.policy_version
        if self._weights is None or self._weights[1] != version:
            self._weights = (self.backend.put(self.learner.get_weights()), version)
            self.stats.counters.num_weight_broadcasts += 1
        return self._weights

    def _dispatch(self, actor: ManagedActor) -> None:
        if actor.state == "draining":  # its node is leaving: no new request
            return
        ref, version = self._current_weights()
        grads = self.backend.compute_gradients(
            actor.handle, ref, version, self.stats.counters.num_env_steps_trained
        )
        self.grad_refs[grads] = actor.actor_id

    def on_new_actor(self, actor: ManagedActor) -> None:
        if actor.role == "rollout":
            self._dispatch(actor)

    def in_flight(self, actor_id: str) -> int:
        return sum(1 for a in self.grad_refs.values() if a == actor_id)

    def forget(self, actor_id: str) -> None:
        for ref in [r for r, a in self.grad_refs.items() if a == actor_id]:
            del self.grad_refs[ref]

    def _step(self) -> None:
        timeout = self.spec.training.learner_queue_timeout
        if time.monotonic() - self._last_update > timeout:
            raise LearnerStarvedError(starved_message(timeout))
        if not self.grad_refs:
            time.sleep(WAIT_SECONDS)
            return
        start = time.perf_counter()
        ready, _ = self.backend.wait(list(self.grad_refs), num_returns=1, timeout=WAIT_SECONDS)
        self._wait_ms = 1000.0 * (time.perf_counter() - start)
        for ref in ready:
            actor_id = self.grad_refs.pop(ref)
            try:
                gradients: Gradients = self.backend.get(ref)
            except self.backend.failure as err:
                self._actor_failed(actor_id, err)
                continue
            self._apply(actor_id, gradients)

    def _apply(self, actor_id: str, gradients: Gradients) -> None:
        start = time.perf_counter()
        self.learner.global_timestep = self.stats.counters.num_env_steps_trained
        for policy, grads in gradients.grads.items():
            self.learners[policy].apply_gradients(grads)
        self._apply_ms = 1000.0 * (time.perf_counter() - start)
        self._last_update = time.monotonic()
        meta, c = gradients.meta, self.stats.counters
        self._count_sample(meta)
        c.num_env_steps_trained += meta.env_steps
        c.learner_updates += 1
        c.policy_version = self.learner.policy_version
        # The updates since the weights it sampled with (each steps every trained policy once,
        # and the version is the sum of the policies').
        lag = (c.policy_version - meta.policy_version) / len(gradients.grads) - 1
        self.stats.add_policy_lag(float(lag))
        self.stats.add_learner_stats({k: float(v) for k, v in gradients.stats.items()})
        actor = self.manager.actors.get(actor_id)
        if actor is not None:
            actor.env_steps += meta.env_steps
            self._dispatch(actor)

    def _update_learner_stats(self) -> None:
        self.stats.timing_breakdown = {
            "driver_apply_time_ms": round(self._apply_ms, 3),
            "driver_wait_time_ms": round(self._wait_ms, 3),
        }
