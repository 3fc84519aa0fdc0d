"""Wall time and env steps until CartPole-v1's 100-episode mean return reaches 450.

Ours and RLlib's IMPALA alternate over seeds 0, 1, 2 (one seed per round, the same seed for both
sides), each run capped at --cap seconds of training (a run that does not get there is a miss).
Time is measured on the trial process's clock from launch (Python, Ray, actors, everything a user
waits for) and, separately, on each side's own training clock. Writes the return-vs-wall-time
plot to docs/img/cartpole_return.png.

    python bench/cartpole_time_to_return.py              # 3 seeds, 400 s cap
    python bench/cartpole_time_to_return.py --runs 1 --cap 60
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import (
    MANIFESTS,
    REPO,
    add_trial_args,
    alternate,
    exit_child,
    first_crossing,
    is_child,
    load_spec,
    machine_info,
    median,
    ratio,
    report,
    table,
    write_trial,
)

MANIFEST = "cartpole"
PLOT = REPO / "docs" / "img" / "cartpole_return.png"


def trial(args: argparse.Namespace) -> dict[str, Any]:
    seed = args.seed + args.trial_index
    if args.trial == "ours":
        from ours_side import train

        with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
            result = train(
                MANIFESTS / f"{MANIFEST}.yaml",
                args.overrides,
                args.cap,
                stop_return=args.threshold,
                seed=seed,
                process_start=args.trial_started,
                run_dir=Path(tmp) / "run",
            )
    else:
        from rllib_side import train as rllib_train

        spec = load_spec(MANIFEST, args.overrides).spec
        stack = "old" if args.trial == "rllib_old" else "new"
        result = rllib_train(
            spec,
            args.cap,
            stop_return=args.threshold,
            seed=seed,
            stack=stack,
            process_start=args.trial_started,
        )
    result["seed"] = seed
    return result


def _median_with_misses(values: list[float | None]) -> float | None:
    """Median where a miss (None) counts as infinitely slow; None if the median is a miss."""
    if not values:
        return None
    m = median([math.inf if v is None else v for v in values])
    return None if m is None or math.isinf(m) else m


def summarise(trials: dict[str, list[dict[str, Any]]], threshold: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side, ts in trials.items():
        runs = []
        for t in ts:
            hit = first_crossing(t.get("points", []), threshold)
            runs.append(
                {
                    "seed": t.get("seed"),
                    "reached": hit is not None,
                    "seconds": None if hit is None else hit[0],
                    "train_seconds": None if hit is None else hit[1],
                    "env_steps": None if hit is None else hit[2],
                    "error": t.get("error"),
                }
            )
        out[side] = {
            "seconds": _median_with_misses([r["seconds"] for r in runs]),
            "train_seconds": _median_with_misses([r["train_seconds"] for r in runs]),
            "env_steps": _median_with_misses([r["env_steps"] for r in runs]),
            "misses": sum(not r["reached"] for r in runs),
            "runs": runs,
        }
    for side in trials:
        if side != "ours":
            out[f"time_ratio_vs_{side}"] = ratio(
                out.get("ours", {}).get("seconds"), out[side]["seconds"]
            )
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trial_args(parser)
    parser.add_argument("--cap", type=float, default=400.0, help="training seconds per run")
    parser.add_argument("--threshold", type=float, default=450.0, help="100-episode mean return")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first round")
    parser.add_argument("--plot", type=Path, default=PLOT, help="PNG of return vs wall time")
    args = parser.parse_args(argv)
    if is_child(args):
        write_trial(args, trial(args))
        exit_child()
    info = machine_info()
    trials = alternate(Path(__file__), args, argv, timeout=args.cap + 400)
    summary = summarise(trials, args.threshold)
    summary.update(threshold=args.threshold, cap=args.cap)
    rows = []
    for side in trials:
        s = summary[side]
        per_seed = " ".join(f"{r['seconds']:.0f}s" if r["reached"] else "miss" for r in s["runs"])
        rows.append(
            [
                side,
                s["seconds"],
                s["train_seconds"],
                s["env_steps"],
                f"{len(s['runs']) - s['misses']}/{len(s['runs'])}",
                per_seed,
                summary.get(f"time_ratio_vs_{side}"),
            ]
        )
    headers = ["side", "s to 450", "train s", "env steps", "reached", "per seed", "ours/side"]
    print(table(headers, rows))
    from plots import plot_return_curves

    plot_return_curves(trials, args.threshold, args.plot, "CartPole-v1: 100-episode mean return")
    print(f"plot: {args.plot.relative_to(REPO) if args.plot.is_relative_to(REPO) else args.plot}")
    report("cartpole_time_to_return", summary, trials, info, args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
