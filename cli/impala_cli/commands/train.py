"""`impalajob train -f FILE`: train locally from an ImpalaJob manifest on an embedded Ray.

Exit codes: 0 when a stop criterion is met; 2 for an invalid manifest or arguments (before Ray
starts); 1 when training fails (the reason is printed on one line); 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from impala_api.spec import ImpalaJob
    from impala_trainer.driver.base import DriverResult
    from impala_trainer.rundir.remote import Mirror
    from impala_trainer.rundir.stats import RunStats
    from impala_trainer.rundir.writer import RunDir

from impala_api.roles import LOCAL_EXECUTABLE, STATUS_PORT, status_command
from impala_cli.commands import (
    EXIT_STOPPED,
    CommandError,
    add_manifest_arguments,
    add_resume_argument,
    load_job,
    mirror_run,
    stopping,
)
from impala_cli.commands.population_run import SHARED_RAY_ENV


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def register(parser: argparse.ArgumentParser) -> None:
    add_manifest_arguments(parser)
    parser.add_argument(
        "--run-dir", type=Path, default=None, help="run directory (default: runs/<job name>)"
    )
    add_resume_argument(parser)
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a previous run in the run directory"
    )
    parser.add_argument(
        "--num-rollout-workers",
        type=_positive,
        metavar="N",
        help="rollout actors (default: rollouts replicas x workersPerPod)",
    )
    parser.add_argument(
        "--num-aggregator-workers",
        type=_non_negative,
        metavar="N",
        help="aggregator actors (default: aggregators replicas)",
    )
    parser.add_argument(
        "--dashboard",
        action="store_true",
        help="also serve the run directory with the status server",
    )
    parser.add_argument(
        "--status-port",
        type=_positive,
        default=STATUS_PORT,
        help=f"the status server's port with --dashboard (default {STATUS_PORT})",
    )


def _start_dashboard(run_dir: Path, port: int) -> subprocess.Popen[bytes]:
    # The status server is its own process: it must not share the driver's GIL, and it is
    # exactly what the status sidecar runs on a cluster.
    cmd = status_command(
        str(run_dir), status_port=port, host="127.0.0.1", executable=LOCAL_EXECUTABLE
    )
    print(f"dashboard: http://127.0.0.1:{port}/ (log: {run_dir / 'status-server.log'})", flush=True)
    with open(run_dir / "status-server.log", "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def _init_ray(num_rollout: int, num_aggregator: int, num_learners: int) -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    shared = os.environ.get(SHARED_RAY_ENV)
    if shared:  # a member of a local population: the population's Ray has every member's units
        ray.init(address=shared, logging_level=logging.ERROR, log_to_driver=False)
        return

    # address="local": always a Ray of our own. Without it ray.init joins the cluster named by
    # RAY_ADDRESS or by the address file the last `ray start` left in Ray's temp dir, even a
    # stopped one, and then refuses num_cpus ("When connecting to an existing cluster ...").
    ray.init(
        address="local",
        num_cpus=os.cpu_count() or 1,
        # learner.replicas above 1: every learner is an actor on a unit of "learner".
        resources={
            "rollout": num_rollout,
            "aggregator": num_aggregator,
            "learner": num_learners if num_learners > 1 else 0,
        },
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
    )


def _check_gpus(job: ImpalaJob) -> None:
    """Refuse learner GPUs this machine does not have: the learner would fail on its first
    CUDA call, and a second learner would wait for a GPU until the group's rendezvous times out."""
    import ray

    learner = job.spec.learner
    need = learner.gpus * learner.replicas
    have = int(ray.cluster_resources().get("GPU", 0))
    if need > have:
        asked = f"learner.gpus {learner.gpus}" + (
            f" x learner.replicas {learner.replicas}" if learner.replicas > 1 else ""
        )
        fits = have // learner.replicas
        fix = "--set learner.gpus=0 trains on the CPU"
        if fits:
            fix = f"--set learner.gpus={fits} fits it, or fewer learner.replicas; {fix}"
        raise CommandError(
            f"{asked} asks for {need} GPU{'s' * (need > 1)}; this machine has {have or 'none'}: "
            f"{fix}"
        )


def _shutdown_ray() -> None:
    import ray

    # ray.shutdown stops the GCS, then the autoscaler monitor (a local Ray has nothing to scale),
    # whose SIGTERM handler reports to the stopped GCS until Ray kills it a second later: 1.0 of
    # the 1.2-1.4 s each local run spent in ray.shutdown (timed around it). Stopped
    # first, the monitor goes at once. Node.kill_monitor is Ray's own, not public: without it,
    # the shutdown is a second longer, no worse.
    node = getattr(ray._private.worker, "_global_node", None)
    with contextlib.suppress(Exception):
        if node is not None and not os.environ.get(SHARED_RAY_ENV):
            node.kill_monitor(check_alive=False)
    ray.shutdown()


