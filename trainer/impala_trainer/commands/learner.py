"""`impalajob learner -f CONFIG --run-dir DIR`: the learner pod, Ray head plus IMPALA driver.

Starts the Ray head (`ray start --head --block` as a child, fixed ports so the job's NetworkPolicy
can name them, no rollout/aggregator resources: the head only learns), connects the driver to it
and runs exactly the driver, learner thread and run-directory writer `impalajob train` runs, with
one difference: the actors follow the cluster's membership (membership.py) instead of a fixed
count, so rollout and aggregator pods can join, drain and die while training goes on.

`--resume` (or `--resume auto`) continues from the newest checkpoint in DIR/checkpoints when there
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
from types import FrameType
from typing import TYPE_CHECKING

from impala_trainer.job.manifest import ManifestError, load_manifest
from impala_trainer.job.roles import DEFAULT_PORTS
from impala_trainer.node.ray_node import (
    NodeConfig,
    RayNodeProcess,
    add_node_arguments,
    apply_ray_env,
    port_open,
)

HEAD_ATTEMPTS = 3

if TYPE_CHECKING:
    from impala_trainer.job.spec import ImpalaJob
    from impala_trainer.rundir.writer import RunDir


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--file", required=True, help="ImpalaJob manifest (YAML)")
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory to write")
    parser.add_argument(
        "--resume",
        nargs="?",
        const="auto",
        default="never",
        choices=["auto", "never"],
        help="auto: continue from the newest checkpoint in the run directory if there is one",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a field"
    )
    parser.add_argument(
        "--port", "--ray-port", dest="port", type=int, default=DEFAULT_PORTS.gcs, help="GCS port"
    )
    parser.add_argument(
        "--head-timeout", type=float, default=180.0, help="seconds to wait for the Ray head"
    )
    parser.add_argument("--log-file", type=Path, default=None, help="Ray's output (default: ours)")
    add_node_arguments(parser)


def _stop_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    # The driver treats KeyboardInterrupt as "stopped": it checkpoints and writes the summary.
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    try:
        job = load_manifest(args.file, args.set)
    except ManifestError as err:
        print(err, file=sys.stderr)
        return 2
    if not any(v is not None for v in job.spec.stop.model_dump().values()):
        print("error: spec.stop sets no criterion", file=sys.stderr)
        return 2

    from impala_trainer.node.allocator import keep_freed_memory
    from impala_trainer.rundir.checkpoint import list_checkpoints
    from impala_trainer.rundir.writer import RunDir

    run_dir = RunDir(args.run_dir)
    resume = args.resume == "auto" and bool(list_checkpoints(run_dir.checkpoints))
    if not resume and run_dir.has_previous_run():
        run_dir.clear()  # --resume never, or nothing to resume from: a fresh run
    run_dir.prepare(job)

    # Before any thread starts: the learner's large per-update tensors reuse freed memory.
    keep_freed_memory()
    apply_ray_env()
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    cfg = NodeConfig.from_args(args, head=True, gcs_port=args.port, resources={})
    host = args.node_ip_address or "127.0.0.1"
    head: RayNodeProcess | None = None
    try:
        head = _start_head(cfg, host, args)
        if head is None:
            print(f"error: the Ray head did not come up on {host}:{args.port}", file=sys.stderr)
            return 1
        return _train(job, run_dir, f"{host}:{args.port}", resume)
    except KeyboardInterrupt:
        return 130
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
                ray.init(address=f"{host}:{port}", logging_level=logging.ERROR, log_to_driver=False)
                return True
            except (ConnectionError, RuntimeError) as err:  # head raylet not up (yet)
                ray.shutdown()
                print(f"learner: connecting to the Ray head: {err}", file=sys.stderr)
        time.sleep(2.0)
    return False


def _train(job: ImpalaJob, run_dir: RunDir, address: str, resume: bool) -> int:
    import ray

    from impala_trainer.commands.progress import ProgressReporter
    from impala_trainer.driver.impala import make_driver
    from impala_trainer.driver.membership import ElasticActorManager, ElasticMembership

    # ray.init installs its own SIGTERM handler (exit at once); ours lets the driver checkpoint.
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    print(f"learner: driver connected to the Ray head at {address}", flush=True)
    reporter = ProgressReporter(job.name)
    try:
        driver = make_driver(
            job,
            run_dir,
            num_rollout_workers=0,
            num_aggregator_workers=0,
            resume=resume,
            on_report=reporter.update,
        )
        manager = ElasticActorManager(driver.spec, driver.seed)
        driver.manager = manager
        driver.membership = ElasticMembership(manager)
        result = driver.run()
    finally:
        reporter.close()
        ray.shutdown()
    stats = driver.stats
    if result.phase == "Succeeded":
        print(
            f"{job.name}: {result.stopped_by} reached after "
            f"{stats.counters.env_steps_sampled:,} env steps in {stats.wall_seconds():.1f} s",
            flush=True,
        )
    else:
        print(f"error: training {result.phase.lower()}: {result.message}", file=sys.stderr)
    return result.exit_code
