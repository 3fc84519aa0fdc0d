"""Train batches to the learner process through shared-memory slots, not pickled through a pipe.

Through a multiprocessing queue alone, the driver's feeder thread would pickle each batch (a
Pong batch's 250 frames of 4x84x84 are 7 MB) and write it through a 64 KiB pipe, and the learner
thread would read and unpickle it before it could train: on the learner-only CNN, 9 ms of every
update's 42 in the learner thread, with the copies competing for the cores as well
(bench/learner_only.py --set learner.process=separate).

Here the driver copies a batch's large arrays once, into a free slot of one shared buffer, and
sends the slot's number and layout (and the batch's small fields) through the queue. The learner
process makes numpy views of the slot: no copy, no unpickling. A slot is free again when the
learner has dropped every view of it (its model inputs included): a finalizer on the slot's
buffer object marks it free and posts a semaphore the driver waits on. So a batch held for
numSgdIter passes, or by a loader thread waiting for a tower stack, keeps its slot; while no
slot is free, `put` raises `queue.Full`, as a full queue does.

The buffer is made when the first batch with large arrays is put, sized from it with room to spare;
a field that does not fit a slot (a batch with many more truncated episodes' final observations,
say) is pickled with the message instead.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import math
import queue
import threading
import time
import weakref
from typing import Any

import numpy as np

from impala_trainer.batches import TrainBatch

logger = logging.getLogger(__name__)

MIN_SLOT_BYTES = 16 * 1024
"""Arrays smaller than this go pickled with the message: a CartPole batch's are all smaller, and
pickling them costs less than a slot's bookkeeping."""
SLOT_HEADROOM = 1.25
"""A slot's size over the first batch's large arrays: later batches' final observations vary."""
ALIGN = 64
_FREE, _TAKEN = 0, 1


def slot_count(learner_queue_size: int, held_by_learner: int) -> int:
    """Slots for a full queue, the batches the learner thread holds (minibatch buffer, loader
    threads), one being written and one being read: fewer and the learner could wait for a
    batch the driver cannot place."""
    return learner_queue_size + held_by_learner + 2


class SlotQueue:
    """The driver's end: `put`/`put_nowait` as a `queue.Queue`'s, `qsize`."""

    def __init__(self, ctx: Any, maxsize: int, count: int) -> None:
        self.queue: Any = ctx.Queue(maxsize=maxsize)
        # A message still in the queue's pipe when the run ends is not worth waiting for.
        self.queue.cancel_join_thread()
        self.count = count
        self.states: Any = ctx.RawArray("B", count)  # _FREE / _TAKEN per slot
        self.free: Any = ctx.Semaphore(count)
        self.slot_bytes = 0
        self.flat: Any = None  # made with the first batch that has large arrays
        self._announced = False  # the learner process has been sent `flat`
        self.oversized_fields = 0

    def reader_args(self) -> tuple[Any, Any, Any]:
        """What the learner process's `SlotReader` is built from (passed at its spawn)."""
        return self.queue, self.states, self.free

    def qsize(self) -> int:
        return int(self.queue.qsize())

    def put_nowait(self, batch: TrainBatch) -> None:
        self.put(batch, block=False)

    def put(self, batch: TrainBatch, block: bool = True, timeout: float | None = None) -> None:
        large = _large_fields(batch)
        if not large:
            self.queue.put((None, [], batch, None), block, timeout)
            return
        if self.flat is None:
            self._make_slots(large)
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self.free.acquire(block, timeout):
            raise queue.Full
        index = next(i for i in range(self.count) if self.states[i] == _FREE)
        self.states[index] = _TAKEN
        try:
            layout, rest = self._write(index, batch, large)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            # The buffer itself rides along until a message has carried it (torch sends its
            # shared memory, not a copy).
            slots = None if self._announced else (self.flat, self.slot_bytes)
            self.queue.put((index, layout, rest, slots), block, left)
            self._announced = True
        except BaseException:
            self.states[index] = _FREE
            self.free.release()
            raise

    def _make_slots(self, large: list[tuple[str, np.ndarray]]) -> None:
        import torch

        needed = sum(_aligned(a.nbytes) for _, a in large)
        self.slot_bytes = _aligned(math.ceil(needed * SLOT_HEADROOM))
        self.flat = torch.zeros(self.count * self.slot_bytes, dtype=torch.uint8)
        self.flat.share_memory_()
        # /dev/shm holds them (in a pod, its memory-backed emptyDir, counted as the pod's memory).
        logger.info(
            "batches to the learner process through %d shared-memory slots of %.1f MiB",
            self.count, self.slot_bytes / 2**20,
        )  # fmt: skip

    def _write(
        self, index: int, batch: TrainBatch, large: list[tuple[str, np.ndarray]]
    ) -> tuple[list[tuple[str, int, str, tuple[int, ...]]], dict[str, Any]]:
        slot = self.flat.numpy()[index * self.slot_bytes : (index + 1) * self.slot_bytes]
        layout: list[tuple[str, int, str, tuple[int, ...]]] = []
        in_slot: set[str] = set()
        offset = 0
        for name, array in large:
            if offset + array.nbytes > self.slot_bytes:
                self.oversized_fields += 1
                continue  # pickled with the rest
            view = slot[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape)
            np.copyto(view, array)  # numpy drops the GIL for the copy
            layout.append((name, offset, array.dtype.str, array.shape))
            in_slot.add(name)
            offset += _aligned(array.nbytes)
        rest = {
            f.name: getattr(batch, f.name)
            for f in dataclasses.fields(batch)
            if f.name not in in_slot
        }
        return layout, rest


