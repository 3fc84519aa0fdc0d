"""Wiring a driver for a run: its seed, backend, actor manager and (multi-pod) membership.

`impalajob train` runs a fixed number of actors on an embedded Ray; the learner pod's actors
follow the cluster's rollout and aggregator nodes. Both build their driver here and run it with
`train`, which also reports a driver that could not be built (an environment that cannot be made,
a learner that does not fit) as a failed run in the run directory, as a failure inside the loop is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from impala_api.snapshot import StatusSnapshot
from impala_api.spec import ImpalaJob
from impala_trainer.backend import Backend
from impala_trainer.driver.actor_manager import ActorManager
from impala_trainer.driver.base import Driver, DriverResult, one_line, resolve_seed
from impala_trainer.driver.membership import ElasticActorManager, ElasticMembership
from impala_trainer.rundir.remote import Mirror
from impala_trainer.rundir.stats import RunStats
from impala_trainer.rundir.writer import RunDir

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wiring:
    """How a run's driver is put together (everything but the job, run directory and backend)."""

    elastic: bool = False
    """The actors follow the cluster's nodes (the learner pod); otherwise fixed counts."""
    rollout_workers: int = 0
    aggregator_workers: int = 0
    resume: bool = False
    """Continue from the newest checkpoint in the run directory, when there is one."""
    on_report: Callable[[StatusSnapshot], None] | None = None
    """Called with every snapshot the driver writes (the console progress)."""
    mirror: Mirror | None = None
    """Uploads the run directory to `checkpoint.storageUri`."""


def build_driver(
    job: ImpalaJob, run_dir: RunDir, backend: Backend, wiring: Wiring = Wiring()
) -> Driver:
    """The driver for the job's training mode, with its actor manager and membership."""
    seed = resolve_seed(job.spec.training.seed)
    manager: ActorManager
    membership = None
    if wiring.elastic:
        manager = ElasticActorManager(job.spec, seed, backend)
        membership = ElasticMembership(manager)
    else:
        manager = ActorManager(job.spec, seed, backend)
        manager.set_target("rollout", wiring.rollout_workers)
        manager.set_target("aggregator", wiring.aggregator_workers)
    collaborators = {
        "backend": backend,
        "manager": manager,
        "membership": membership,
        "resume": wiring.resume,
        "on_report": wiring.on_report,
        "mirror": wiring.mirror,
    }
    try:
        if job.spec.training.mode == "async-gradients":
            from impala_trainer.driver.async_gradients import AsyncGradientsDriver

            return AsyncGradientsDriver(job, run_dir, **collaborators)
        from impala_trainer.driver.impala import ImpalaDriver

        return ImpalaDriver(job, run_dir, **collaborators)
    except BaseException:  # the actors start in the constructor, before its learner is built
        manager.shutdown()
        raise


def train(
    job: ImpalaJob, run_dir: RunDir, backend: Backend, wiring: Wiring = Wiring()
) -> tuple[DriverResult, RunStats]:
    """Build the driver and run it: the result and the run's counters."""
    try:
        driver = build_driver(job, run_dir, backend, wiring)
    except KeyboardInterrupt:  # SIGTERM/SIGINT while the actors and the learner start
        return _unbuilt(job, run_dir, wiring, DriverResult("Stopped", None, "interrupted"))
    except Exception as exc:  # nothing ran: still a failed run with its reason, like the loop's
        logger.error("building the driver failed", exc_info=True)
        return _unbuilt(job, run_dir, wiring, DriverResult("Failed", None, one_line(exc)))
    return driver.run(), driver.stats


def _unbuilt(
    job: ImpalaJob, run_dir: RunDir, wiring: Wiring, result: DriverResult
) -> tuple[DriverResult, RunStats]:
    """A run that ended before its driver was built: its summary all the same."""
    stats = RunStats(job.name, job.spec.stop)
    run_dir.write_summary(stats.summary(result.phase, None, result.message))
    if wiring.mirror is not None:
        wiring.mirror.close()
    return result, stats
