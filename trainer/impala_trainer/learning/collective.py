"""One learner's place in a data-parallel group (learner.replicas): torch.distributed underneath.

DistributedDataParallel's semantics without its module wrapper: the learners start from rank 0's
weights (`broadcast`), and before each optimiser step every learner's gradients are replaced by
their mean over the group (`GradientReducer`: DDP's reducer, the parameters in buckets whose
all-reduce starts while backward is still computing the earlier layers' gradients). The learner
threads call both from their `Learner` (learner.py), so numSgdIter, the minibatch buffer and the
multi-GPU towers stay what they are: the towers' gradients are summed into the master's first,
then averaged across learners (all buckets at once: no overlap there).

The process group is built on its own (`ProcessGroupGloo`, `ProcessGroupNCCL` over a `TCPStore`)
instead of through `init_process_group`'s global default group: the same code then runs two
learners in one process (threads over a `HashStore`), which is how the unit tests prove the
equivalence with one learner without starting processes.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as _dist

# The stores and process groups are pybind classes that torch.distributed re-exports without
# declaring them (no __all__ entry): Any here, as Ray is at its boundary.
dist: Any = _dist

RENDEZVOUS_TIMEOUT_SECONDS = 300.0
"""Longest a learner waits for the others to join, and a collective for its peers: a learner
that never comes (its pod never scheduled, its node gone) fails the run instead of hanging it."""


BUCKET_BYTES = 1 << 20
"""A gradient bucket is closed once it holds this many bytes (DDP's first bucket is 1 MiB; its
later 25 MiB would make the Pong CNN's 2.7 MB one bucket, which cannot overlap anything). A
parameter is never split: the CNN's fully connected layer (2.65 MB) is a bucket of its own, whose
all-reduce runs while backward computes the convolutions' gradients."""


class GroupStopped(Exception):
    """A learner of the group is stopping: the step in progress is taken by none of them."""


@dataclass(frozen=True)
class Rendezvous:
    """Where the learners meet: rank 0's TCPStore, and how many they are."""

    host: str
    port: int
    world_size: int


def _gloo(store: Any, rank: int, world_size: int, host: str, timeout: datetime.timedelta) -> Any:
    # The device names the interface gloo's pairs listen on: the address the learners reach
    # each other by, not whatever the hostname resolves to (a pod's hostname may not resolve).
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(store, rank, world_size, options)


def rendezvous_store(
    rendezvous: Rendezvous, rank: int, timeout_seconds: float | None = None
) -> Any:
    """The store the group meets in: rank 0 serves a `TCPStore` on the rendezvous port, the
    others connect to it."""
    seconds = RENDEZVOUS_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
    return dist.TCPStore(
        rendezvous.host, rendezvous.port, rendezvous.world_size, rank == 0,
        timeout=datetime.timedelta(seconds=seconds), wait_for_workers=False,
    )  # fmt: skip


class Collective:
    """A learner's process group: its rank, the group's size, averaging and broadcasting."""

    def __init__(
        self, group: Any, rank: int, world_size: int, bucket_bytes: int = BUCKET_BYTES
    ) -> None:
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.bucket_bytes = bucket_bytes
        """The gradient buckets' size (`GradientReducer`)."""
        self.stopping = threading.Event()
        """Set when this learner is told to stop: its next all-reduce says so to every peer."""
        self.left = False
        """An all-reduce ended the group's training (`GroupStopped`): no more collectives."""

    @classmethod
    def join(
        cls,
        rendezvous: Rendezvous,
        rank: int,
        device: torch.device,
        *,
        local_host: str,
        store: Any = None,
        timeout_seconds: float | None = None,
        bucket_bytes: int = BUCKET_BYTES,
        prefix: str = "impala-learners",
    ) -> Collective:
        """Join the group (blocks until every rank has): NCCL for a CUDA learner, else gloo.

        `store`: an existing store (one the learner's other groups meet in, the tests'
        `HashStore`); otherwise `rendezvous_store`. `prefix`: the group's keys in the store
        (one group per prefix). `local_host`: this learner's address, which gloo's connections
        between learners use."""
        seconds = RENDEZVOUS_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
        timeout = datetime.timedelta(seconds=seconds)
        world = rendezvous.world_size
        if store is None:
            store = rendezvous_store(rendezvous, rank, seconds)
        else:
            store.set_timeout(timeout)
        store = dist.PrefixStore(prefix, store)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            group = dist.ProcessGroupNCCL(store, rank, world, options)
        else:
            group = _gloo(store, rank, world, local_host, timeout)
        return cls(group, rank, world, bucket_bytes)

    def stop_flag(self, like: torch.Tensor) -> torch.Tensor:
        """The element every all-reduce of gradients carries: 1 from a learner that is stopping."""
        return (torch.ones(1) if self.stopping.is_set() else torch.zeros(1)).to(like)

    def check_stop(self, flag: torch.Tensor) -> None:
        """After an all-reduce: any learner's 1 ends the group's training (`GroupStopped`)."""
        if float(flag) > 0:
            self.left = True
            raise GroupStopped

    def average(self, tensors: list[torch.Tensor]) -> None:
        """Replace each tensor (all on one device and dtype) by its mean over the group.

        One more element rides along: 1 from a learner that is stopping. Any learner's 1 makes
        every learner raise `GroupStopped` instead of taking the step, so all of them stop
        after the same step and none waits in an all-reduce that a stopped peer never joins."""
        if not tensors:
            return
        flat = torch.cat([*(t.reshape(-1) for t in tensors), self.stop_flag(tensors[0])])
        self.group.allreduce([flat]).wait()
        self.check_stop(flat[-1])
        flat.div_(self.world_size)
        _unflatten(flat[:-1], tensors)

    def broadcast(self, tensors: list[torch.Tensor], root: int = 0) -> None:
        """Give every rank `root`'s values of the tensors (in place), one message per dtype."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        options = dist.BroadcastOptions()
        options.rootRank = root
        for group in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in group])
            self.group.broadcast([flat], options).wait()
            _unflatten(flat, group)


class GradientReducer:
    """DDP's reducer for one learner's parameters: their gradients averaged over the group.

    The parameters go into buckets in reverse order (the order backward produces their
    gradients), each closed at the collective's `bucket_bytes`. While armed (`prepare`, before a
    backward pass), a gradient hook counts each parameter in; a bucket whose last gradient has
    arrived starts its all-reduce at once, so the late layers' communication runs beside the
    backward of the early ones. Buckets start strictly in order, the same on every learner, as
    gloo and NCCL match collectives by their order; `finish` starts whatever backward did not
    (every bucket, when nothing was armed: the multi-GPU learner's summed towers), waits, and
    writes the means back. The last bucket carries the stop flag (`Collective.stop_flag`).

    A parameter's gradient accumulates once per backward pass (its AccumulateGrad node runs
    once), also with a separate value optimiser's two passes over disjoint `inputs`; a parameter
    without a gradient this step counts as zeros at `finish`."""

    def __init__(self, collective: Collective, params: Sequence[torch.Tensor]) -> None:
        self.collective = collective
        self.params = list(params)
        self.buckets = plan_buckets(self.params, collective.bucket_bytes)
        """Indices into `params`, bucket by bucket in launch order."""
        self._bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket}
        self._armed = False
        self._missing: list[int] = []
        self._started: list[tuple[Any, torch.Tensor]] = []
        # The hooks reach the reducer weakly: the parameters outlive the group they left, and a
        # hook that held the reducer would hold its process group (and gloo's connections and
        # threads) for as long as the model lives.
        reducer = weakref.ref(self)
        for i, p in enumerate(self.params):
            if p.requires_grad:
                hook = functools.partial(_gradient_ready, reducer, i)
                p.register_post_accumulate_grad_hook(hook)  # type: ignore[no-untyped-call]

    def prepare(self) -> None:
        """Before a backward pass: its gradients start their buckets' all-reduce as they come."""
        self._reset()
        self._armed = True

    def _reset(self) -> None:
        self._armed = False
        self._missing = [len(bucket) for bucket in self.buckets]
        self._started = []

    def _ready(self, index: int, _param: torch.Tensor) -> None:
        if not self._armed:
            return
        self._missing[self._bucket_of[index]] -= 1
        # Not the last bucket: it carries the stop flag, read when the step's gradients are all in.
        while len(self._started) < len(self.buckets) - 1 and not self._missing[len(self._started)]:
            self._start(len(self._started))

    def _start(self, b: int) -> None:
        grads = [self._grad(i) for i in self.buckets[b]]
        parts = [g.reshape(-1) for g in grads]
        if b == len(self.buckets) - 1:
            parts.append(self.collective.stop_flag(grads[0]))
        flat = torch.cat(parts)
        self._started.append((self.collective.group.allreduce([flat]), flat))

    def _grad(self, i: int) -> torch.Tensor:
        p = self.params[i]
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        return p.grad

    def finish(self) -> None:
        """Every gradient replaced by its mean over the group (`GroupStopped` if a learner is
        stopping: then the gradients are left as they are and no step follows)."""
        if not self.buckets:
            return
        try:
            for b in range(len(self._started), len(self.buckets)):
                self._start(b)
            for work, _ in self._started:
                work.wait()
            flats = [flat for _, flat in self._started]
            self.collective.check_stop(flats[-1][-1])
            for bucket, flat in zip(self.buckets, flats, strict=True):
                flat.div_(self.collective.world_size)
                _unflatten(flat, [self._grad(i) for i in bucket])
        finally:
            self._reset()

    def leave(self) -> None:
        """A stopping learner's last all-reduce, made between steps (zero gradients, the stop
        flag set), which the peers' step in progress, or their own leaving, meets; once per
        learner."""
        if self.collective.left:
            return
        self.collective.stopping.set()
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self._reset()
        with contextlib.suppress(GroupStopped):
            self.finish()


def _gradient_ready(reducer: weakref.ref[GradientReducer], index: int, p: torch.Tensor) -> None:
    live = reducer()
    if live is not None:
        live._ready(index, p)


def plan_buckets(params: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """The parameters' indices in reverse order, cut into buckets of at least `bucket_bytes`
    (the last one smaller); a parameter is never split."""
    buckets: list[list[int]] = [[]]
    size = 0
    for i in reversed(range(len(params))):
        if size >= bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += params[i].numel() * params[i].element_size()
    return buckets if buckets[0] else []


def _unflatten(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n
