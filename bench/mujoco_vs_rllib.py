"""MuJoCo continuous control side by side: a bare manifest of ours against RLlib's APPO and IMPALA
on the same env, seeds and machine, compared at equal env steps.

Ours runs `manifests/examples/halfcheetah.yaml` with its env id replaced (`--env`): nothing
tuned, the Box space's defaults (a squashed Gaussian, the clipped surrogate). RLlib runs the
same sizes (EnvRunners x envs, fragment length, batch, lr, gamma, coefficients, layers: the
spec's, through `common.rllib_config`) on its new API stack with its own defaults for a Box
action (a Gaussian whose log-std the network outputs, actions normalised into the bounds);
APPO with the surrogate clip ours resolves (0.3), IMPALA with V-trace's policy gradient.

Each run stops at --steps env steps or --cap seconds of training, whichever comes first. The
return is the 100-episode mean; the table gives it at env step marks (the first curve point
at or past each), the seconds of training each side took to reach the marks, and its env
steps per second.

    python bench/mujoco_vs_rllib.py --env HalfCheetah-v5           # 1 seed, 2M env steps
    python bench/mujoco_vs_rllib.py --env Hopper-v5 --steps 1000000 --sides ours,rllib
    python bench/mujoco_vs_rllib.py --env Hopper-v5 --replot   # the figure from the last results

The figure (return against env steps and against training time) goes to
docs/img/mujoco_<env>.png.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import (
    MANIFESTS,
    REPO,
    RESULTS_DIR,
    add_trial_args,
    alternate,
    exit_child,
    is_child,
    load_spec,
    machine_info,
    median,
    point_at_steps,
    report,
    table,
    write_trial,
)

MANIFEST = "halfcheetah"
ALGOS = {"rllib": "appo", "rllib_old": "impala"}
"""RLlib's side by trial name: "rllib" is APPO, "rllib_old" IMPALA (both on the new stack)."""
RANDOM_RETURNS = {"HalfCheetah-v5": -283.0, "Hopper-v5": 18.4}
"""The mean return of 100 episodes of uniformly random actions (gymnasium 1.2.2, mujoco 3.3.7)."""


def marks(steps: int) -> list[int]:
    """Env step marks at an eighth, a quarter, half and all of the budget."""
    return [steps // 8, steps // 4, steps // 2, steps]


def _spec(env_id: str, overrides: list[str]) -> Any:
    """The bare manifest with `env_id`, the space's defaults resolved as a run resolves them."""
    from impala_trainer.preflight import space_defaults

    spec = load_spec(MANIFEST, [f"env.id={env_id}", *overrides]).spec
    return space_defaults(spec)[0]


def trial(args: argparse.Namespace) -> dict[str, Any]:
    seed = args.seed + args.trial_index
    if args.trial == "ours":
        from ours_side import train

        with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
            result = train(
                MANIFESTS / f"{MANIFEST}.yaml", [f"env.id={args.env}", *args.overrides],
                args.cap, stop_return=None, seed=seed, process_start=args.trial_started,
                run_dir=Path(tmp) / "run", timesteps=args.steps,
            )  # fmt: skip
    else:
        from rllib_side import train as rllib_train

        result = rllib_train(
            _spec(args.env, args.overrides), args.cap, seed=seed,
            process_start=args.trial_started, algo_name=ALGOS[args.trial], stop_steps=args.steps,
        )  # fmt: skip
    result["seed"] = seed
    return result


def at_steps(points: list[list[Any]], steps: int) -> tuple[float | None, float | None]:
    """(return mean, seconds of training) at the first curve point at or past `steps`."""
    point = point_at_steps(points, steps)
    return (None, None) if point is None else (point[4], point[1])


def summarise(trials: dict[str, list[dict[str, Any]]], steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side, ts in trials.items():
        runs = []
        for t in ts:
            points = t.get("points") or [[0, 0, 0, 0, None]]
            run: dict[str, Any] = {"seed": t.get("seed"), "error": t.get("error")}
            run["env_steps"] = points[-1][2]
            run["seconds"] = points[-1][1]
            run["steps_per_s"] = points[-1][2] / points[-1][1] if points[-1][1] else None
            for m in marks(steps):
                run[f"return_at_{m}"], run[f"seconds_at_{m}"] = at_steps(points, m)
            runs.append(run)
        keys = [k for k in runs[0] if k not in ("seed", "error")]
        out[side] = {k: median(r[k] for r in runs) for k in keys}
        out[side]["algo"] = "ours" if side == "ours" else ALGOS[side]
        out[side]["runs"] = runs
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trial_args(parser, sides="ours,rllib,rllib_old", runs=1)
    parser.add_argument("--env", default="HalfCheetah-v5", help="a gymnasium MuJoCo env id")
    parser.add_argument("--steps", type=int, default=2_000_000, help="env steps per run")
    parser.add_argument("--cap", type=float, default=1200.0, help="training seconds a run, at most")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first round")
    parser.add_argument("--replot", action="store_true", help="only redraw the last run's figure")
    args = parser.parse_args(argv)
    slug = args.env.split("-")[0].lower()
    if args.replot:
        _plot(json.loads((RESULTS_DIR / f"mujoco_{slug}.json").read_text()))
        return 0
    if is_child(args):
        write_trial(args, trial(args))
        exit_child()
    info = machine_info()
    trials = alternate(Path(__file__), args, argv, timeout=args.cap + 400)
    summary = summarise(trials, args.steps)
    summary.update(
        env=args.env, steps=args.steps, random_return=RANDOM_RETURNS.get(args.env),
        mujoco=importlib.metadata.version("mujoco"),
    )  # fmt: skip
    headers = ["side", "env steps/s", *(f"return @ {m // 1000}K" for m in marks(args.steps))]
    rows = [
        [side if side == "ours" else f"{side} ({summary[side]['algo']})",
         summary[side]["steps_per_s"],
         *(summary[side][f"return_at_{m}"] for m in marks(args.steps))]
        for side in trials
    ]  # fmt: skip
    print(table(headers, rows))
    _plot(report(f"mujoco_{slug}", summary, trials, info, args, argv))
    return 0


def _plot(record: dict[str, Any]) -> None:
    from plots import plot_steps_and_time

    s = record["summary"]
    labels = {side: "ImpalaJob (ours), bare manifest" if side == "ours"
              else f"RLlib {s[side]['algo'].upper()}" for side in record["trials"]}  # fmt: skip
    slug = s["env"].split("-")[0].lower()
    out = REPO / "docs" / "img" / f"mujoco_{slug}.png"
    title = f"{s['env']}, two cores: the same sizes on both sides"
    plot_steps_and_time(record["trials"], labels, s.get("random_return"), out, title)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