class SlotReader:
    """The learner process's end: `get(timeout)` as a `queue.Queue`'s, batches as slot views."""

    def __init__(self, messages: Any, states: Any, free: Any) -> None:
        self.queue = messages
        self.states = states
        self.free = free
        self.flat: Any = None
        self.slot_bytes = 0
        # Loader threads (the multi-GPU thread's) get concurrently, and a queue unpickles after
        # it lets the next reader in: the message carrying the buffer may still be unpickling
        # in one thread while another holds the next batch.
        self._mapped = threading.Event()

    def qsize(self) -> int:
        return int(self.queue.qsize())

    def get(self, block: bool = True, timeout: float | None = None) -> TrainBatch:
        index, layout, rest, slots = self.queue.get(block, timeout)
        if slots is not None:
            self.flat, self.slot_bytes = slots
            self._mapped.set()
        if index is None:
            batch: TrainBatch = rest
            return batch
        self._mapped.wait()
        fields: dict[str, Any] = {**rest, **self._views(index, layout)}
        return TrainBatch(**fields)

    def _views(
        self, index: int, layout: list[tuple[str, int, str, tuple[int, ...]]]
    ) -> dict[str, np.ndarray]:
        start = self.flat.data_ptr() + index * self.slot_bytes
        # One buffer object per batch, the base of all its arrays (and of torch.from_numpy's
        # tensors of them): when the last of them goes, the slot is free.
        lease = (ctypes.c_uint8 * self.slot_bytes).from_address(start)
        done = weakref.finalize(lease, _release, self.states, self.free, index)
        done.atexit = False
        buffer = memoryview(lease)  # holds the lease
        return {
            name: np.frombuffer(buffer, np.dtype(dtype), math.prod(shape), offset).reshape(shape)
            for name, offset, dtype, shape in layout
        }


def _release(states: Any, free: Any, index: int) -> None:
    # A finalizer runs wherever the last view is dropped: no Python locks here, only a byte
    # store and a semaphore post.
    states[index] = _FREE
    free.release()


def _large_fields(batch: TrainBatch) -> list[tuple[str, np.ndarray]]:
    return [
        (f.name, value)
        for f in dataclasses.fields(batch)
        if isinstance(value := getattr(batch, f.name), np.ndarray)
        and value.dtype != object
        and value.nbytes >= MIN_SLOT_BYTES
    ]


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN
