"""Where the CPU goes: CPU milliseconds per 1,000 env steps, per component, ours vs RLlib.

Wall-clock rates on a shared 2-core machine move with everyone else's load; CPU time per env
step barely does. So this is the profile that bounds throughput: with C cores, a pipeline whose
components burn X CPU-seconds per env step cannot exceed C / X steps/s, and the rollout-only
ceiling's share of X bounds the pipeline efficiency.

A monitor thread inside each trial process samples, once a second, the CPU times of every thread
of the trial process (driver loop, learner thread, ...) and of every process under it (Ray's
workers: rollout actors / EnvRunners, RLlib's Learner actor, raylet, GCS, ...), classified by
command line. The steady window (after the warm-up) is cut from those samples and divided by the
env steps sampled in it.

    python bench/cpu_budget.py --seconds 60 --runs 1
    python bench/cpu_budget.py --manifest pong --seconds 120

`--attach PID --run-dir DIR` profiles a run already going (a long `impalajob train`, e.g. the Pong
run to 18) instead of starting one: the train process and every process under it, with the env
steps read from the run directory's status.json at both ends of the window.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from common import (
    add_trial_args,
    alternate,
    exit_child,
    is_child,
    machine_info,
    report,
    table,
    write_trial,
)

CORES = psutil.cpu_count() or 2


def _component(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    if cmd.startswith("ray::"):  # Ray titles an actor's process ray::Class.method
        actor = cmd.split()[0][5:].split(".")[0]
        if actor in ("RolloutActor", "SingleAgentEnvRunner", "MultiAgentEnvRunner"):
            return "rollout actors"
        if "Learner" in actor:
            return "learner actor"
        if actor in ("IDLE", ""):
            return "ray idle workers"
        return f"ray actor {actor}"
    # learner.process: separate: forked from multiprocessing's forkserver (whose command line
    # it keeps, as the idle server does), or spawned.
    if "multiprocessing.forkserver" in cmd or "multiprocessing.spawn" in cmd:
        return "learner process"
    for key in ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "runtime_env"):
        if key in cmd:
            return "ray system"
    if "default_worker" in cmd:
        return "ray workers (untitled)"
    return "other: " + cmd[:40]


class Monitor(threading.Thread):
    """Cumulative CPU seconds by component, sampled once a second."""

    def __init__(self) -> None:
        super().__init__(name="cpu-monitor", daemon=True)
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._halt = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        self._threads: dict[str, float] = {}
        """Each thread's last cumulative CPU time, by component and thread id."""

    def snapshot(self) -> dict[str, float]:
        me = psutil.Process()
        names = {t.native_id: t.name for t in threading.enumerate()}
        for th in me.threads():
            name = names.get(th.id, "native threads")
            if name == "MainThread":
                name = "driver main thread"
            elif name.startswith("learner"):
                name = "learner thread"
            elif name != "native threads":
                name = "other python threads"
            # Kept under its id and carried over once it has exited, as processes are below: a
            # thread that ends before the window's last sample (the learner thread, stopped
            # before the run's final history line) keeps its CPU time in the window.
            self._threads[f"{name}#t{th.id}"] = th.user_time + th.system_time
        out = dict(self._threads)
        for child in me.children(recursive=True):
            proc = self._procs.setdefault(child.pid, child)
            try:
                cpu = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            # Each process's cumulative time is kept under its pid, so a process that exits
            # mid-window cannot make a component's total go backwards.
            out[f"{_component(proc)}#{child.pid}"] = cpu.user + cpu.system
        return out

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append((time.time(), self.snapshot()))
            self._halt.wait(1.0)

    def stop(self) -> list[tuple[float, dict[str, float]]]:
        self._halt.set()
        self.join(timeout=5)
        return self.samples


def _steps_at(points: list[list[Any]], t: float) -> float | None:
    """Env steps sampled at process-clock time t (linear between curve points)."""
    for a, b in itertools.pairwise(points):
        if a[0] <= t <= b[0]:
            if b[0] == a[0]:
                return float(b[2])
            return a[2] + (b[2] - a[2]) * (t - a[0]) / (b[0] - a[0])
    return None


def _window_budget(
    s0: dict[str, float], s1: dict[str, float], steps: float, seconds: float
) -> dict[str, Any]:
    """CPU ms per 1,000 env steps by component between two samples `seconds` apart."""
    per: dict[str, float] = {}
    for key, v1 in s1.items():
        comp = key.split("#", 1)[0]
        per[comp] = per.get(comp, 0.0) + max(0.0, v1 - s0.get(key, 0.0))
    ms_per_k = {k: round(1e6 * v / steps, 2) for k, v in sorted(per.items()) if v > 0}
    total = sum(ms_per_k.values())
    return {
        "window_s": round(seconds, 1),
        "env_steps": round(steps),
        "steps_per_s": round(steps / seconds, 1),
        "cpu_ms_per_1k_steps": ms_per_k,
        "total_cpu_ms_per_1k_steps": round(total, 2),
        "cpu_bound_steps_per_s": round(CORES * 1e6 / total, 1) if total else None,
        "cores_used": round(sum(per.values()) / seconds, 2),
    }


