"""The rollout-only ceiling (inference + env, learning off) and pipeline efficiency.

The same 2 rollout workers as cartpole_throughput.py sample with fixed weights and no learner:
ours are the project's RolloutActors driven by the driver's sampling loop (fragments fetched,
then dropped); RLlib's are its EnvRunners driven by IMPALA's own sampling call
(`foreach_env_runner_async_fetch_ready("sample")`, episodes fetched, then dropped). Pipeline
efficiency = the CartPole throughput run's steps/s / this ceiling, per side, using
bench/results/cartpole_throughput.json (run that first, or pass --throughput).

    python bench/rollout_ceiling.py                      # 3 alternating rounds of 60 s
    python bench/rollout_ceiling.py --seconds 20 --runs 1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from common import (
    RESULTS_DIR,
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


def trial(args: argparse.Namespace) -> dict[str, Any]:
    spec = load_spec(args.manifest, args.overrides).spec
    seed = args.seed + args.trial_index
    if args.trial == "ours":
        from ours_side import sample_only

        return sample_only(spec, args.seconds, seed=seed, process_start=args.trial_started)
    if args.trial == "rllib_old":
        from rllib_side import train

        return train(
            spec,
            args.seconds,
            seed=seed,
            stack="old",
            sample_only=True,
            process_start=args.trial_started,
        )
    from rllib_side import sample_only as rllib_sample_only

    return rllib_sample_only(spec, args.seconds, seed=seed, process_start=args.trial_started)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trial_args(parser)
    parser.add_argument("--seconds", type=float, default=60.0, help="sampling window per run")
    parser.add_argument("--warmup", type=float, default=None, help="seconds left out at the start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--manifest", default="cartpole", help="manifests/examples/NAME.yaml")
    parser.add_argument(
        "--throughput",
        type=Path,
        default=RESULTS_DIR / "cartpole_throughput.json",
        help="cartpole_throughput results to compute pipeline efficiency from",
    )
    args = parser.parse_args(argv)
    if is_child(args):
        write_trial(args, trial(args))
        exit_child()
    warmup = args.warmup if args.warmup is not None else min(10.0, args.seconds / 4)
    info = machine_info()
    trials = alternate(Path(__file__), args, argv, timeout=args.seconds + 300)
    pipeline: dict[str, Any] = {}
    if args.throughput.exists():
        pipeline = json.loads(args.throughput.read_text())["summary"]
    summary: dict[str, Any] = {"seconds": args.seconds, "warmup": warmup}
    rows = []
    for side, ts in trials.items():
        rates = [steady_rate(t["points"], warmup) for t in ts if "points" in t]
        ceiling = median(rates)
        trained = pipeline.get(side, {}).get("per_s")
        eff = ratio(trained, ceiling)
        summary[side] = {
            "ceiling_steps_per_s": ceiling,
            "pipeline_steps_per_s": trained,
            "efficiency": eff,
            "runs": [None if r is None else round(r, 1) for r in rates],
        }
        rows.append([side, ceiling, trained, None if eff is None else f"{100 * eff:.0f}%"])
    for side in trials:
        if side != "ours":
            summary[f"ceiling_ratio_vs_{side}"] = ratio(
                summary.get("ours", {}).get("ceiling_steps_per_s"),
                summary[side]["ceiling_steps_per_s"],
            )
    print(table(["side", "ceiling steps/s", "pipeline steps/s", "pipeline efficiency"], rows))
    report("rollout_ceiling", summary, trials, info, args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
