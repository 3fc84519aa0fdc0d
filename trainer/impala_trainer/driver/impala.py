"""The IMPALA driver loop (RLlib's IMPALA training step, seeds/002).

Each iteration: take the learner's results (counters, stats) and broadcast weights every
`broadcastInterval` updates if a rollout actor sent samples since the last broadcast (inline
when small, else one `Backend.put`); move finished train batches into the learner thread's bounded
inqueue; wait up to WAIT_SECONDS for sample (or aggregator) results and route them: fragment ->
aggregator (an actor, by reference, or the local Aggregator) -> train batches. Each rollout actor
keeps `maxRequestsInFlightPerWorker` sample requests outstanding, and the newest broadcast rides
on the next sample request of an actor that has not got it yet: one request per fragment, not
two (a Ray call, or for small weights and fragments a message on a direct connection,
`rollouts.transport`).

Backpressure instead of dropping: a batch that finds the learner queue full is counted
(`num_times_learner_queue_full`) and kept; while one waits, returning actors are parked instead of
asked for more (an actor whose fragment went to an aggregator actor is asked again when its
batches are back), and the loop blocks on the queue itself, so the learner is never starved by
the loop and data never piles up without bound.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import numpy as np
import torch

from impala_api.spec import ImpalaJob, ImpalaJobSpec
from impala_trainer.backend import Ref, Weights
from impala_trainer.batches import Fragment, FragmentMeta, TrainBatch
from impala_trainer.driver.actor_manager import ManagedActor
from impala_trainer.driver.base import WAIT_SECONDS, Driver
from impala_trainer.driver.ledger import Ledger
from impala_trainer.learners.group import LearnerGroup, make_learner_group
from impala_trainer.learners.policies import LearnerState
from impala_trainer.rollouts.aggregation import Aggregator
from impala_trainer.rundir.writer import RunDir

# Below Ray's max_direct_call_object_size (100 KiB), with room for the pickled dict around them.
INLINE_WEIGHTS_BYTES = 64 * 1024
# Fragments up to this go over a direct connection (spec.rollouts.transport auto), where Ray's
# ~0.85 ms per call is what a small fragment costs; a socket copies every byte (twice with the
# pickle), while Ray hands the driver a local fragment from shared memory without a copy (a Pong
# fragment: 7 MB of frames).
DIRECT_FRAGMENT_BYTES = 1024 * 1024

logger = logging.getLogger(__name__)


def direct_samples(
    spec: ImpalaJobSpec,
    obs_shape: tuple[int, ...],
    obs_dtype: np.dtype,
    weights_nbytes: int,
    columns_per_env: int = 1,
) -> bool:
    """Whether whole samples go over direct connections (`spec.rollouts.transport` auto): the
    weights ride inline and a fragment's observations (its bootstrap ones too) are small.
    `columns_per_env`: a multi-agent sample's columns per env (its trained agents)."""
    if spec.rollouts.transport == "ray":
        return False
    t, env = spec.training, spec.env
    steps = (t.rollout_fragment_length + 1) * env.num_envs_per_worker * columns_per_env
    fragment_bytes = steps * int(np.prod(obs_shape)) * obs_dtype.itemsize
    return weights_nbytes <= INLINE_WEIGHTS_BYTES and fragment_bytes <= DIRECT_FRAGMENT_BYTES


