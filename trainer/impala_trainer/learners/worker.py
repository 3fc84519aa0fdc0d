"""One learner of a data-parallel group (learner.replicas > 1), for the driver's LearnerGroup.

A plain object (`learners/actor.py` wraps it in a Ray actor; the in-process backend calls it on
threads) holding every trained policy of the job (a single-agent job's one, `default`): for
each, a learner thread built by `make_learner_thread` (numSgdIter, the minibatch buffer, the
multi-GPU towers unchanged), whose `Learner` joined that policy's `Collective`, so its every step
averages the gradients of that policy's learners. Each policy has a process group of its own
(over one store): its learner thread steps on its own, and collectives match by their order
within a group. The driver feeds it batches (`train`, by `TrainBatch.policy_id`) and long-polls
what it did (`progress`): each policy's updates with their env steps and stats, the threads'
timings, an error, and on rank 0 the newest weights, which are the ones broadcast to the
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
from impala_trainer.batches import TrainBatch
from impala_trainer.learners.threads import make_learner_thread
from impala_trainer.learning.collective import Collective, Rendezvous, rendezvous_store
from impala_trainer.learning.learner import Learner, LearnerPolicy
from impala_trainer.node.ray_node import free_port, pinned_port

PUT_TIMEOUT_SECONDS = 60.0
"""Longest `train` waits for room in the inqueue (the driver sends only what fits)."""


Update = tuple[int, dict[str, float]]
"""(env steps, stats) of one update, as a learner thread's outqueue holds it: a batch's first
pass carries its env steps (and its policy lag), the further passes 0."""


@dataclass(frozen=True)
class LearnerInfo:
    """What a learner reports of one policy once it joined its group."""

    device: str
    autocast_dtype: Any
    weights_nbytes: int
    policy_version: int
    stats: dict[str, float]
    """The thread's stats before its first update (`LearnerThread.stats`)."""
    queue_stats: dict[str, Any]


@dataclass
class LearnerProgress:
    """What a learner did since its previous report, by policy."""

    rank: int
    updates: dict[str, list[Update]] = field(default_factory=dict)
    stats: dict[str, dict[str, float]] = field(default_factory=dict)
    """Each thread's timings and idle fraction (`LearnerThread.stats`)."""
    queue_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    policy_version: dict[str, int] = field(default_factory=dict)
    weights: dict[str, bytes] = field(default_factory=dict)
    """Rank 0: a policy's newest weights, pickled, when they changed since its previous report."""
    error: BaseException | None = None


