"""The learner thread (RLlib's LearnerThread): trains on batches the driver puts in its inqueue.

Ray calls stay on the driver's main thread; this thread only moves batches from `inqueue`
through a MinibatchBuffer into `learner.learn_on_batch` and reports (env_steps, stats) on
`outqueue`; a batch's first update adds its policy lag to the stats (POLICY_LAG). The driver
counts `queue.Full` from `inqueue.put_nowait` as num_times_learner_queue_full.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from impala_trainer.batches import TrainBatch
from impala_trainer.learners.minibatch_buffer import BufferItem, ItemQueue, MinibatchBuffer
from impala_trainer.learning.collective import GroupStopped

logger = logging.getLogger(__name__)

STATS_WINDOW = 50
POLICY_LAG = "policy_lag"
"""The key a batch's first update adds to its stats on `outqueue`: the updates the learner had
made since the policy that sampled the batch (the IMPALA paper's policy lag; the time the batch
waited in the learner queue counts)."""
# How often a waiting thread wakes to notice stop(); short so shutdown never lags.
POLL_SECONDS = 0.1


class BatchQueue(ItemQueue[TrainBatch], Protocol):
    """What the learner side needs of its inqueue: a `queue.Queue`, or in a learner process a
    `multiprocessing` queue (learners/process.py). The driver puts, the thread gets."""

    def put(self, item: TrainBatch, block: bool = True, timeout: float | None = None) -> None: ...

    def put_nowait(self, item: TrainBatch) -> None: ...

    def qsize(self) -> int: ...


class LearnerStarvedError(RuntimeError):
    """No train batch arrived within learnerQueueTimeout."""


class _Stopped(Exception):
    """stop() was called while waiting."""


class TimerStat:
    """Durations of the last `window` timed sections (thread-safe to share between threads)."""

    def __init__(self, window: int = STATS_WINDOW) -> None:
        self.samples: deque[float] = deque(maxlen=window)
        self.count = 0

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.push(time.perf_counter() - start)

    def push(self, seconds: float) -> None:
        self.samples.append(seconds)
        self.count += 1

    @property
    def mean(self) -> float:
        samples = list(self.samples)
        return sum(samples) / len(samples) if samples else 0.0

    @property
    def mean_ms(self) -> float:
        return round(1000.0 * self.mean, 3)


class WindowStat:
    """RLlib's WindowStat: statistics of the last `window` values (the learner queue size after
    each update), reported as `{name}_count/_mean/_std/_quantiles` like RLlib's."""

    QUANTILES = (0, 10, 50, 90, 100)

    def __init__(self, name: str, window: int = STATS_WINDOW) -> None:
        self.name = name
        self.values: deque[float] = deque(maxlen=window)

    def push(self, value: float) -> None:
        self.values.append(value)

    def stats(self) -> dict[str, Any]:
        values = np.asarray(self.values, np.float64)
        n = self.name
        if not len(values):
            return {f"{n}_count": 0, f"{n}_mean": 0.0, f"{n}_std": 0.0, f"{n}_quantiles": []}
        return {
            f"{n}_count": len(values),
            f"{n}_mean": float(values.mean()),
            f"{n}_std": float(values.std()),
            f"{n}_quantiles": [float(q) for q in np.percentile(values, self.QUANTILES)],
        }


def sampled_version(batch: TrainBatch) -> float:
    """The policy version that sampled `batch` (the mean over its columns)."""
    return float(np.mean(batch.policy_versions))


def starved_message(timeout: float) -> str:
    return (
        f"learner starved: no train batch for {timeout:g} s (learnerQueueTimeout); "
        "are the rollout workers alive?"
    )


