"""The learner thread in a process of its own, with its own GIL (learner.process: separate): the
driver's side.

In the driver's process the learner thread shares one GIL with the driver loop (Ray's calls,
fragments, batching). A small model's update is hundreds of small torch ops, each taking the GIL
back: CartPole's example measured 3.1 ms of wall time per update against 1.4 ms of CPU, and its
actors waited on a driver that waited on the GIL (bench/cpu_budget.py, and the status's
`learner_grad_time_ms` against one update timed alone).

`LearnerProcess` offers the driver what it uses of a learner thread: `inqueue` (a multiprocessing
queue of learnerQueueSize, so `put_nowait` raises queue.Full as a learner thread's inqueue
does; large arrays go through shared-memory slots, learners/batch_slots.py), `outqueue`
(`get_nowait` -> (env_steps, stats)), `stats()`, `learner_queue_size.stats()`, `error`,
`start/stop/join/is_alive`, and `learner`, a `LearnerView` of what the driver reads from a
learner: its policy version, its newest weights (`SharedWeights`), its state on request.

The process runs `learner_child.serve`; the two talk in the typed messages of
`learner_messages`.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import queue
import signal
import time
from collections import deque
from typing import TYPE_CHECKING, Any, TypeVar

from impala_trainer.learners import forkserver
from impala_trainer.learners.batch_slots import SlotQueue, slot_count
from impala_trainer.learners.child import serve
from impala_trainer.learners.messages import (
    POLL_SECONDS,
    Change,
    Error,
    Failed,
    Final,
    Load,
    Loaded,
    Log,
    Ready,
    Reply,
    Report,
    Start,
    StateReply,
    StateRequest,
    Stats,
    Stop,
    Updates,
    state_bytes,
)
from impala_trainer.learners.shared_weights import SharedWeights
from impala_trainer.learners.threads import batches_held_by_learner
from impala_trainer.learning.distributions import ActionDistribution

if TYPE_CHECKING:  # torch, which the learner module imports
    from impala_trainer.learning.learner import LearnerChange, LearnerConfig

R = TypeVar("R", bound=Ready | StateReply | Loaded)

logger = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 600.0
"""Longest the driver waits for the process to build its learner (torch's import on a cold
volume, CUDA's first context)."""
REPLY_TIMEOUT_SECONDS = 300.0
"""Longest a request (the learner's state for a checkpoint) may take."""


class LearnerProcessError(RuntimeError):
    """The learner process failed to start, answer or stay alive."""


class _QueueStats:
    """`learner_queue_size.stats()` as the driver calls it: the process's latest figures."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def stats(self) -> dict[str, Any]:
        return self.values


class _Updates:
    """`outqueue.get_nowait()` as the driver calls it: updates read from the process's pipe."""

    def __init__(self, owner: LearnerProcess) -> None:
        self._owner = owner
        self.pending: deque[tuple[int, dict[str, float]]] = deque()

    def get_nowait(self) -> tuple[int, dict[str, float]]:
        self._owner.pump()
        if not self.pending:
            raise queue.Empty
        return self.pending.popleft()


class LearnerView:
    """What the driver reads from the learner in the process, as from a `Learner`."""

    def __init__(self, owner: LearnerProcess, ready: Ready, lock: Any) -> None:
        self._owner = owner
        self.device: str = ready.device
        self.autocast_dtype: Any = ready.autocast_dtype
        self._nbytes: int = ready.weights_nbytes
        self.policy_version: int = ready.policy_version
        """Of the newest update read from the pipe (the shared weights may be a step newer, as
        a live model read between two updates)."""
        self.weights = SharedWeights(ready.shared, ready.layout, lock)
        self.global_timestep = 0
        """Sent to the process when it starts; from then on it counts the env steps it trains
        itself, the same number as the driver's counters."""

    def weights_nbytes(self) -> int:
        return self._nbytes

    def pickled_weights(self) -> bytes:
        with self.weights.lock:
            return pickle.dumps(self.weights.arrays(), protocol=5)

    def get_weights(self) -> dict[str, Any]:
        with self.weights.lock:
            return {k: v.copy() for k, v in self.weights.arrays().items()}

    def state_dict(self) -> dict[str, Any]:
        return self._owner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._owner.load_state_dict(state)

    def change(self, change: LearnerChange) -> None:
        self._owner.change(change)


class LearnerProcess:
    """Starts the learner process and stands for its learner thread in the driver."""

    def __init__(
        self,
        config: LearnerConfig,
        obs_shape: tuple[int, ...],
        actions: ActionDistribution | int,
        seed: int,
        intra_op_threads: int,
    ) -> None:
        # Forked from the forkserver (learners/forkserver.py), not from the driver: the driver
        # holds Ray's threads and sockets, which a fork would copy half-alive.
        ctx = forkserver.context()
        # Batches go through shared-memory slots (learners/batch_slots.py), not the pipe.
        size = config.training.learner_queue_size
        self.inqueue = SlotQueue(ctx, size, slot_count(size, batches_held_by_learner(config)))
        self._out, child_out = ctx.Pipe(duplex=False)
        self._ctl, child_ctl = ctx.Pipe()
        weights_lock = ctx.Lock()
        self._process = ctx.Process(
            target=serve,
            args=(config, obs_shape, actions, seed, intra_op_threads,
                  logging.getLogger().getEffectiveLevel(), self.inqueue.reader_args(), weights_lock,
                  child_out, child_ctl),
            name="impala-learner",
            daemon=True,
        )  # fmt: skip
        self._process.start()
        child_out.close()
        child_ctl.close()
        ready = self._reply(Ready, READY_TIMEOUT_SECONDS)
        self.learner = LearnerView(self, ready, weights_lock)
        self.outqueue = _Updates(self)
        self.learner_queue_size = _QueueStats(ready.queue_stats)
        self._stats: dict[str, float] = ready.stats
        self._error: BaseException | None = None
        self._final: dict[str, Any] | None = None
        self._started = False

    # -- the thread's surface -------------------------------------------------------------------

    @property
    def error(self) -> BaseException | None:
        self.pump()
        return self._error

    def start(self) -> None:
        self._ctl.send(Start(self.learner.global_timestep))
        self._started = True

    def is_alive(self) -> bool:
        return self._final is None and self._process.is_alive()

    def stop(self) -> None:
        if self._final is None and self._process.is_alive():
            with contextlib.suppress(OSError):  # it may have just exited
                self._ctl.send(Stop())

    def join(self, timeout: float | None = None) -> None:
        """Until the process has sent its final state and exited (or `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._final is None and self._process.is_alive():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            self._out.poll(POLL_SECONDS if left is None else min(POLL_SECONDS, left))
            self.pump()
        self.pump()
        self._process.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def stats(self) -> dict[str, float]:
        self.pump()
        return self._stats

    def pump(self) -> None:
        """Read everything the process has sent so far."""
        try:
            while self._out.poll():
                self._on_message(self._out.recv())
        except (EOFError, OSError):  # the process is gone; is_alive says so
            pass

    def _on_message(self, message: Report) -> None:
        match message:
            case Updates(updates, policy_version):
                self.learner.policy_version = policy_version
                self.outqueue.pending.extend(updates)
            case Stats(stats, queue_stats):
                self._stats = stats
                self.learner_queue_size.values = queue_stats
            case Log(record):
                named = logging.getLogger(record.name)
                if named.isEnabledFor(record.levelno):
                    named.handle(record)
            case Error(error):
                self._error = error
            case Final(final, stats, queue_stats):
                self._final = pickle.loads(final)
                self._stats = stats
                self.learner_queue_size.values = queue_stats

    # -- requests -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The learner's state: asked of the process, or the one it sent as it finished."""
        self.pump()
        if self._final is None and self._process.is_alive():
            self._ctl.send(StateRequest())
            reply = self._reply(StateReply, REPLY_TIMEOUT_SECONDS)
            state: dict[str, Any] = pickle.loads(reply.state)
            return state
        if self._final is None:
            raise LearnerProcessError(self._exited("before it sent its state"))
        return self._final

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint's learner state (before `start`)."""
        if self._started:
            raise RuntimeError("a learner process loads a state only before it starts")
        self._ctl.send(Load(state_bytes(state)))
        self.learner.policy_version = self._reply(Loaded, REPLY_TIMEOUT_SECONDS).policy_version

    def change(self, change: LearnerChange) -> None:
        """Queue a change for the learner's next update, in the process."""
        self._ctl.send(Change(pickle.dumps(change, protocol=pickle.HIGHEST_PROTOCOL)))

    def _reply(self, expected: type[R], timeout: float) -> R:
        kind = expected.kind
        deadline = time.monotonic() + timeout
        while not self._ctl.poll(POLL_SECONDS):
            if not self._process.is_alive():
                raise LearnerProcessError(self._exited(f"while the driver waited for {kind!r}"))
            if time.monotonic() > deadline:
                raise LearnerProcessError(f"the learner process sent no {kind!r} in {timeout:g} s")
        got: Reply = self._ctl.recv()
        if isinstance(got, Failed):
            raise LearnerProcessError(f"the learner process failed: {got.error}") from got.error
        if not isinstance(got, expected):
            raise LearnerProcessError(f"the learner process sent {got.kind!r}, not {kind!r}")
        return got

    def _exited(self, when: str) -> str:
        return f"the learner process exited (code {self._process.exitcode}) {when}"

    def stopped_reason(self) -> str:
        """Why `is_alive()` is False, for the run's one-line failure message."""
        code = self._process.exitcode
        if code is None or code >= 0:
            return f"the learner process stopped (exit code {code})"
        name = signal.Signals(-code).name
        # In a pod the kernel's OOM killer is what sends SIGKILL to one process of several.
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        return f"the learner process was killed by {name}{hint}"