class LearnerWorker:
    """A learner thread per policy and their place in the group; see the module docstring."""

    def __init__(
        self, policies: dict[str, LearnerPolicy], seed: int, rank: int, intra_op_threads: int
    ) -> None:
        torch.set_num_threads(intra_op_threads)
        torch.manual_seed(seed)
        self.rank = rank
        self.world_size = 1
        self._done: queue.Queue[tuple[str, Update]] = queue.Queue()
        """Every thread's updates as they come, by policy (`_Updates`)."""
        self.threads = {}
        for name, (config, obs_shape, actions) in policies.items():
            thread = make_learner_thread(config, obs_shape, actions)
            thread.outqueue = _Updates(self, name, thread.learner)  # type: ignore[assignment]
            self.threads[name] = thread
        self.learners: dict[str, Learner] = {n: t.learner for n, t in self.threads.items()}
        self._sent_version = dict.fromkeys(self.threads, -1)
        self._lock = threading.Lock()  # one progress report at a time

    def address(self, host: str) -> Rendezvous:
        """Rank 0: where the others meet it, on `host` (this learner's address): the port the
        pod pins for it (the NetworkPolicy opens it to learner pods alone), else a free one."""
        if self.rank != 0:
            raise RuntimeError(f"learner {self.rank} was asked for the rendezvous: rank 0 holds it")
        return Rendezvous(host, pinned_port(COLLECTIVE_PORT_ENV) or free_port(), 0)

    def join(
        self, rendezvous: Rendezvous, local_host: str, store: Any = None
    ) -> dict[str, LearnerInfo]:
        """Join each policy's group, in the policies' order on every rank (blocks until every
        learner has), and take rank 0's weights."""
        if store is None:
            store = rendezvous_store(rendezvous, self.rank)
        infos = {}
        for name, thread in self.threads.items():
            learner = thread.learner
            collective = Collective.join(
                rendezvous, self.rank, learner.device, local_host=local_host, store=store,
                prefix=f"impala-learners/{name}",
            )  # fmt: skip
            learner.join(collective)
            self.world_size = collective.world_size
            infos[name] = LearnerInfo(
                device=str(learner.device),
                autocast_dtype=learner.autocast_dtype,
                weights_nbytes=learner.weights_nbytes(),
                policy_version=learner.policy_version,
                stats=thread.stats(),
                queue_stats=thread.learner_queue_size.stats(),
            )
        return infos

    def load_state_dict(self, policy: str, state: bytes) -> int:
        """A checkpoint's learner state of `policy` (every rank loads the same); its version."""
        learner = self.learners[policy]
        learner.load_state_dict(pickle.loads(state))
        return int(learner.policy_version)

    def change(self, policy: str, change: bytes) -> int:
        """Queue a `LearnerChange` (pickled) for `policy`'s learner; its version now."""
        learner = self.learners[policy]
        learner.change(pickle.loads(change))
        return int(learner.policy_version)

    def start(self, global_timesteps: dict[str, int]) -> None:
        """Start every thread, each policy's schedules at its clock."""
        for name, thread in self.threads.items():
            thread.learner.global_timestep = global_timesteps[name]
            thread.start()

    def train(self, batch: TrainBatch) -> None:
        """Queue a batch for its policy's thread."""
        self.threads[batch.policy_id].inqueue.put(batch, timeout=PUT_TIMEOUT_SECONDS)

    def progress(self, wait_seconds: float) -> LearnerProgress:
        """What happened since the last report; waits up to `wait_seconds` for an update."""
        with self._lock:
            out = LearnerProgress(self.rank, updates={name: [] for name in self.threads})
            deadline = time.monotonic() + wait_seconds
            taken = 0
            while True:
                try:
                    name, update = self._done.get_nowait()
                except queue.Empty:
                    if taken or self._error() is not None:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        name, update = self._done.get(timeout=min(left, 0.05))
                    except queue.Empty:
                        continue
                out.updates[name].append(update)
                taken += 1
            out.error = self._error()
            for name, thread in self.threads.items():
                out.stats[name] = thread.stats()
                out.queue_stats[name] = thread.learner_queue_size.stats()
                version = out.policy_version[name] = thread.learner.policy_version
                if self.rank == 0 and version != self._sent_version[name]:
                    out.weights[name] = thread.learner.pickled_weights()
                    self._sent_version[name] = version
            return out

    def _error(self) -> BaseException | None:
        return next((t.error for t in self.threads.values() if t.error is not None), None)

    def weights(self, policy: str) -> bytes:
        """The newest weights of `policy`, pickled (`Learner.pickled_weights`)."""
        return bytes(self.learners[policy].pickled_weights())

    def state_dict(self, policy: str) -> bytes:
        """The learner state of `policy`, pickled (plain bytes: no shared memory that dies with
        us)."""
        return pickle.dumps(self.learners[policy].state_dict(), protocol=pickle.HIGHEST_PROTOCOL)

    def stop(self, wait: bool = True) -> None:
        """Stop the threads and (`wait`) wait for them: a thread's step in progress, or its last
        all-reduce, tells its peers, which stop after the same step (`GradientReducer.finish`),
        so every learner of a policy ends on the same step, and the reports and state are final
        once this returns."""
        for thread in self.threads.values():
            if thread.learner.collective is not None:
                thread.learner.collective.stopping.set()
            thread.stop()
        if wait:
            for thread in self.threads.values():
                if thread.is_alive():
                    thread.join()


class _Updates:
    """A thread's outqueue (its one call is `put`): the update goes to the worker's report,
    tagged with its policy, after advancing that policy's schedules' clock, in the learner
    thread, before its next step: by the group's env steps, every learner's batch being
    trainBatchSize (the aggregator's batches are whole fragments), so that every rank computes
    the same learning rate and entropy coefficient at every step of the policy, from the same
    total the driver counts as the policy's env steps trained."""

    def __init__(self, owner: LearnerWorker, policy: str, learner: Learner) -> None:
        self._owner, self._policy, self._learner = owner, policy, learner

    def put(self, item: Update) -> None:
        self._learner.global_timestep += item[0] * self._owner.world_size
        self._owner._done.put((self._policy, item))