def _open_run_dir(
    job: ImpalaJob, args: argparse.Namespace, chosen: list[str]
) -> tuple[RunDir, Mirror | None, bool]:
    """The run directory prepared for this run, its storageUri mirror, and whether it resumes."""
    from impala_trainer.rundir.checkpoint import list_checkpoints
    from impala_trainer.rundir.writer import RunDir

    run_dir = RunDir(args.run_dir or Path("runs") / job.name)
    # Before the local look: `--resume` on another machine continues from storageUri.
    mirror = mirror_run(job, run_dir, resume=args.resume, overwrite=args.overwrite)
    resume = args.resume and bool(list_checkpoints(run_dir.checkpoints))
    if run_dir.has_previous_run() and not resume:
        if not (args.overwrite or args.resume):  # --resume with nothing to resume: fresh run
            raise CommandError(
                f"{run_dir.path} already holds a run; pass --resume to continue it, "
                "--overwrite to replace it, or --run-dir for a new directory"
            )
        run_dir.clear()
    run_dir.prepare(job, chosen)
    run_dir.log_to_file()
    for line in chosen:
        print(f"[{job.name}] set for this env: {line}", flush=True)
    return run_dir, mirror, resume


STOP_GRACE_SECONDS = 60.0
"""How long a signalled local run may take for its final checkpoint and summary; with a
storageUri, as long again as the last upload may take (`Mirror.close`)."""


def run(args: argparse.Namespace) -> int:
    from impala_api.manifest import ManifestError, load_population, manifest_kind

    try:
        kind = manifest_kind(args.file)
    except ManifestError as err:
        raise CommandError(str(err)) from None
    if kind == "ImpalaPopulation":
        try:
            population = load_population(args.file, args.set)
        except ManifestError as err:
            raise CommandError(str(err)) from None
        from impala_cli.commands.population_run import run_population

        stopping.install(STOP_GRACE_SECONDS)
        return run_population(population, args)
    job, chosen = load_job(args)
    # From here on a signal stops the run, also while Ray and the actors are still starting.
    upload = 0.0
    if job.spec.checkpoint.storage_uri:
        from impala_trainer.rundir.remote import CLOSE_TIMEOUT_SECONDS as upload
    stopping.install(STOP_GRACE_SECONDS + upload)
    try:
        return _run(job, chosen, args)
    except KeyboardInterrupt:  # before the driver took over: nothing to checkpoint yet
        stopping.kill_descendants()
        print(f"{job.name}: stopped before training started", file=sys.stderr, flush=True)
        return EXIT_STOPPED


def _run(job: ImpalaJob, chosen: list[str], args: argparse.Namespace) -> int:
    spec = job.spec
    num_rollout = args.num_rollout_workers or max(
        1, spec.rollouts.initial_replicas * spec.rollouts.workers_per_pod
    )
    num_aggregator = (
        spec.aggregators.initial_replicas
        if args.num_aggregator_workers is None
        else args.num_aggregator_workers
    )

    from impala_trainer.node.allocator import keep_freed_memory

    run_dir, mirror, resume = _open_run_dir(job, args, chosen)
    # Before any thread starts: the learner's large per-update tensors reuse freed memory.
    keep_freed_memory()
    # A learner process's imports happen in the forkserver it is forked from, beside Ray's
    # start-up rather than after it (learners/forkserver.py).
    from impala_trainer.learners import forkserver

    forkserver.start_early(spec)

    # Import torch and the trainer (seconds) while Ray starts its processes (more seconds).
    # Ray must start on the main thread: its processes die with the thread that spawned them.
    warm = threading.Thread(target=importlib.import_module, args=("impala_trainer.driver.impala",))
    warm.start()
    with stopping.ray_starting():
        _init_ray(num_rollout, num_aggregator, spec.learner.replicas)
    try:
        _check_gpus(job)
    except CommandError:
        _shutdown_ray()
        raise
    warm.join()
    from impala_trainer.node.cpus import local_learner_threads, set_learner_threads

    set_learner_threads(
        *local_learner_threads(num_rollout + num_aggregator, learners=spec.learner.replicas)
    )

    from impala_cli.commands.progress import ProgressReporter
    from impala_trainer.driver.launch import Wiring, train
    from impala_trainer.driver.ray_backend import RayBackend

    dashboard = _start_dashboard(run_dir.path, args.status_port) if args.dashboard else None
    reporter = ProgressReporter(job.name)
    try:
        wiring = Wiring(
            rollout_workers=num_rollout,
            aggregator_workers=num_aggregator,
            resume=resume,
            on_report=reporter.update,
            mirror=mirror,
        )
        result, summary = train(job, run_dir, RayBackend(), wiring)
    finally:
        reporter.close()
        if dashboard is not None:
            dashboard.terminate()
            dashboard.wait(timeout=10)
        _shutdown_ray()
    return _report(job, run_dir, result, summary)


def _report(job: ImpalaJob, run_dir: RunDir, result: DriverResult, summary: RunStats) -> int:
    """The run's outcome on the terminal, as its exit status."""
    if result.phase == "Succeeded":
        ret = summary.return_mean
        print(
            f"{job.name}: {result.stopped_by} reached after "
            f"{summary.counters.num_env_steps_sampled:,} env steps "
            f"in {summary.wall_seconds():.1f} s"
            + ("" if ret is None else f" (mean return {ret:.1f})")
            + f"; run directory {run_dir.path}"
        )
        return result.exit_code
    if result.phase == "Stopped":  # interrupted: checkpointed, not an error
        print(f"{job.name}: stopped; `--resume` continues from {run_dir.path}", file=sys.stderr)
        return result.exit_code
    raise CommandError(f"training {result.phase.lower()}: {result.message}", result.exit_code)