class LearnerThread(threading.Thread):
    """Background thread calling learner.learn_on_batch on batches from a bounded inqueue."""

    def __init__(
        self,
        learner: Any,
        minibatch_buffer_size: int,
        num_sgd_iter: int,
        learner_queue_size: int,
        learner_queue_timeout: float,
        intra_op_threads: int | None = None,
        inqueue: BatchQueue | None = None,
    ) -> None:
        super().__init__(name="learner", daemon=True)
        self.learner = learner
        self.intra_op_threads = intra_op_threads
        """torch intra-op threads this thread computes with (None: leave torch's setting)."""
        self.num_sgd_iter = num_sgd_iter
        self.learner_queue_timeout = learner_queue_timeout
        self.queue_capacity = learner_queue_size
        # A multiprocessing queue where the thread runs in a process of its own
        # (learner_process.py); otherwise the driver puts into a queue.Queue of this bound.
        self.inqueue: BatchQueue = (
            queue.Queue(maxsize=learner_queue_size) if inqueue is None else inqueue
        )
        self.outqueue: queue.Queue[tuple[int, dict[str, float]]] = queue.Queue()
        self.minibatch_buffer: MinibatchBuffer[TrainBatch] = MinibatchBuffer(
            self.inqueue, minibatch_buffer_size, learner_queue_timeout, num_sgd_iter
        )
        self.queue_timer = TimerStat()  # waiting for the next batch (dequeue)
        self.grad_timer = TimerStat()  # learn_on_batch / learn_on_loaded_batch
        self.load_timer = TimerStat()  # copying a batch onto the device(s)
        self.load_wait_timer = TimerStat()  # a loader waiting for an idle tower stack
        self.learner_queue_size = WindowStat("size")
        self._waits: deque[float] = deque(maxlen=STATS_WINDOW)
        self._busy: deque[float] = deque(maxlen=STATS_WINDOW)
        self._waiting_since: float | None = None
        self._stop_event = threading.Event()
        self.error: BaseException | None = None
        """The exception that stopped the thread (e.g. LearnerStarvedError), else None."""
        self.learner_info: dict[str, float] = {}
        """Stats of the latest update."""
        self.num_steps = 0

    @property
    def stopped(self) -> bool:
        return self._stop_event.is_set()

    def stop(self) -> None:
        """Ask the thread to finish; it notices within POLL_SECONDS."""
        self._stop_event.set()

    def run(self) -> None:
        if self.intra_op_threads is not None:
            import torch

            torch.set_num_threads(self.intra_op_threads)  # this thread's OpenMP team size
        try:
            while not self._stop_event.is_set():
                self.step()
            self._leave_group()
        except _Stopped:
            self._leave_group()
        except GroupStopped:  # a peer of learner.replicas stopped: so does this learner
            pass
        except BaseException as exc:  # recorded for the driver, which fails the run with it
            self.error = exc
            logger.error("learner thread stopped: %s", exc, exc_info=True)
        finally:
            self._stop_event.set()

    def _leave_group(self) -> None:
        leave = getattr(self.learner, "leave_group", None)  # a learner of learner.replicas
        if leave is not None:
            leave()

    def step(self) -> None:
        """Wait for the next batch (or pass over a buffered one), learn, report."""
        got = self._wait_for(self.minibatch_buffer)
        start = time.perf_counter()
        lag = self.learner.policy_version - sampled_version(got.item) if got.first_pass else None
        # The batch's device tensors and prepared observations stay with the learner until its
        # last pass.
        stats = self.learner.learn_on_batch(got.item, keep=not got.released)
        self._record_update(start, got.item.env_steps if got.first_pass else 0, stats, lag)

    def _wait_for(self, buffer: MinibatchBuffer[Any]) -> BufferItem[Any]:
        """buffer.get(), polling so stop() is noticed; raises LearnerStarvedError at the timeout."""
        self._waiting_since = start = time.perf_counter()
        deadline = start + self.learner_queue_timeout
        try:
            while True:
                if self._stop_event.is_set():
                    raise _Stopped
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    raise LearnerStarvedError(starved_message(self.learner_queue_timeout))
                try:
                    return buffer.get(timeout=min(POLL_SECONDS, remaining))
                except queue.Empty:
                    continue
        finally:
            waited = time.perf_counter() - start
            self._waiting_since = None
            self.queue_timer.push(waited)
            self._waits.append(waited)

    def _record_update(
        self, start: float, env_steps: int, stats: dict[str, float], lag: float | None = None
    ) -> None:
        busy = time.perf_counter() - start
        self.grad_timer.push(busy)
        self._busy.append(busy)
        self.learner_info = stats
        self.num_steps += 1
        self.outqueue.put((env_steps, stats if lag is None else {**stats, POLICY_LAG: lag}))
        self.learner_queue_size.push(self.inqueue.qsize())

    def stopped_reason(self) -> str:
        """Why `is_alive()` is False, for the run's one-line failure message."""
        return "the learner thread stopped"

    def idle_fraction(self) -> float:
        """Share of recent time spent waiting for data (counting a wait still in progress)."""
        waits, busy = sum(self._waits), sum(self._busy)
        since = self._waiting_since
        if since is not None:
            waits += time.perf_counter() - since
        total = waits + busy
        return waits / total if total > 0 else 0.0

    def stats(self) -> dict[str, float]:
        """Timings (ms), learner queue size over the last updates, idle fraction, update count."""
        queue_stats = self.learner_queue_size.stats()
        return {
            "learner_dequeue_time_ms": self.queue_timer.mean_ms,
            "learner_grad_time_ms": self.grad_timer.mean_ms,
            "learner_load_time_ms": self.load_timer.mean_ms,
            "learner_load_wait_time_ms": self.load_wait_timer.mean_ms,
            "learner_queue_size_mean": queue_stats["size_mean"],
            "learner_queue_size_max": max(queue_stats["size_quantiles"], default=0.0),
            "learner_queue_size_now": float(self.inqueue.qsize()),
            "learner_queue_capacity": float(self.queue_capacity),
            "learner_idle_fraction": round(self.idle_fraction(), 4),
            "num_learner_updates": float(self.num_steps),
        }

    def add_learner_metrics(self, result: dict[str, Any]) -> dict[str, Any]:
        """RLlib's add_learner_metrics: queue, learner and timing stats under result["info"]."""
        s = self.stats()
        info = result.setdefault("info", {})
        info["learner_queue"] = self.learner_queue_size.stats()
        info["learner"] = dict(self.learner_info)
        info["timing_breakdown"] = {k: v for k, v in s.items() if k.endswith("_time_ms")}
        return result
