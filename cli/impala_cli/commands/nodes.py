"""`impalajob rollout-node` / `aggregator-node` / `learner-node`: lend this pod to the learner's
Ray cluster.

The node offers the custom resource `rollout: N` (N = --workers-per-pod, the job's
`spec.rollouts.workersPerPod`) or `aggregator: N`; the driver's membership loop (membership.py)
sees it within a couple of seconds and places one actor per unit. A learner node (ranks 1..N-1
of `spec.learner.replicas`) offers `learner: 1`, where the driver's LearnerGroup places one
learner; it never rejoins another head: a new learner attempt has learner pods of its own.
The process stays up for the pod's lifetime:

* SIGTERM (scale-down, pod deletion): forwarded to `ray start` alone, which marks the node draining
  in the GCS; the driver stops sending the node's actors new work, uses the fragments they still
  have in flight and then releases them, the raylet goes idle and exits, and so do we (exit 0).
* Head lost (learner pod restarted): the GCS port stops answering or our raylet exits. We stop
  what is left of the node and rejoin as soon as the new head is up (its raylet registered in
  its GCS), without anyone restarting this pod.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from impala_cli.commands import CommandError
from impala_trainer.node.ray_node import (
    NodeConfig,
    RayNodeProcess,
    add_node_arguments,
    apply_ray_env,
    head_ready,
    port_open,
    split_address,
    wait_until,
)

JOIN_JITTER_S = 3.0
ROLE_BY_COMMAND = {
    "rollout-node": "rollout",
    "aggregator-node": "aggregator",
    "learner-node": "learner",
}


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", required=True, help="learner GCS, HOST:PORT")
    parser.add_argument(
        "--workers-per-pod",
        type=int,
        default=1,
        help="actors this node hosts (units of its resource; spec.rollouts.workersPerPod)",
    )
    # What operators before 0.1.0's restructuring rendered into the rollout Deployments.
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds a SIGTERMed node waits for the driver to collect its in-flight fragments",
    )
    parser.add_argument(
        "--head-lost-after",
        type=float,
        default=5.0,
        help="seconds the head's GCS may be unreachable before this node restarts and rejoins",
    )
    parser.add_argument(
        "--rejoin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="rejoin a restarted head (default) instead of exiting",
    )
    parser.add_argument("--log-file", type=Path, default=None, help="Ray's output (default: ours)")
    add_node_arguments(parser)


def _say(msg: str) -> None:
    print(f"impalajob node: {msg}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    role = ROLE_BY_COMMAND[args.command]
    if args.workers_per_pod < 1:
        raise CommandError(f"--workers-per-pod must be >= 1, got {args.workers_per_pod}")
    if role == "learner":
        # One learner per pod, and bound to the head it first joined: the learner group it
        # belongs to is that attempt's (a new head brings new learner pods).
        args.workers_per_pod, args.rejoin = 1, False
    host, port = split_address(args.address)
    cfg = NodeConfig.from_args(
        args,
        head=False,
        address=args.address,
        resources={role: float(args.workers_per_pod)},
    )
    if cfg.num_cpus is None:
        # Actors ask for 0 CPUs (they are placed by the custom resource); the CPU count only
        # sizes Ray's worker pool: about one process per actor.
        cfg.num_cpus = args.workers_per_pod
    apply_ray_env(args.drain_timeout)  # our own GCS queries use the nodes' auth settings
    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    joins = 0
    while not stopping.is_set():
        _say(f"waiting for the learner's Ray head at {host}:{port}")
        if not wait_until(
            lambda: port_open(host, port) and head_ready(args.address),
            float("inf"),
            stopping.is_set,
        ):
            break
        # Every pod of the job sees a new head at the same moment: spread their Ray start-ups,
        # which are CPU-heavy, instead of starting them all at once.
        if stopping.wait(random.uniform(0.0, JOIN_JITTER_S)):
            break
        node = RayNodeProcess(cfg, log_path=args.log_file, drain_timeout_s=args.drain_timeout)
        node.start()
        joins += 1
        _say(f"joining as a {role} node offering {role}={args.workers_per_pod} (attempt {joins})")
        outcome = _watch(node, host, port, args.head_lost_after, stopping)
        if outcome == "stop":
            _say("SIGTERM: draining; the driver collects in-flight fragments first")
            rc = node.drain(args.drain_timeout + 15.0)
            _say(f"node stopped (ray start exit code {rc})")
            return 0
        _say(f"{outcome}; {'rejoining' if args.rejoin else 'exiting'}")
        if not args.rejoin:
            return 1
        stopping.wait(1.0)
    return 0


def _watch(
    node: RayNodeProcess, host: str, port: int, head_lost_after: float, stopping: threading.Event
) -> str:
    """Block until we are told to stop ("stop") or the node is gone / cut off from the head."""
    unreachable_since: float | None = None
    while not stopping.wait(1.0):
        if not node.alive():
            node.kill()  # reap whatever of the node is left in its process group
            return f"the Ray node exited (code {node.proc.returncode if node.proc else None})"
        if port_open(host, port):
            unreachable_since = None
            continue
        now = time.monotonic()
        unreachable_since = unreachable_since or now
        if now - unreachable_since >= head_lost_after:
            node.kill()
            return f"the learner's GCS at {host}:{port} is gone"
    return "stop"
