"""The process that learner processes are forked from (`learner.process: separate`).

A learner process needs the interpreter, torch and the learner's modules: ~1.5 CPU-s of imports.
A spawned learner process pays them after `ray.init`, on the two cores where the rollout actors
pay theirs (measured: the CartPole example then reaches 450 about a second later than with the
learner in the driver, timed from launch). multiprocessing's forkserver imports them once, in a
process of its own that holds no thread of Ray's or torch's (a fork copies no half-held lock
and no OpenMP pool). `start_early` starts it before Ray, so the imports overlap Ray's start-up;
each learner process is then a fork of it. Without `start_early`, the first learner process
starts the forkserver and waits for its imports.

This module imports no torch: the command calls it before anything heavy.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from impala_api.spec import ImpalaJobSpec

PRELOAD = ["impala_trainer.learners.child"]
"""What the forkserver imports before its first fork (the learner process's main: torch and the
learner thread classes)."""


def context() -> multiprocessing.context.ForkServerContext:
    """The multiprocessing context a learner process starts from."""
    ctx = multiprocessing.get_context("forkserver")
    # Takes effect when the forkserver starts (here or at the first learner process); a running
    # forkserver keeps what it imported.
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start_early(spec: ImpalaJobSpec) -> None:
    """For a job whose learner runs in a process of its own: start the forkserver now, importing
    torch and the learner there while this process does other work (Ray's start-up)."""
    if spec.learner.process != "separate":
        return
    context()
    multiprocessing.forkserver.ensure_running()