class ImpalaDriver(Driver):
    """V-trace mode: asynchronous sampling feeding a learner thread."""

    def __init__(self, job: ImpalaJob, run_dir: RunDir, **collaborators: Any) -> None:
        super().__init__(job, run_dir, **collaborators)
        threads = torch.get_num_threads()
        self.group: LearnerGroup = make_learner_group(
            self.spec, self.models, self.seed, self.backend, threads
        )
        self.learner: LearnerState = self.group.learner
        replicas, process = self.spec.learner.replicas, self.spec.learner.process
        logger.info(
            "learner on %s, %s (learner.precision %s), %s",
            self.group.device,
            "bfloat16 autocast" if self.group.autocast_dtype is not None else "float32",
            self.spec.learner.precision,
            f"{replicas} learners in lock step" if replicas > 1
            else "in a process of its own" if process == "separate" else "in the driver",
        )  # fmt: skip
        self.local_aggregator = Aggregator.from_spec(self.spec, self.seed)
        self.ledger = Ledger(self.spec.training.max_requests_in_flight_per_worker)
        # The broadcast is skipped while no actor has sampled since the last one (as RLlib).
        self.sampled_since_broadcast = False
        self._head_counted_full = False
        self.updates_since_broadcast = 0
        self._timers: dict[str, deque[float]] = {}
        self.weights_ref: Weights | None = None  # the latest broadcast: pickled, or a ref
        self._weights_nbytes = self.learner.weights_nbytes()
        self.weights_version = -1
        trained = set(self.spec.agents.trained)
        self.direct_samples = direct_samples(
            self.spec, self.obs_shape, self.obs_dtype, self._weights_nbytes,
            sum(len(m.agents) for name, m in self.models.items() if name in trained) or 1,
        )  # fmt: skip
        """Whole samples (no aggregator actor) over connections of their own, not Ray calls."""

    def _begin(self) -> None:
        self.group.start()

    # -- one iteration --------------------------------------------------------------------------

    def _step(self) -> None:
        self.group.check()
        self._drain_learner()
        self._feed_learner()
        # Parked actors go back to work the moment the learner queue takes the waiting batch,
        # before this loop blocks on anything: an actor left parked over a blocking wait idles
        # for the whole wait.
        self._unpark()
        if self.ledger.backlog:
            self._wait_on_learner()
            self._unpark()
        else:
            self._collect()

    def _unpark(self) -> None:
        for actor_id in self.ledger.unpark():
            actor = self.manager.actors.get(actor_id)
            if actor is not None:
                self._submit(actor)

    def _drain_learner(self) -> None:
        self.updates_since_broadcast += self._drain_learner_counts()
        if (
            self.updates_since_broadcast >= self.spec.training.broadcast_interval
            and self.sampled_since_broadcast
        ):
            self._broadcast()

    def _broadcast(self) -> None:
        # The weights go out with each actor's next sample request (`_submit`), which is when a
        # separate set_weights call would have run on the actor anyway: after the sample it is
        # busy with. Measured on CartPole, the separate call cost the actor ~1 ms of CPU per
        # fragment in Ray's task path, for ~0.13 ms of load_state_dict.
        start = time.perf_counter()
        self._put_weights()
        self.sampled_since_broadcast = False
        self.updates_since_broadcast = 0
        self.stats.counters.num_weight_broadcasts += 1
        self._time("broadcast", start)

    def _feed_learner(self) -> None:
        backlog = self.ledger.backlog
        while backlog:
            if not self.group.try_put(backlog[0]):
                if not self._head_counted_full:  # once per batch, however long it waits
                    self._head_counted_full = True
                    self.stats.counters.num_times_learner_queue_full += 1
                return
            self._enqueued(backlog.popleft())

    def _enqueued(self, batch: TrainBatch) -> None:
        self._head_counted_full = False
        if batch.replayed:
            self.stats.counters.replayed_batches += 1

    def _wait_on_learner(self) -> None:
        # The learner is the bottleneck: block on its queue, not on the actors.
        start = time.perf_counter()
        if not self.group.put(self.ledger.backlog[0], WAIT_SECONDS):
            self._time("learner_wait", start)
            return
        self._enqueued(self.ledger.backlog.popleft())
        self._time("learner_wait", start)

    def _collect(self) -> None:
        refs = self.ledger.waiting_on()
        if not refs:
            time.sleep(WAIT_SECONDS)  # every actor is still starting (or being replaced)
            return
        start = time.perf_counter()
        ready, rest = self.backend.wait(refs, num_returns=1, timeout=WAIT_SECONDS)
        if ready and rest:
            more, _ = self.backend.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        self._time("sample_wait", start)
        for ref in ready:
            if self.ledger.is_sample(ref):
                self._on_sample(ref)
            elif self.ledger.is_aggregation(ref):
                self._on_aggregated(ref)

    def _on_sample(self, meta_ref: Ref) -> None:
        request = self.ledger.sample_back(meta_ref)
        actor_id, fragment_ref = request.actor_id, request.fragment
        # A whole sample stays here even if an aggregator actor started since it was asked for.
        aggregator = None if fragment_ref is None else self.manager.next_aggregator()
        meta: FragmentMeta
        fragment: Fragment | None = None
        try:
            if fragment_ref is None:  # one object holds both
                fragment, meta = self.backend.get(meta_ref)
            elif aggregator is None:  # both values here: one get call, not two
                meta, fragment = self.backend.get_many([meta_ref, fragment_ref])
            else:  # the fragment goes to the aggregator by reference, unread
                meta = self.backend.get(meta_ref)
        except self.backend.failure as err:
            self._actor_failed(actor_id, err)
            return
        self._count_sample(meta)
        actor = self.manager.actors.get(actor_id)
        if actor is not None:
            actor.env_steps += meta.env_steps
            self.sampled_since_broadcast = True
        if aggregator is not None:
            assert fragment_ref is not None
            ref = self.backend.aggregate(aggregator.handle, fragment_ref)
            # The actor is asked again when its fragment's batches are back (`_on_aggregated`),
            # not now: asked at once, each actor would keep a fragment more in flight, which
            # raises the policy lag of CartPole's example from ~3 to ~5 updates (median steps to
            # 450 ~2x).
            self.ledger.sent_to_aggregator(ref, aggregator.actor_id, source=actor_id)
            return
        assert fragment is not None
        self.ledger.backlog.extend(self.local_aggregator.add(fragment))
        self._feed_learner()  # room in the learner queue: the actor need not park
        self._ask_again(actor_id)

    def _ask_again(self, actor_id: str) -> None:
        """Another sample request for an actor whose fragment is in, or park it while a batch
        waits for room in the learner queue."""
        actor = self.manager.actors.get(actor_id)
        if actor is not None and self.ledger.ask_again(actor_id):
            self._submit(actor)

    def _on_aggregated(self, ref: Ref) -> None:
        aggregation = self.ledger.aggregation_back(ref)
        aggregator_id, source = aggregation.aggregator_id, aggregation.source
        try:
            batches: list[TrainBatch] = self.backend.get(ref)
        except self.backend.failure as err:
            self.ledger.park(source)  # its fragment is lost with the aggregator: sample anew
            self._actor_failed(aggregator_id, err)
            return
        self.ledger.backlog.extend(batches)
        aggregator = self.manager.actors.get(aggregator_id)
        if aggregator is not None:  # membership shows what each aggregator passed on
            aggregator.env_steps += sum(b.env_steps for b in batches if not b.replayed)
        self._feed_learner()
        self._ask_again(source)

    # -- actors ---------------------------------------------------------------------------------

    def _submit(self, actor: ManagedActor) -> None:
        if actor.state == "draining":  # its node is leaving: collect what it owes, ask no more
            return
        # Two returns only where an aggregator actor may take the fragment by reference.
        split = bool(self.manager.live("aggregator"))
        for _ in range(self.ledger.room(actor.actor_id)):
            due = self.ledger.weights_due(actor.actor_id, self.weights_version)
            weights = self.weights_ref if due else None
            fragment_ref: Ref | None = None
            if split:
                fragment_ref, ref = self.backend.sample(actor.handle, weights, self.weights_version)
            else:
                ref = self.backend.sample_whole(
                    actor.handle, weights, self.weights_version, direct=self.direct_samples
                )
            self.ledger.sent_sample(actor.actor_id, ref, fragment_ref)

    def on_new_actor(self, actor: ManagedActor) -> None:
        if actor.role != "rollout":
            return
        if self.weights_ref is None:
            self._put_weights()
        self._submit(actor)  # its first request carries the weights

    def _put_weights(self) -> None:
        self.weights_version = self.learner.policy_version
        # Small weights (an MLP's tens of KiB) travel inside each sample request: Ray inlines
        # arguments under its direct-call limit, so no object-store put per broadcast and no
        # fetch per actor. They go pickled, once per broadcast: as a dict Ray pickled them again
        # for every request. Large ones (the CNN's MiBs) are put once and shared by reference.
        if self._weights_nbytes <= INLINE_WEIGHTS_BYTES:
            self.weights_ref = self.learner.pickled_weights()
        else:
            self.weights_ref = self.backend.put(self.learner.get_weights())

    def in_flight(self, actor_id: str) -> int:
        return self.ledger.in_flight(actor_id)

    def absorb(self, fragments: list[Fragment]) -> None:
        self.ledger.backlog.extend(self.local_aggregator.add_many(fragments))

    def forget(self, actor_id: str) -> None:
        self.ledger.forget(actor_id)  # the sources of fragments it held are parked: asked again

    # -- stats and shutdown ---------------------------------------------------------------------

    def _time(self, name: str, start: float) -> None:
        window = self._timers.setdefault(name, deque(maxlen=100))
        window.append(time.perf_counter() - start)

    def _update_learner_stats(self) -> None:
        thread_stats = self.group.stats()
        capacity = self.spec.training.learner_queue_size
        self.stats.set_learner_queue(
            self.group.queue_stats(),
            capacity,
            thread_stats["learner_idle_fraction"],
        )
        timing = {k: v for k, v in thread_stats.items() if k.endswith("_time_ms")}
        for name, window in self._timers.items():
            timing[f"driver_{name}_time_ms"] = round(1000.0 * sum(window) / len(window), 3)
        self.stats.timing_breakdown = timing

    def _close(self) -> None:
        self.group.close(timeout=30)
        self._drain_learner_counts()

    def _drain_learner_counts(self) -> int:
        """Take finished updates off the learner's outqueue into the counters; how many.

        Called alone after the loop ends, so late updates are counted without a broadcast.
        """
        c = self.stats.counters
        done = self.group.updates()
        c.num_env_steps_trained += done.env_steps
        c.learner_updates += done.steps
        for lag in done.policy_lags:  # each batch's first update: the learner queue counts
            self.stats.add_policy_lag(lag)
        for stats in done.stats:
            self.stats.add_learner_stats(stats)
        # Schedules run on env steps trained, the clock of RLlib's old stack (its global_vars
        # "timestep" is NUM_AGENT_STEPS_TRAINED): a backlog in the queue does not decay them.
        self.learner.global_timestep = c.num_env_steps_trained
        c.policy_version = self.learner.policy_version
        return done.steps
