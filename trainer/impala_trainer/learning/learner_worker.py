"""One learner of a data-parallel group (learner.replicas > 1), for the driver's LearnerGroup.

A plain object (`learning/actor.py` wraps it in a Ray actor; the in-process backend calls it on
threads): today's learner thread, built by `make_learner_thread` (numSgdIter, the minibatch
buffer, the multi-GPU towers unchanged), whose `Learner` joined the group's `Collective`, so its
every step averages the gradients of all learners. The driver feeds it batches (`train`) and
long-polls what it did (`progress`): the updates with their env steps and stats, the thread's
timings, its error, and on rank 0 the newest weights, which are the ones broadcast to the
rollouts. Rank 0 also serves the rendezvous (`address`) and is the one whose state a checkpoint
keeps: every rank holds the same weights and optimiser state after each step.
"""

from __future__ import annotations

import pickle
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from impala_api.roles import COLLECTIVE_PORT_ENV
from impala_api.spec import ImpalaJobSpec
from impala_trainer.batches import TrainBatch
from impala_trainer.learning.collective import Collective, Rendezvous
from impala_trainer.learning.distributions import ActionDistribution
from impala_trainer.learning.threads import make_learner_thread
from impala_trainer.node.ray_node import free_port, pinned_port

PUT_TIMEOUT_SECONDS = 60.0
"""Longest `train` waits for room in the inqueue (the driver sends only what fits)."""


@dataclass(frozen=True)
class LearnerInfo:
    """What a learner reports once it joined its group."""

    device: str
    autocast_dtype: Any
    weights_nbytes: int
    policy_version: int
    stats: dict[str, float]
    """The thread's stats before its first update (`LearnerThread.stats`)."""
    queue_stats: dict[str, Any]


@dataclass
class LearnerProgress:
    """What a learner did since its previous report."""

    rank: int
    updates: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    """(env steps, stats) per update, as a learner thread's outqueue holds them: a batch's
    first pass carries its env steps (and its policy lag), the further passes 0."""
    stats: dict[str, float] = field(default_factory=dict)
    """The thread's timings and idle fraction (`LearnerThread.stats`)."""
    queue_stats: dict[str, Any] = field(default_factory=dict)
    policy_version: int = 0
    weights: bytes | None = None
    """Rank 0: its newest weights, pickled, when they changed since its previous report."""
    error: BaseException | None = None


class LearnerWorker:
    """A learner thread and its place in the group; see the module docstring."""

    def __init__(
        self,
        spec: ImpalaJobSpec,
        obs_shape: tuple[int, ...],
        actions: ActionDistribution | int,
        seed: int,
        rank: int,
        intra_op_threads: int,
    ) -> None:
        torch.set_num_threads(intra_op_threads)
        torch.manual_seed(seed)
        self.rank = rank
        self.thread = make_learner_thread(spec, obs_shape, actions)
        self.learner = self.thread.learner
        self.world_size = 1
        self.thread.outqueue = _Updates(self)
        self._sent_version = -1
        self._lock = threading.Lock()  # one progress report at a time

    def address(self, host: str) -> Rendezvous:
        """Rank 0: where the others meet it, on `host` (this learner's address): the port the
        pod pins for it (the NetworkPolicy opens it to learner pods alone), else a free one."""
        if self.rank != 0:
            raise RuntimeError(f"learner {self.rank} was asked for the rendezvous: rank 0 holds it")
        return Rendezvous(host, pinned_port(COLLECTIVE_PORT_ENV) or free_port(), 0)

    def join(self, rendezvous: Rendezvous, local_host: str, store: Any = None) -> LearnerInfo:
        """Join the group (blocks until every learner has) and take rank 0's weights."""
        collective = Collective.join(
            rendezvous, self.rank, self.learner.device, local_host=local_host, store=store
        )
        self.learner.join(collective)
        self.world_size = collective.world_size
        return LearnerInfo(
            device=str(self.learner.device),
            autocast_dtype=self.learner.autocast_dtype,
            weights_nbytes=self.learner.weights_nbytes(),
            policy_version=self.learner.policy_version,
            stats=self.thread.stats(),
            queue_stats=self.thread.learner_queue_size.stats(),
        )

    def load_state_dict(self, state: bytes) -> int:
        """A checkpoint's learner state (every rank loads the same); its policy version."""
        self.learner.load_state_dict(pickle.loads(state))
        return int(self.learner.policy_version)

    def start(self, global_timestep: int) -> None:
        self.learner.global_timestep = global_timestep
        self.thread.start()

    def train(self, batch: TrainBatch) -> None:
        """Queue a batch for the thread."""
        self.thread.inqueue.put(batch, timeout=PUT_TIMEOUT_SECONDS)

    def progress(self, wait_seconds: float) -> LearnerProgress:
        """What happened since the last report; waits up to `wait_seconds` for an update."""
        with self._lock:
            out = LearnerProgress(self.rank)
            deadline = time.monotonic() + wait_seconds
            while True:
                try:
                    out.updates.append(self.thread.outqueue.get_nowait())
                    continue
                except queue.Empty:
                    pass
                if out.updates or self.thread.error is not None:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    out.updates.append(self.thread.outqueue.get(timeout=min(left, 0.05)))
                except queue.Empty:
                    continue
            out.error = self.thread.error
            out.stats = self.thread.stats()
            out.queue_stats = self.thread.learner_queue_size.stats()
            out.policy_version = self.learner.policy_version
            if self.rank == 0 and out.policy_version != self._sent_version:
                out.weights = self.learner.pickled_weights()
                self._sent_version = out.policy_version
            return out

    def weights(self) -> bytes:
        """The newest weights, pickled (`Learner.pickled_weights`)."""
        return bytes(self.learner.pickled_weights())

    def state_dict(self) -> bytes:
        """The learner's state, pickled (plain bytes: no shared memory that dies with us)."""
        return pickle.dumps(self.learner.state_dict(), protocol=pickle.HIGHEST_PROTOCOL)

    def stop(self, wait: bool = True) -> None:
        """Stop the thread and (`wait`) wait for it: its step in progress, or its last
        all-reduce, tells the peers, which stop after the same step (`GradientReducer.finish`), so
        every learner ends on the same step, and its reports and state are final once this
        returns."""
        if self.learner.collective is not None:
            self.learner.collective.stopping.set()
        self.thread.stop()
        if wait and self.thread.is_alive():
            self.thread.join()


class _Updates(queue.Queue[tuple[int, dict[str, float]]]):
    """The thread's outqueue, which also advances the schedules' clock after each update, in
    the learner thread, before its next step: by the group's env steps, every learner's batch
    being trainBatchSize (the aggregator's batches are whole fragments), so that every rank
    computes the same learning rate and entropy coefficient at every step, from the same total
    the driver counts as num_env_steps_trained."""

    def __init__(self, owner: LearnerWorker) -> None:
        super().__init__()
        self._owner = owner

    def put(self, item: tuple[int, dict[str, float]], block: bool = True,
            timeout: float | None = None) -> None:  # fmt: skip
        self._owner.learner.global_timestep += item[0] * self._owner.world_size
        super().put(item, block, timeout)
