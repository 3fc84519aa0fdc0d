"""`impalajob train -f FILE`: train locally from an ImpalaJob manifest on an embedded Ray.

Exit codes: 0 when a stop criterion is met; 2 for an invalid manifest or arguments (before Ray
starts); 1 when training fails (the reason is printed on one line); 130 when interrupted.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

from impala_trainer.job.manifest import ManifestError, load_manifest


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
    parser.add_argument("-f", "--file", required=True, help="ImpalaJob manifest (YAML)")
    parser.add_argument("--output", "-o", help="run directory (default: runs/<job name>)")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the run directory's latest checkpoint"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a previous run in the run directory"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field, e.g. training.lr=0.001 (repeatable)")
    parser.add_argument("--num-rollout-workers", type=_positive, metavar="N",
                        help="rollout actors (default: rollouts replicas x workersPerPod)")
    parser.add_argument("--num-aggregator-workers", type=_non_negative, metavar="N",
                        help="aggregator actors (default: aggregators replicas)")
    parser.add_argument("--dashboard", action="store_true",
                        help="also serve the run directory with the status server")
    parser.add_argument("--port", type=_positive, default=8080, help="dashboard port")


def _start_dashboard(run_dir: Path, port: int) -> subprocess.Popen[bytes] | None:
    # The status server is its own process: it must not share the driver's GIL, and it is
    # exactly what the status sidecar runs on a cluster.
    cmd = [sys.executable, "-m", "impala_trainer.cli", "status-server",
           "--run-dir", str(run_dir), "--host", "127.0.0.1", "--port", str(port)]
    print(f"dashboard: http://127.0.0.1:{port}/ (log: {run_dir / 'status-server.log'})", flush=True)
    with open(run_dir / "status-server.log", "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def _init_ray(num_rollout: int, num_aggregator: int) -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    ray.init(
        num_cpus=os.cpu_count() or 1,
        resources={"rollout": num_rollout, "aggregator": num_aggregator},
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
    )


def run(args: argparse.Namespace) -> int:
    try:
        job = load_manifest(args.file, args.set)
    except ManifestError as err:
        print(err, file=sys.stderr)
        return 2
    spec = job.spec
    num_rollout = args.num_rollout_workers or max(
        1, spec.rollouts.initial_replicas * spec.rollouts.workers_per_pod
    )
    num_aggregator = (
        spec.aggregators.initial_replicas
        if args.num_aggregator_workers is None
        else args.num_aggregator_workers
    )
    if not any(v is not None for v in spec.stop.model_dump().values()):
        print("error: spec.stop sets no criterion; add timesteps, episodeReturnMean or "
              "timeLimitSeconds", file=sys.stderr)
        return 2

    from impala_trainer.rollouts.envs import env_id_problem

    problem = env_id_problem(spec.env)
    if problem is not None:
        print(f"{args.file}: invalid ImpalaJob\n  spec.env.id: {problem}", file=sys.stderr)
        return 2

    from impala_trainer.node.allocator import keep_freed_memory
    from impala_trainer.rundir.writer import RunDir

    run_dir = RunDir(Path(args.output or Path("runs") / job.name))
    if run_dir.has_previous_run() and not args.resume:
        if not args.overwrite:
            print(f"error: {run_dir.path} already holds a run; pass --resume to continue it, "
                  "--overwrite to replace it, or --output for a new directory", file=sys.stderr)
            return 2
        run_dir.clear()
    run_dir.prepare(job)
    run_dir.log_to_file()
    # Before any thread starts: the learner's large per-update tensors reuse freed memory.
    keep_freed_memory()

    # Import torch and the trainer (seconds) while Ray starts its processes (more seconds).
    # Ray must start on the main thread: its processes die with the thread that spawned them.
    warm = threading.Thread(target=importlib.import_module, args=("impala_trainer.driver.impala",))
    warm.start()
    _init_ray(num_rollout, num_aggregator)
    warm.join()
    import torch

    # The actors share this machine: intra-op threads beyond the cores they leave free only
    # contend (a CartPole update is several times slower with 2 threads on a busy 2-core box).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) - num_rollout - num_aggregator))

    from impala_trainer.commands.progress import ProgressReporter
    from impala_trainer.driver.impala import make_driver

    dashboard = _start_dashboard(run_dir.path, args.port) if args.dashboard else None
    reporter = ProgressReporter(job.name)
    try:
        driver = make_driver(
            job,
            run_dir,
            num_rollout_workers=num_rollout,
            num_aggregator_workers=num_aggregator,
            resume=args.resume,
            on_report=reporter.update,
        )
        result = driver.run()
    finally:
        reporter.close()
        if dashboard is not None:
            dashboard.terminate()
            dashboard.wait(timeout=10)
        import ray

        ray.shutdown()
    summary = driver.stats
    if result.phase == "Succeeded":
        ret = summary.return_mean
        print(
            f"{job.name}: {result.stopped_by} reached after "
            f"{summary.counters.env_steps_sampled:,} env steps in {summary.wall_seconds():.1f} s"
            + ("" if ret is None else f" (mean return {ret:.1f})")
            + f"; run directory {run_dir.path}"
        )
    else:
        print(f"error: training {result.phase.lower()}: {result.message}", file=sys.stderr)
    return result.exit_code
