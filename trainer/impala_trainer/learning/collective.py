"""One learner's place in a data-parallel group (learner.replicas): torch.distributed underneath.

DistributedDataParallel's semantics without its module wrapper: the learners start from rank 0's
weights (`broadcast`), and before each optimiser step every learner's gradients are replaced by
their mean over the group (`average`: one all-reduce over a flat copy, as one DDP bucket). The
learner threads call both from their `Learner` (learner.py), so numSgdIter, the minibatch buffer
and the multi-GPU towers stay what they are: the towers' gradients are summed into the master's
first, then averaged across learners.

The process group is built on its own (`ProcessGroupGloo`, `ProcessGroupNCCL` over a `TCPStore`)
instead of through `init_process_group`'s global default group: the same code then runs two
learners in one process (threads over a `HashStore`), which is how the unit tests prove the
equivalence with one learner without starting processes.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
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


class Collective:
    """A learner's process group: its rank, the group's size, averaging and broadcasting."""

    def __init__(self, group: Any, rank: int, world_size: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = world_size
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
    ) -> Collective:
        """Join the group (blocks until every rank has): NCCL for a CUDA learner, else gloo.

        `store`: an existing store (the tests' `HashStore`); otherwise rank 0 serves a
        `TCPStore` on the rendezvous port and the others connect to it. `local_host`: this
        learner's address, which gloo's connections between learners use."""
        seconds = RENDEZVOUS_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
        timeout = datetime.timedelta(seconds=seconds)
        world = rendezvous.world_size
        if store is None:
            store = dist.TCPStore(
                rendezvous.host, rendezvous.port, world, rank == 0, timeout=timeout,
                wait_for_workers=False,
            )  # fmt: skip
        else:
            store.set_timeout(timeout)
        store = dist.PrefixStore("impala-learners", store)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            group = dist.ProcessGroupNCCL(store, rank, world, options)
        else:
            group = _gloo(store, rank, world, local_host, timeout)
        return cls(group, rank, world)

    def average(self, tensors: list[torch.Tensor]) -> None:
        """Replace each tensor (all on one device and dtype) by its mean over the group.

        One more element rides along: 1 from a learner that is stopping. Any learner's 1 makes
        every learner raise `GroupStopped` instead of taking the step, so all of them stop
        after the same step and none waits in an all-reduce that a stopped peer never joins."""
        if not tensors:
            return
        flag = torch.ones(1) if self.stopping.is_set() else torch.zeros(1)
        flat = torch.cat([*(t.reshape(-1) for t in tensors), flag.to(tensors[0])])
        self.group.allreduce([flat]).wait()
        if float(flat[-1]) > 0:
            self.left = True
            raise GroupStopped
        flat.div_(self.world_size)
        _unflatten(flat[:-1], tensors)

    def leave(self, shapes: Sequence[torch.Tensor]) -> None:
        """A stopping learner's last all-reduce, made between steps (zeros shaped as
        `shapes`, the stop flag set), which the peers' step in progress, or their own leaving,
        meets; once per learner."""
        if self.left:
            return
        self.stopping.set()
        with contextlib.suppress(GroupStopped):
            self.average([torch.zeros_like(t) for t in shapes])

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


def _unflatten(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n
