"""`training.mode: async-gradients`: A3C-style training (RLlib AsyncGradientsOptimizer, seeds/003).

Each rollout actor samples one fragment with its current weights and returns the loss gradients
on it; the driver applies them to its learner as they arrive and sends that actor the fresh
weights with its next request. One request per actor is in flight (gradients computed on stale
weights are the price of A3C's asynchrony; fewer in flight keeps them fresh). The weights are
put in the object store once per update and shared by every request made before the next one.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from impala_trainer.driver.actor_manager import ManagedActor
from impala_trainer.driver.base import WAIT_SECONDS, Driver
from impala_trainer.learning.learner import Learner
from impala_trainer.learning.learner_thread import LearnerStarvedError, starved_message


class AsyncGradientsDriver(Driver):
    """The driver applies worker gradients; no learner thread."""

    def _start(self) -> None:
        self.learner = Learner(self.spec, self.obs_shape, self.num_actions)
        self.grad_refs: dict[Any, str] = {}  # gradients ref -> actor id
        self._weights: tuple[Any, int] | None = None  # (object ref, version) of current weights
        self._last_update = time.monotonic()
        self._apply_ms = 0.0
        self._wait_ms = 0.0

    def _begin(self) -> None:
        self._last_update = time.monotonic()

    def _current_weights(self) -> tuple[Any, int]:
        version = self.learner.policy_version
        if self._weights is None or self._weights[1] != version:
            self._weights = (ray.put(self.learner.get_weights()), version)
            self.stats.counters.weight_broadcasts += 1
        return self._weights

    def _dispatch(self, actor: ManagedActor) -> None:
        if actor.state == "draining":  # its node is leaving: no new request
            return
        ref, version = self._current_weights()
        grads = actor.handle.compute_gradients.remote(
            ref, version, self.stats.counters.env_steps_sampled
        )
        self.grad_refs[grads] = actor.actor_id

    def _on_new_actor(self, actor: ManagedActor) -> None:
        if actor.role == "rollout":
            self._dispatch(actor)

    def _in_flight(self, actor_id: str) -> int:
        return sum(1 for a in self.grad_refs.values() if a == actor_id)

    def _forget(self, actor_id: str) -> None:
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
        ready, _ = ray.wait(list(self.grad_refs), num_returns=1, timeout=WAIT_SECONDS)
        self._wait_ms = 1000.0 * (time.perf_counter() - start)
        for ref in ready:
            actor_id = self.grad_refs.pop(ref)
            try:
                grads, info = ray.get(ref)
            except ray.exceptions.RayError as err:
                self._actor_failed(actor_id, err)
                continue
            self._apply(actor_id, grads, info)

    def _apply(self, actor_id: str, grads: list[Any], info: dict[str, Any]) -> None:
        start = time.perf_counter()
        self.learner.global_timestep = self.stats.counters.env_steps_sampled
        self.learner.apply_gradients(grads)
        self._apply_ms = 1000.0 * (time.perf_counter() - start)
        self._last_update = time.monotonic()
        c = self.stats.counters
        c.env_steps_sampled += info["env_steps"]
        c.env_steps_trained += info["env_steps"]
        c.learner_updates += 1
        c.policy_version = self.learner.policy_version
        self.stats.add_episodes(info["episode_returns"], info["episode_lengths"])
        self.stats.add_policy_lag(float(c.policy_version - 1 - info["policy_version"]))
        self.stats.learner = {k: float(v) for k, v in info["stats"].items()}
        actor = self.manager.actors.get(actor_id)
        if actor is not None:
            actor.env_steps += info["env_steps"]
            self._dispatch(actor)

    def _update_learner_stats(self) -> None:
        if getattr(self, "learner", None) is None:  # failed before the learner was built
            return
        self.stats.timing = {
            "driver_apply_time_ms": round(self._apply_ms, 3),
            "driver_wait_time_ms": round(self._wait_ms, 3),
        }
