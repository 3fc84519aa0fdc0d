"""RLlib's MinibatchBuffer: replay each item from a queue `num_passes` times over `size` slots."""

from __future__ import annotations

from typing import Generic, NamedTuple, Protocol, TypeVar

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class ItemQueue(Protocol[T_co]):
    """Where the buffer takes its items: a `queue.Queue`, or a `multiprocessing` queue."""

    def get(self, block: bool = True, timeout: float | None = None) -> T_co: ...


class BufferItem(NamedTuple, Generic[T]):
    item: T
    first_pass: bool
    """True the first time this item is handed out (count its env steps once)."""
    released: bool
    """True on its last pass: the slot is free again (a tower stack can go back to idle)."""


class MinibatchBuffer(Generic[T]):
    """Round-robin over `size` slots; each slot hands out its item `num_passes` times.

    With size 2 and 2 passes, items A, B come out as A, B, A, B: consecutive updates see
    different batches, which is the point of a buffer larger than one.
    """

    def __init__(
        self,
        inqueue: ItemQueue[T],
        size: int,
        timeout: float | None,
        num_passes: int,
    ) -> None:
        if size < 1 or num_passes < 1:
            raise ValueError(f"size ({size}) and num_passes ({num_passes}) must be >= 1")
        self.inqueue = inqueue
        self.size = size
        self.timeout = timeout
        # RLlib can ramp the passes up from an init_num_passes that IMPALA never sets: every
        # item gets all its passes here.
        self.num_passes = num_passes
        self.buffers: list[T | None] = [None] * size
        self.ttl = [0] * size
        self.idx = 0

    def get(self, timeout: float | None = None) -> BufferItem[T]:
        """The next item; raises queue.Empty when a slot needs a fresh item and none comes
        within `timeout` (default: the buffer's timeout)."""
        first_pass = False
        if self.ttl[self.idx] <= 0:
            wait = self.timeout if timeout is None else timeout
            self.buffers[self.idx] = self.inqueue.get(timeout=wait)
            self.ttl[self.idx] = self.num_passes
            first_pass = True
        item = self.buffers[self.idx]
        self.ttl[self.idx] -= 1
        released = self.ttl[self.idx] <= 0
        if released:
            self.buffers[self.idx] = None
        self.idx = (self.idx + 1) % self.size
        return BufferItem(item, first_pass, released)  # type: ignore[arg-type]
