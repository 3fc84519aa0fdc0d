"""The learner thread in a process of its own, with its own GIL (learner.process: separate).

In the driver's process the learner thread shares one GIL with the driver loop (Ray's calls,
fragments, batching). A small model's update is hundreds of small torch ops, each taking the GIL
back: CartPole's example measured 3.1 ms of wall time per update against 1.4 ms of CPU, and its
actors waited on a driver that waited on the GIL (docs/benchmarks.md, 1a).

`LearnerProcess` offers the driver what it uses of a learner thread: `inqueue` (a multiprocessing
queue of learnerQueueSize, so `put_nowait` raises queue.Full as before; large arrays go through
shared-memory slots, learning/batch_slots.py), `outqueue`
(`get_nowait` -> (env_steps, stats)), `stats()`, `learner_queue_size.stats()`, `error`,
`start/stop/join/is_alive`, and `learner`, a `LearnerView` of what the driver reads from a
learner: its policy version, its newest weights, its state on request.

The process (`serve`) builds the learner with `make_learner_thread` on that inqueue (the same
thread classes: numSgdIter, the minibatch buffer and the multi-GPU towers behave the same), runs
the thread, and answers the driver's requests on its main thread. The updates go back on a pipe
with their policy version (`_Outbox`); the weights go into a buffer both processes map
(`SharedWeights`), from which the driver broadcasts the newest, as it read the thread's live model
before: no pickling or piping of a CNN's megabytes after every update.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import logging.handlers
import math
import pickle
import queue
import signal
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import Any, cast

from impala_api.spec import ImpalaJobSpec
from impala_trainer.learning import forkserver
from impala_trainer.learning.batch_slots import SlotQueue, SlotReader, slot_count
from impala_trainer.learning.distributions import ActionDistribution
from impala_trainer.learning.learner_thread import BatchQueue
from impala_trainer.learning.threads import batches_held_by_learner, make_learner_thread
from impala_trainer.node.allocator import keep_freed_memory

logger = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 600.0
"""Longest the driver waits for the process to build its learner (torch's import on a cold
volume, CUDA's first context)."""
REPLY_TIMEOUT_SECONDS = 300.0
"""Longest a request (the learner's state for a checkpoint) may take."""
STATS_SECONDS = 0.5
"""How often the process sends the thread's timings and queue statistics."""
POLL_SECONDS = 0.1


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

    def __init__(self, owner: LearnerProcess, info: dict[str, Any], lock: Any) -> None:
        self._owner = owner
        self.device: str = info["device"]
        self.autocast_dtype: Any = info["autocast_dtype"]
        self._nbytes: int = info["weights_nbytes"]
        self.policy_version: int = info["policy_version"]
        """Of the newest update read from the pipe (the shared weights may be a step newer, as
        a live model read between two updates)."""
        self.weights = SharedWeights(info["shared"], info["layout"], lock)
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


class LearnerProcess:
    """Starts the learner process and stands for its learner thread in the driver."""

    def __init__(
        self,
        spec: ImpalaJobSpec,
        obs_shape: tuple[int, ...],
        actions: ActionDistribution | int,
        seed: int,
        intra_op_threads: int,
    ) -> None:
        # Forked from the forkserver (learning/forkserver.py), not from the driver: the driver
        # holds Ray's threads and sockets, which a fork would copy half-alive.
        ctx = forkserver.context()
        # Batches go through shared-memory slots (learning/batch_slots.py), not the pipe.
        size = spec.training.learner_queue_size
        self.inqueue = SlotQueue(ctx, size, slot_count(size, batches_held_by_learner(spec)))
        self._out, child_out = ctx.Pipe(duplex=False)
        self._ctl, child_ctl = ctx.Pipe()
        weights_lock = ctx.Lock()
        self._process = ctx.Process(
            target=serve,
            args=(spec, obs_shape, actions, seed, intra_op_threads,
                  logging.getLogger().getEffectiveLevel(), self.inqueue.reader_args(), weights_lock,
                  child_out, child_ctl),
            name="impala-learner",
            daemon=True,
        )  # fmt: skip
        self._process.start()
        child_out.close()
        child_ctl.close()
        info = self._reply("ready", READY_TIMEOUT_SECONDS)
        self.learner = LearnerView(self, info, weights_lock)
        self.outqueue = _Updates(self)
        self.learner_queue_size = _QueueStats(info["queue_stats"])
        self._stats: dict[str, float] = info["stats"]
        self._error: BaseException | None = None
        self._final: dict[str, Any] | None = None
        self._started = False

    # -- the thread's surface -------------------------------------------------------------------

    @property
    def error(self) -> BaseException | None:
        self.pump()
        return self._error

    def start(self) -> None:
        self._ctl.send(("start", self.learner.global_timestep))
        self._started = True

    def is_alive(self) -> bool:
        return self._final is None and self._process.is_alive()

    def stop(self) -> None:
        if self._final is None and self._process.is_alive():
            with contextlib.suppress(OSError):  # it may have just exited
                self._ctl.send(("stop",))

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

    def _on_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "updates":
            _, updates, self.learner.policy_version = message
            self.outqueue.pending.extend(updates)
        elif kind == "stats":
            _, self._stats, queue_stats = message
            self.learner_queue_size.values = queue_stats
        elif kind == "log":
            record: logging.LogRecord = message[1]
            named = logging.getLogger(record.name)
            if named.isEnabledFor(record.levelno):
                named.handle(record)
        elif kind == "error":
            self._error = message[1]
        elif kind == "final":
            _, final, self._stats, queue_stats = message
            self._final = pickle.loads(final)
            self.learner_queue_size.values = queue_stats

    # -- requests -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The learner's state: asked of the process, or the one it sent as it finished."""
        self.pump()
        if self._final is None and self._process.is_alive():
            self._ctl.send(("state",))
            state: dict[str, Any] = pickle.loads(self._reply("state", REPLY_TIMEOUT_SECONDS))
            return state
        if self._final is None:
            raise LearnerProcessError(self._exited("before it sent its state"))
        return self._final

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint's learner state (before `start`)."""
        if self._started:
            raise RuntimeError("a learner process loads a state only before it starts")
        self._ctl.send(("load", _dumps(state)))
        self.learner.policy_version = self._reply("loaded", REPLY_TIMEOUT_SECONDS)

    def _reply(self, kind: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not self._ctl.poll(POLL_SECONDS):
            if not self._process.is_alive():
                raise LearnerProcessError(self._exited(f"while the driver waited for {kind!r}"))
            if time.monotonic() > deadline:
                raise LearnerProcessError(f"the learner process sent no {kind!r} in {timeout:g} s")
        got, value = self._ctl.recv()
        if got == "failed":
            raise LearnerProcessError(f"the learner process failed: {value}") from value
        if got != kind:
            raise LearnerProcessError(f"the learner process sent {got!r}, not {kind!r}")
        return value

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


class SharedWeights:
    """The learner's state dict in one shared uint8 buffer (torch shared memory, mapped by the
    learner process and the driver), as views of each entry's dtype and shape, under a
    cross-process lock: the process writes a whole optimiser step's weights, the driver reads a
    whole one."""

    ALIGN = 64

    def __init__(
        self, flat: Any, layout: list[tuple[str, int, str, tuple[int, ...]]], lock: Any
    ) -> None:
        import torch

        self.flat = flat
        self.layout = layout
        self.lock = lock
        self.views: dict[str, Any] = {}
        for name, offset, dtype, shape in layout:
            dt = getattr(torch, dtype)
            size = math.prod(shape) * torch.empty((), dtype=dt).element_size()
            self.views[name] = flat[offset : offset + size].view(dt).view(shape)

    @classmethod
    def for_state(cls, state: dict[str, Any], lock: Any) -> SharedWeights:
        """A buffer laid out for `state` (a model's state dict), in shared memory."""
        import torch

        layout: list[tuple[str, int, str, tuple[int, ...]]] = []
        offset = 0
        for name, tensor in state.items():
            layout.append((name, offset, str(tensor.dtype).removeprefix("torch."),
                           tuple(tensor.shape)))  # fmt: skip
            size = tensor.numel() * tensor.element_size()
            offset += -(-size // cls.ALIGN) * cls.ALIGN  # each view aligned for its dtype
        flat = torch.zeros(max(offset, 1), dtype=torch.uint8)
        flat.share_memory_()  # type: ignore[no-untyped-call]
        return cls(flat, layout, lock)

    def arrays(self) -> dict[str, Any]:
        """numpy views of the entries (read them under `lock`)."""
        return {name: view.numpy() for name, view in self.views.items()}


# -- the process -------------------------------------------------------------------------------


def _dumps(state: dict[str, Any]) -> bytes:
    """A learner state as plain pickle bytes. Sent as is, its tensors would go by torch's
    multiprocessing reductions, as shared memory that vanishes when the process that sent them
    exits (the final state is read after the learner process ends)."""
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


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
    while it waits up to WAIT_SECONDS for room in the learner queue). With the learner thread
    writing the pipe itself, a full pipe stopped the learner until the driver's wait ran out: 50
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
        self._messages: list[tuple[Any, ...]] = []
        self._closed = False
        self._sender = threading.Thread(target=self._send_loop, name="outbox", daemon=True)
        self._sender.start()

    def put(self, item: tuple[int, dict[str, float]]) -> None:
        # The schedules' clock: env steps trained, as the driver's counters count them.
        self.learner.global_timestep += item[0]
        with self._cond:
            self._updates.append(item)
            self._cond.notify()

    def send(self, message: tuple[Any, ...]) -> None:
        """Another message (stats, error, final), after the updates put before it."""
        with self._cond:
            self._messages.append(message)
            self._cond.notify()

    def put_nowait(self, record: logging.LogRecord) -> None:
        """A `logging.handlers.QueueHandler`'s queue: the process's log records go to the
        driver's logging, wherever that writes (the run's log, stderr), and nowhere else."""
        self.send(("log", record))

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
                    self.out.send(("updates", updates, version))
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
    spec: ImpalaJobSpec,
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
        thread = make_learner_thread(spec, obs_shape, actions, inqueue=reader)
        learner = thread.learner
        weights = SharedWeights.for_state(learner.model.state_dict(), weights_lock)
        ctl.send(("ready", {
            "device": str(learner.device),
            "autocast_dtype": learner.autocast_dtype,
            "weights_nbytes": learner.weights_nbytes(),
            "policy_version": publish(learner, weights),
            "shared": weights.flat,  # goes as shared memory (torch's reductions), not a copy
            "layout": weights.layout,
            "stats": thread.stats(),
            "queue_stats": thread.learner_queue_size.stats(),
        }))  # fmt: skip
    except BaseException as exc:
        ctl.send(("failed", _picklable(exc)))
        return
    outbox.learner, outbox.weights = learner, weights
    thread.outqueue = outbox  # type: ignore[assignment]
    _serve_requests(thread, learner, weights, outbox, ctl)


def _answer(learner: Any, weights: SharedWeights, request: tuple[Any, ...]) -> tuple[str, Any]:
    """A state for a checkpoint, or a checkpoint's state loaded; ("failed", why) instead of the
    process's death when that raises (a checkpoint of another model, say)."""
    try:
        if request[0] == "state":
            return "state", _dumps(learner.state_dict())
        learner.load_state_dict(pickle.loads(request[1]))
        return "loaded", publish(learner, weights)
    except Exception as exc:
        return "failed", _picklable(exc)


def _serve_requests(
    thread: Any, learner: Any, weights: SharedWeights, outbox: _Outbox, ctl: Connection
) -> None:
    last_stats = time.monotonic()
    try:
        while True:
            if ctl.poll(POLL_SECONDS):
                request = ctl.recv()
                if request[0] == "start":
                    learner.global_timestep = request[1]
                    thread.start()
                elif request[0] in ("state", "load"):
                    ctl.send(_answer(learner, weights, request))
                elif request[0] == "stop":
                    break
            if thread.is_alive() and time.monotonic() - last_stats >= STATS_SECONDS:
                last_stats = time.monotonic()
                outbox.send(("stats", thread.stats(), thread.learner_queue_size.stats()))
            if thread.error is not None:
                outbox.send(("error", _picklable(thread.error)))
                break
    except (EOFError, OSError):  # the driver is gone: nothing to report to
        thread.stop()
        return
    thread.stop()
    if thread.is_alive():
        thread.join()
    # The learner's state as it ends, for the driver's last checkpoint (after a failure too).
    final = _dumps(learner.state_dict())
    outbox.send(("final", final, thread.stats(), thread.learner_queue_size.stats()))
    outbox.close()
