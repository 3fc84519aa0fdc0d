"""Multi-pod throughput: env steps/s with 1, 2 and 4 rollout pods, ours vs RLlib.

ours: the learner pod and N rollout pods as local processes, each running exactly the command
line `roles.role_command` renders for its pod (harness/multipod_cluster.py, the harness of the
tests/integration/test_multipod_* tests too), so every fragment crosses Ray nodes as on a
cluster. status.json is polled every second once all N rollout actors are healthy; the rate is
common.steady_rate over the window after the warm-up.
rllib: RLlib's IMPALA (new API stack, common.rllib_config) with N EnvRunners on one embedded Ray,
same manifest (manifests/examples/cartpole.yaml, or --manifest): same envs per worker,
fragment, batch, model. Both sides share this machine's cores; every process of ours runs at
nice 10 (the test harness's setting), RLlib's at the caller's priority.

Ours also reports where the CPU went in the window: CPU ms per 1,000 env steps of the learner
pod's process tree (driver, learner thread, Ray's own processes there) and of the rollout pods'
(psutil, at the window's two ends), so the learner's share says how many rollout pods one
learner feeds before it is the bottleneck.

    python bench/multipod_scaling.py                              # 1, 2, 4 pods; 1 round, 60 s
    python bench/multipod_scaling.py --counts 1,2 --seconds 30 --runs 2
    python bench/multipod_scaling.py --manifest pong --sides ours --seconds 90
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    REPO,
    add_trial_args,
    alternate,
    exit_child,
    is_child,
    load_spec,
    machine_info,
    median,
    ratio,
    report,
    steady_rate,
    table,
    write_trial,
)

# The multi-pod harness is the shared harness package's (harness/, the tests' too), imported from
# the repository root.
sys.path.insert(0, str(REPO))

STARTUP_TIMEOUT_S = 900.0


def _tree_cpu(pid: int) -> float:
    """CPU seconds of process `pid` and everything under it (0 for what has gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _cpu_by_role(local: Any) -> dict[str, float]:
    """CPU seconds so far of the learner pod's process tree and of all rollout pods' together."""
    out = {"learner": 0.0, "rollouts": 0.0}
    for name, proc in local.procs.items():
        out["learner" if name == "learner" else "rollouts"] += _tree_cpu(proc.pid)
    return out


def _spec_overrides(args: argparse.Namespace, pods: int) -> list[str]:
    return [
        *args.overrides,
        f"rollouts.maxReplicas={max(4, pods)}",
        f"rollouts.replicas={pods}",
        "rollouts.workersPerPod=1",
        # Neither side may stop early: the window decides.
        "stop.episodeReturnMean=null",
        f"stop.timeLimitSeconds={STARTUP_TIMEOUT_S + args.warmup + args.seconds + 300}",
    ]


def ours(args: argparse.Namespace, pods: int) -> dict[str, Any]:
    """Learner + `pods` rollout pods as local processes; points from polled status.json."""
    from harness.multipod_cluster import LocalJob, healthy

    job = load_spec(args.manifest, _spec_overrides(args, pods))
    manifest = job.model_dump(mode="json", by_alias=True, exclude={"status"})
    points: list[list[float | None]] = []
    with tempfile.TemporaryDirectory(prefix="bench-multipod-") as tmp:
        local = LocalJob(Path(tmp), manifest, slots=pods + 1)
        try:
            local.start("learner", "learner", resume=False)
            for i in range(pods):
                local.start(f"rollout-{i}", "rollout")
            started = time.time()
            local.wait_for(
                f"{pods} rollout actors",
                lambda s: len(healthy(s)) == pods,
                timeout=STARTUP_TIMEOUT_S,
            )
            startup_s = time.time() - started
            t0 = time.time()
            cpu: list[tuple[float, dict[str, float]]] = []  # (env steps, CPU by role)
            while time.time() - t0 < args.warmup + args.seconds:
                if not cpu and time.time() - t0 >= args.warmup and points:
                    cpu.append((points[-1][2] or 0.0, _cpu_by_role(local)))
                s = local.status()
                if s is not None:
                    c = s["counters"]
                    now = time.time()
                    points.append(
                        [
                            round(now - args.trial_started, 3),
                            round(now - t0, 3),
                            float(c["num_env_steps_sampled"]),
                            float(c["num_env_steps_trained"]),
                            s.get("episode_return_mean"),
                        ]
                    )
                time.sleep(1.0)
            final = local.status() or {}
            if cpu and points:
                cpu.append((points[-1][2] or 0.0, _cpu_by_role(local)))
        finally:
            local.close()
    cpu_ms: dict[str, float] = {}
    if len(cpu) == 2 and cpu[1][0] > cpu[0][0]:
        steps = cpu[1][0] - cpu[0][0]
        for role in ("learner", "rollouts"):
            cpu_ms[role] = round((cpu[1][1][role] - cpu[0][1][role]) * 1e6 / steps, 1)
    return {
        "points": points,
        "cpu_ms_per_1k_steps": cpu_ms,
        "startup_s": round(startup_s, 1),
        "rollout_nodes": final.get("membership", {}).get("rollout_nodes"),
    }


def trial(args: argparse.Namespace) -> dict[str, Any]:
    pods = args.pods
    if args.trial == "ours":
        return ours(args, pods)
    from rllib_side import train as rllib_train

    spec = load_spec(args.manifest, _spec_overrides(args, pods)).spec
    stack = "old" if args.trial == "rllib_old" else "new"
    return rllib_train(
        spec,
        args.warmup + args.seconds,
        seed=args.trial_index,
        stack=stack,
        process_start=args.trial_started,
    )


CPU_KEYS = ("learner_cpu_ms_per_1k", "rollouts_cpu_ms_per_1k", "learner_share")


def _cpu_medians(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Median CPU ms per 1,000 env steps by role over a side's trials, and the learner's share."""
    by_role = [t["cpu_ms_per_1k_steps"] for t in trials if t.get("cpu_ms_per_1k_steps")]
    if not by_role:
        return {}
    learner = median(r["learner"] for r in by_role)
    rollouts = median(r["rollouts"] for r in by_role)
    share = learner / (learner + rollouts) if learner is not None and rollouts else None
    return {
        "learner_cpu_ms_per_1k": learner,
        "rollouts_cpu_ms_per_1k": rollouts,
        "learner_share": None if share is None else round(share, 3),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trial_args(parser, runs=1)
    parser.add_argument("--counts", default="1,2,4", help="rollout pods per configuration")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window per run")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds left out first")
    parser.add_argument("--manifest", default="cartpole", help="manifests/examples/NAME.yaml")
    parser.add_argument("--pods", type=int, default=1, help=argparse.SUPPRESS)  # child only
    args = parser.parse_args(argv)
    if is_child(args):
        write_trial(args, trial(args))
        exit_child()
    info = machine_info()
    counts = [int(c) for c in args.counts.split(",") if c.strip()]
    summary: dict[str, Any] = {"seconds": args.seconds, "warmup": args.warmup, "by_pods": {}}
    all_trials: dict[str, Any] = {}
    rows = []
    for pods in counts:
        trials = alternate(
            Path(__file__),
            args,
            [*argv, "--pods", str(pods)],
            timeout=STARTUP_TIMEOUT_S + args.warmup + args.seconds + 300,
        )
        all_trials[str(pods)] = trials
        entry: dict[str, Any] = {}
        for side, ts in trials.items():
            rates = [steady_rate(t["points"], args.warmup) for t in ts if "points" in t]
            entry[side] = {
                "steps_per_s": median(rates),
                **_cpu_medians(ts),
                "runs": [None if r is None else round(r, 1) for r in rates],
                "errors": [t["error"] for t in ts if "error" in t],
            }
        ours_rate = entry.get("ours", {}).get("steps_per_s")
        for side in trials:
            if side != "ours":
                entry[f"ratio_vs_{side}"] = ratio(ours_rate, entry[side]["steps_per_s"])
        summary["by_pods"][str(pods)] = entry
        rows.append(
            [pods]
            + [entry[side]["steps_per_s"] for side in trials]
            + [entry.get(f"ratio_vs_{side}") for side in trials if side != "ours"]
        )
    base = summary["by_pods"].get(str(counts[0]), {}).get("ours", {}).get("steps_per_s")
    for pods in counts:
        rate = summary["by_pods"][str(pods)].get("ours", {}).get("steps_per_s")
        summary["by_pods"][str(pods)]["ours_speedup_vs_first"] = ratio(rate, base)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    headers = ["rollout pods", *[f"{s} steps/s" for s in sides]]
    headers += [f"ours/{s}" for s in sides if s != "ours"]
    print(table(headers, rows))
    cpu_rows = [
        [pods, *(summary["by_pods"][str(pods)].get("ours", {}).get(k) for k in CPU_KEYS)]
        for pods in counts
    ]
    print(table(["rollout pods", "learner CPU ms/1k", "rollouts CPU ms/1k", "learner share"],
                cpu_rows))  # fmt: skip
    scenario = "multipod_scaling" if args.manifest == "cartpole" else f"multipod_{args.manifest}"
    report(scenario, summary, all_trials, info, args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
