"""`impalajob learner -f CONFIG --run-dir DIR`: the learner pod, Ray head plus IMPALA driver.

Starts the Ray head (`ray start --head --block` as a child, fixed ports so the job's NetworkPolicy
can name them, no rollout/aggregator resources: the head only learns), connects the driver to it
and runs exactly the driver, learner thread and run-directory writer `impalajob train` runs, with
one difference: the actors follow the cluster's membership (membership.py) instead of a fixed
count, so rollout and aggregator pods can join, drain and die while training goes on.

`--resume` continues from the newest checkpoint in DIR/checkpoints when there
is one: a restarted learner pod with a checkpoint volume picks up its counters and weights, and
the rollout pods rejoin the new head by themselves. Exit codes as `impalajob train`: 0 when a
stop criterion is met, 2 for a bad manifest, 1 when training fails, 130 when stopped (SIGTERM).
The Ray head is stopped on every exit path.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from impala_api.roles import DEFAULT_PORTS
from impala_cli.commands import (
    EXIT_FAILED,
    EXIT_STOPPED,
    CommandError,
    add_manifest_arguments,
    add_resume_argument,
    load_job,
    mirror_run,
    stopping,
)
from impala_trainer.node.ray_node import (
    NodeConfig,
    RayNodeProcess,
    add_node_arguments,
    apply_ray_env,
    port_open,
)

HEAD_ATTEMPTS = 3

if TYPE_CHECKING:
    from impala_api.spec import ImpalaJob
    from impala_trainer.rundir.remote import Mirror
    from impala_trainer.rundir.writer import RunDir


def register(parser: argparse.ArgumentParser) -> None:
    add_manifest_arguments(parser)
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory to write")
    add_resume_argument(parser)
    parser.add_argument(
        "--gcs-port", type=int, default=DEFAULT_PORTS.gcs, help="the Ray head's GCS port"
    )
    parser.add_argument(
        "--head-timeout", type=float, default=180.0, help="seconds to wait for the Ray head"
    )
    parser.add_argument("--log-file", type=Path, default=None, help="Ray's output (default: ours)")
    add_node_arguments(parser)


def run(args: argparse.Namespace) -> int:
    job, chosen = load_job(args)

    from impala_trainer.node.allocator import keep_freed_memory
    from impala_trainer.rundir.checkpoint import list_checkpoints
    from impala_trainer.rundir.writer import RunDir

    run_dir = RunDir(args.run_dir)
    # Before the local look: on a new pod the newest checkpoint may be only in storageUri.
    mirror = mirror_run(job, run_dir, resume=args.resume)
    resume = args.resume and bool(list_checkpoints(run_dir.checkpoints))
    if not resume and run_dir.has_previous_run():
        run_dir.clear()  # no --resume, or nothing to resume from: a fresh run
    run_dir.prepare(job, chosen)
    # The run's log on the claim beside its results, as a local run writes it, and in the pod's
    # log: the learner's device and precision, membership, checkpoints, warnings.
    run_dir.log_to_file(also_stderr=True)
    for line in chosen:
        logging.getLogger("impala_cli.learner").info("set for this env: %s", line)

    # Before any thread starts: the learner's large per-update tensors reuse freed memory.
    keep_freed_memory()
    # A learner process's imports happen in the forkserver it is forked from, beside Ray's
    # start-up rather than after it (learners/forkserver.py).
    from impala_trainer.learners import forkserver

    forkserver.start_early(job.spec)
    apply_ray_env()
    stopping.install()  # the kubelet's grace period bounds the stop
    # learner.replicas above 1: learner 0 is an actor on this pod's unit of "learner".
    learners = {"learner": 1.0} if job.spec.learner.replicas > 1 else {}
    cfg = NodeConfig.from_args(args, head=True, gcs_port=args.gcs_port, resources=learners)
    host = args.node_ip_address or "127.0.0.1"
    head: RayNodeProcess | None = None
    try:
        head = _start_head(cfg, host, args)
        if head is None:
            raise CommandError(
                f"the Ray head did not come up on {host}:{args.gcs_port}", EXIT_FAILED
            )
        return _train(job, run_dir, f"{host}:{args.gcs_port}", resume, mirror)
    except KeyboardInterrupt:
        return EXIT_STOPPED
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if head is not None:
            head.drain(20.0)


def _start_head(cfg: NodeConfig, host: str, args: argparse.Namespace) -> RayNodeProcess | None:
    """Start the head and connect this process as its driver; None after HEAD_ATTEMPTS tries.

    On a busy machine Ray's helper processes can miss their start-up deadlines and the head's
    raylet aborts; a fresh attempt usually gets through, so the pod need not restart for it.
    """
    for attempt in range(1, HEAD_ATTEMPTS + 1):
        head = RayNodeProcess(cfg, log_path=args.log_file, drain_timeout_s=1.0)
        head.start()
        try:
            if _connect(head, host, cfg.gcs_port, args.head_timeout):
                return head
        except BaseException:  # SIGTERM while starting: leave no orphaned head behind
            head.kill()
            raise
        print(f"learner: the Ray head failed to start (attempt {attempt})", file=sys.stderr)
        head.kill()
    return None


def _connect(head: RayNodeProcess, host: str, port: int, timeout: float) -> bool:
    import ray

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and head.alive():
        if port_open(host, port):
            try:
                with stopping.ray_starting():
                    ray.init(
                        address=f"{host}:{port}", logging_level=logging.ERROR, log_to_driver=False
                    )
                return True
            except (ConnectionError, RuntimeError) as err:  # head raylet not up (yet)
                ray.shutdown()
                print(f"learner: connecting to the Ray head: {err}", file=sys.stderr)
        time.sleep(2.0)
    return False


def _train(
    job: ImpalaJob, run_dir: RunDir, address: str, resume: bool, mirror: Mirror | None
) -> int:
    import ray

    from impala_cli.commands.progress import ProgressReporter
    from impala_trainer.driver.launch import Wiring, train
    from impala_trainer.driver.ray_backend import RayBackend
    from impala_trainer.node.cpus import pod_learner_threads, set_learner_threads

    # torch would size its team from the node's cores, whatever the pod reserved (node/cpus.py).
    set_learner_threads(*pod_learner_threads(job.spec.learner.resources))

    print(f"learner: driver connected to the Ray head at {address}", flush=True)
    reporter = ProgressReporter(job.name)
    try:
        wiring = Wiring(elastic=True, resume=resume, on_report=reporter.update, mirror=mirror)
        result, stats = train(job, run_dir, RayBackend(), wiring)
    finally:
        reporter.close()
        ray.shutdown()
    if result.phase == "Succeeded":
        print(
            f"{job.name}: {result.stopped_by} reached after "
            f"{stats.counters.num_env_steps_sampled:,} env steps in {stats.wall_seconds():.1f} s",
            flush=True,
        )
        return result.exit_code
    if result.phase == "Stopped":  # SIGTERM: checkpointed; a restarted pod resumes
        print(f"{job.name}: stopped ({result.message})", file=sys.stderr, flush=True)
        return result.exit_code
    raise CommandError(f"training {result.phase.lower()}: {result.message}", result.exit_code)
