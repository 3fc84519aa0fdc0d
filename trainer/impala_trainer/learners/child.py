"""The learner process's side (`serve`, its main): it builds the learner with
`make_learner_thread` on the inqueue the driver fills (the same thread classes: numSgdIter, the
minibatch buffer and the multi-GPU towers behave the same), runs the thread, and answers the
driver's requests (`learner_messages`) on its main thread. The updates go back on a pipe with
their policy version (`_Outbox`); the weights go into the buffer both processes map
(`SharedWeights`), from which the driver broadcasts the newest. The driver's side is
`learner_process.LearnerProcess`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import logging.handlers
import pickle
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, cast

from impala_trainer.learners.batch_slots import SlotReader
from impala_trainer.learners.learner_thread import BatchQueue
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
    Request,
    Start,
    StateReply,
    StateRequest,
    Stats,
    Stop,
    Updates,
    state_bytes,
)
from impala_trainer.learners.shared_weights import SharedWeights
from impala_trainer.learners.threads import make_learner_thread
from impala_trainer.learning.distributions import ActionDistribution
from impala_trainer.node.allocator import keep_freed_memory

if TYPE_CHECKING:  # torch, which the learner module imports
    from impala_trainer.learning.learner import LearnerConfig

STATS_SECONDS = 0.5
"""How often the process sends the thread's timings and queue statistics."""


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


class _Outbox:
    """The thread's `outqueue` in the process, and the one writer of the pipe to the driver.

    `put` (the learner thread, after each update) never blocks: a sender thread writes the pipe,
    which blocks whenever the driver is busy elsewhere (it reads the pipe once per loop, and not
    while it waits up to WAIT_SECONDS for room in the learner queue). Were the learner thread
    to write the pipe itself, a full pipe would stop it until the driver's wait runs out: 50
    updates/s instead of ~500 at numSgdIter 4. Updates that waited together go as one message,
    after the newest weights were written to the shared buffer once.
    """

    def __init__(self, out: Connection) -> None:
        self.learner: Any = None
        self.weights: SharedWeights | None = None
        """Both set once built; only updates read them."""
        self.out = out
        self._cond = threading.Condition()
        self._updates: list[tuple[int, dict[str, float]]] = []
        self._messages: list[Report] = []
        self._closed = False
        self._sender = threading.Thread(target=self._send_loop, name="outbox", daemon=True)
        self._sender.start()

    def put(self, item: tuple[int, dict[str, float]]) -> None:
        # The schedules' clock: env steps trained, as the driver's counters count them.
        self.learner.global_timestep += item[0]
        with self._cond:
            self._updates.append(item)
            self._cond.notify()

    def send(self, message: Report) -> None:
        """Another message (stats, error, final), after the updates put before it."""
        with self._cond:
            self._messages.append(message)
            self._cond.notify()

    def put_nowait(self, record: logging.LogRecord) -> None:
        """A `logging.handlers.QueueHandler`'s queue: the process's log records go to the
        driver's logging, wherever that writes (the run's log, stderr), and nowhere else."""
        self.send(Log(record))

    def close(self, timeout: float | None = None) -> None:
        """Send what is waiting, then stop the sender."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._sender.join(timeout)

    def _send_loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._updates or self._messages or self._closed):
                        self._cond.wait()
                    updates, self._updates = self._updates, []
                    messages, self._messages = self._messages, []
                    closed = self._closed
                if updates:
                    version = publish(self.learner, self.weights)
                    self.out.send(Updates(updates, version))
                for message in messages:
                    self.out.send(message)
                if closed and not (updates or messages):
                    return
        except OSError:  # the driver is gone
            return


def publish(learner: Any, weights: Any) -> int:
    """The learner's weights into the shared buffer; the policy version they are of."""
    with weights.lock:
        version: int = learner.write_weights(weights.views)
        return version