def budget(
    samples: list[tuple[float, dict[str, float]]],
    points: list[list[Any]],
    process_start: float,
    warmup: float,
) -> dict[str, Any]:
    """CPU ms per 1,000 env steps by component over the steady window."""
    started = [p for p in points if (p[2] or 0) > 0]
    if not started:
        return {"error": "no env steps"}
    t_from = process_start + started[0][0] + warmup
    t_to = process_start + points[-1][0]
    window = [(t, s) for t, s in samples if t_from <= t <= t_to]
    if len(window) < 2:
        return {"error": "window too short"}
    (t0, s0), (t1, s1) = window[0], window[-1]
    steps0, steps1 = _steps_at(points, t0 - process_start), _steps_at(points, t1 - process_start)
    if steps0 is None or steps1 is None or steps1 <= steps0:
        return {"error": "no steps in window"}
    steps = steps1 - steps0
    return _window_budget(s0, s1, steps, t1 - t0)


def _sampled(run_dir: Path) -> int:
    counters = json.loads((run_dir / "status.json").read_text())["counters"]
    return int(counters.get("num_env_steps_sampled", counters.get("env_steps_sampled", 0)))


def attached(pid: int, run_dir: Path, seconds: float) -> dict[str, Any]:
    """CPU ms per 1,000 env steps of a running train process tree over `seconds`."""
    root = psutil.Process(pid)

    def snapshot() -> dict[str, float]:
        # From outside, the train process's threads have no Python names: driver loop, learner
        # thread and torch's threads are one component here.
        cpu = root.cpu_times()
        out = {f"train process (driver + learner)#{pid}": cpu.user + cpu.system}
        for child in root.children(recursive=True):
            try:
                c = child.cpu_times()
                out[f"{_component(child)}#{child.pid}"] = c.user + c.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return out

    t0, s0, steps0 = time.time(), snapshot(), _sampled(run_dir)
    time.sleep(seconds)
    t1, s1, steps1 = time.time(), snapshot(), _sampled(run_dir)
    steps = steps1 - steps0
    if steps <= 0:
        return {"error": "no env steps in the window"}
    return _window_budget(s0, s1, steps, t1 - t0)


def trial(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    from common import load_spec, manifest_path

    monitor = Monitor()
    monitor.start()
    seed = args.seed + args.trial_index
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        if args.trial == "ours":
            from ours_side import train

            if args.ours_torch_threads:  # an ablation: the learner's intra-op threads
                import torch

                torch.set_num_threads(args.ours_torch_threads)

            result = train(
                manifest_path(args.manifest),
                args.overrides,
                args.seconds,
                stop_return=None,
                seed=seed,
                process_start=args.trial_started,
                run_dir=Path(tmp) / "run",
            )
        else:
            from rllib_side import train as rllib_train

            spec = load_spec(args.manifest, args.overrides).spec
            stack = "old" if args.trial == "rllib_old" else "new"
            result = rllib_train(
                spec, args.seconds, seed=seed, stack=stack, process_start=args.trial_started
            )
    samples = monitor.stop()
    return {
        "budget": budget(samples, result["points"], args.trial_started, args.warmup),
        "points": result["points"],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trial_args(parser, runs=1)
    parser.add_argument("--seconds", type=float, default=60.0, help="training window per run")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds left out at the start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--manifest", default="cartpole", help="manifests/examples/NAME.yaml")
    parser.add_argument(
        "--ours-torch-threads",
        type=int,
        default=0,
        help="ablation: torch.set_num_threads in our driver process (0: leave the default)",
    )
    parser.add_argument("--attach", type=int, help="PID of a running `impalajob train` to profile")
    parser.add_argument("--run-dir", type=Path, help="that run's --run-dir (with --attach)")
    args = parser.parse_args(argv)
    if args.attach:
        if args.run_dir is None:
            parser.error("--attach needs --run-dir")
        b = attached(args.attach, args.run_dir, args.seconds)
        rows = [[c, v] for c, v in b.get("cpu_ms_per_1k_steps", {}).items()]
        rows += [["TOTAL CPU ms / 1k steps", b.get("total_cpu_ms_per_1k_steps")],
                 ["cores busy", b.get("cores_used")], ["measured steps/s", b.get("steps_per_s")],
                 [f"CPU bound ({CORES} cores)", b.get("cpu_bound_steps_per_s")]]
        print(table(["component (CPU ms per 1k env steps)", "attached run"], rows))
        print(json.dumps(b))
        return 0 if "error" not in b else 1
    if is_child(args):
        write_trial(args, trial(args))
        exit_child()
    info = machine_info()
    trials = alternate(Path(__file__), args, argv, timeout=args.seconds + 400)
    summary: dict[str, Any] = {"manifest": args.manifest, "seconds": args.seconds}
    comps: list[str] = []
    for side, ts in trials.items():
        b = ts[-1].get("budget", {"error": ts[-1].get("error")})
        summary[side] = b
        comps += [c for c in b.get("cpu_ms_per_1k_steps", {}) if c not in comps]
    sides = list(trials)
    rows = [[c, *(summary[s].get("cpu_ms_per_1k_steps", {}).get(c) for s in sides)] for c in comps]
    rows.append(
        ["TOTAL CPU ms / 1k steps", *(summary[s].get("total_cpu_ms_per_1k_steps") for s in sides)]
    )
    rows.append(["cores busy", *(summary[s].get("cores_used") for s in sides)])
    rows.append(["measured steps/s", *(summary[s].get("steps_per_s") for s in sides)])
    rows.append(
        [f"CPU bound ({CORES} cores)", *(summary[s].get("cpu_bound_steps_per_s") for s in sides)]
    )
    print(table(["component (CPU ms per 1k env steps)", *sides], rows))
    report(f"cpu_budget_{args.manifest}", summary, trials, info, args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
