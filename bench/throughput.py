"""Fixed-window training throughput, ours vs RLlib's IMPALA (the CartPole and Pong scripts').

Both sides train the same manifest (RLlib through common.rllib_config) for a fixed window; the
rate is the steady rate after a warm-up, on the same clock for both (common.steady_rate).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from common import (
    add_trial_args,
    alternate,
    exit_child,
    is_child,
    load_spec,
    machine_info,
    manifest_path,
    median,
    ratio,
    report,
    steady_rate,
    table,
    write_trial,
)


def trial(args: argparse.Namespace, manifest: str) -> dict[str, Any]:
    """One side's run in this (child) process."""
    seed = args.seed + args.trial_index
    if args.trial == "ours":
        from ours_side import train

        with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
            return train(
                manifest_path(manifest),
                args.overrides,
                args.seconds,
                stop_return=None,
                seed=seed,
                process_start=args.trial_started,
                run_dir=Path(tmp) / "run",
            )
    from rllib_side import train as rllib_train

    spec = load_spec(manifest, args.overrides).spec
    stack = "old" if args.trial == "rllib_old" else "new"
    return rllib_train(spec, args.seconds, seed=seed, stack=stack, process_start=args.trial_started)


def summarise(
    trials: dict[str, list[dict[str, Any]]], warmup: float, scale: float = 1.0
) -> dict[str, Any]:
    """Median steady rate (x scale, e.g. frames per env step) per side and ours / each peer."""
    out: dict[str, Any] = {}
    for side, ts in trials.items():
        rates = [steady_rate(t["points"], warmup) for t in ts if "points" in t]
        trained = [steady_rate(t["points"], warmup, column=3) for t in ts if "points" in t]
        rates = [None if r is None else r * scale for r in rates]
        out[side] = {
            "per_s": median(rates),
            "trained_per_s": median(None if r is None else r * scale for r in trained),
            "runs": [None if r is None else round(r, 1) for r in rates],
            "errors": [t["error"] for t in ts if "error" in t],
        }
    for side in trials:
        if side != "ours":
            out[f"ratio_vs_{side}"] = ratio(out.get("ours", {}).get("per_s"), out[side]["per_s"])
    return out


def main(
    argv: list[str],
    *,
    scenario: str,
    manifest: str,
    description: str,
    default_seconds: float,
    unit: str,
    scale_of: Any = None,
) -> int:
    """Parse, run the alternating trials (or be one), print the table and the JSON line.

    `scale_of(spec)` turns env steps into the reported unit (Pong: frames = steps x frameSkip).
    """
    parser = argparse.ArgumentParser(description=description)
    add_trial_args(parser)
    parser.add_argument("--seconds", type=float, default=default_seconds, help="window per run")
    parser.add_argument("--warmup", type=float, default=None, help="seconds left out at the start")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first round")
    args = parser.parse_args(argv)
    if is_child(args):
        write_trial(args, trial(args, manifest))
        exit_child()
    warmup = args.warmup if args.warmup is not None else min(10.0, args.seconds / 4)
    scale = 1.0 if scale_of is None else float(scale_of(load_spec(manifest, args.overrides).spec))
    info = machine_info()
    trials = alternate(Path(__file__).parent / f"{scenario}.py", args, argv, args.seconds + 400)
    summary = summarise(trials, warmup, scale)
    summary.update(seconds=args.seconds, warmup=warmup, unit=unit, scale=scale)
    rows = [
        [
            side,
            summary[side]["per_s"],
            summary[side]["trained_per_s"],
            " ".join(str(r) for r in summary[side]["runs"]),
            summary.get(f"ratio_vs_{side}"),
        ]
        for side in trials
    ]
    print(table(["side", f"{unit}/s", f"trained {unit}/s", "runs", "ours/side"], rows))
    report(scenario, summary, trials, info, args, argv)
    return 0