def _name_process(name: bytes) -> None:
    """The name `top` and `ps -o comm` show (Linux; 15 bytes at most): in a learner pod the
    process reads as the learner, not as a second python."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(15, name, 0, 0, 0)  # PR_SET_NAME


def serve(
    config: LearnerConfig,
    obs_shape: tuple[int, ...],
    actions: ActionDistribution | int,
    seed: int,
    intra_op_threads: int,
    log_level: int,
    inqueue: tuple[Any, Any, Any],
    weights_lock: Any,
    out: Connection,
    ctl: Connection,
) -> None:
    """The learner process's main: build, report ready, serve requests until stopped."""
    # The driver decides when the learner stops: a terminal's Ctrl-C reaches the whole process
    # group, and the driver still needs the learner's state for its last checkpoint. Should the
    # driver die instead, the control pipe's end says so.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _name_process(b"impala-learner")
    # As the driver's process does before its learner thread (node/allocator.py): forked from
    # the forkserver, which never set them, the process has glibc's defaults, which return a CNN
    # update's large buffers to the kernel and fault them in again on the next update.
    keep_freed_memory()
    outbox = _Outbox(out)
    root = logging.getLogger()
    root.handlers = [logging.handlers.QueueHandler(outbox)]  # type: ignore[arg-type]
    root.setLevel(log_level)
    try:
        import torch

        torch.set_num_threads(intra_op_threads)
        torch.manual_seed(seed)  # the same initial weights as a learner in the driver's process
        # The thread only gets from its inqueue: the driver puts into the SlotQueue end.
        reader = cast(BatchQueue, SlotReader(*inqueue))
        thread = make_learner_thread(config, obs_shape, actions, inqueue=reader)
        learner = thread.learner
        weights = SharedWeights.for_state(learner.model.state_dict(), weights_lock)
        ctl.send(Ready(
            device=str(learner.device),
            autocast_dtype=learner.autocast_dtype,
            weights_nbytes=learner.weights_nbytes(),
            policy_version=publish(learner, weights),
            shared=weights.flat,  # goes as shared memory (torch's reductions), not a copy
            layout=weights.layout,
            stats=thread.stats(),
            queue_stats=thread.learner_queue_size.stats(),
        ))  # fmt: skip
    except BaseException as exc:
        ctl.send(Failed(_picklable(exc)))
        return
    outbox.learner, outbox.weights = learner, weights
    thread.outqueue = outbox  # type: ignore[assignment]
    _serve_requests(thread, learner, weights, outbox, ctl)


def _answer(learner: Any, weights: SharedWeights, request: StateRequest | Load) -> Reply:
    """A state for a checkpoint, or a checkpoint's state loaded; `Failed` instead of the
    process's death when that raises (a checkpoint of another model, say)."""
    try:
        match request:
            case StateRequest():
                return StateReply(state_bytes(learner.state_dict()))
            case Load(state):
                learner.load_state_dict(pickle.loads(state))
                return Loaded(publish(learner, weights))
    except Exception as exc:
        return Failed(_picklable(exc))


def _serve_requests(
    thread: Any, learner: Any, weights: SharedWeights, outbox: _Outbox, ctl: Connection
) -> None:
    last_stats = time.monotonic()
    try:
        while True:
            if ctl.poll(POLL_SECONDS):
                request: Request = ctl.recv()
                match request:
                    case Start(global_timestep):
                        learner.global_timestep = global_timestep
                        thread.start()
                    case StateRequest() | Load():
                        ctl.send(_answer(learner, weights, request))
                    case Change(change):
                        learner.change(pickle.loads(change))
                    case Stop():
                        break
            if thread.is_alive() and time.monotonic() - last_stats >= STATS_SECONDS:
                last_stats = time.monotonic()
                outbox.send(Stats(thread.stats(), thread.learner_queue_size.stats()))
            if thread.error is not None:
                outbox.send(Error(_picklable(thread.error)))
                break
    except (EOFError, OSError):  # the driver is gone: nothing to report to
        thread.stop()
        return
    thread.stop()
    if thread.is_alive():
        thread.join()
    # The learner's state as it ends, for the driver's last checkpoint (after a failure too).
    final = state_bytes(learner.state_dict())
    outbox.send(Final(final, thread.stats(), thread.learner_queue_size.stats()))
    outbox.close()
