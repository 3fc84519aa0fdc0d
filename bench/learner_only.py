"""Learner-only samples/s on synthetic [rolloutFragmentLength x B] batches.

One pre-built train batch is pushed straight into the learner thread as fast as it takes it, for
numSgdIter 1, 2 and 4, with the MLP (CartPole shapes, manifests/examples/cartpole.yaml) and the
Atari CNN (4x84x84 uint8, manifests/examples/pong.yaml). Peers: RLlib's new-stack IMPALALearner
(`rllib`) and RLlib's old-stack LearnerThread (`rllib_old`), driven the same way.

    python bench/learner_only.py                     # 3 alternating rounds, 15 s per case
    python bench/learner_only.py --seconds 5 --runs 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from common import (
    add_trial_args,
    alternate,
    exit_child,
    is_child,
    load_spec,
    machine_info,
    median,
    ratio,
    report,
    table,
    write_trial,
)

SGD_ITERS = (1, 2, 4)
# (case name, manifest, obs shape (ours, channels-first), actions, obs dtype)
MODELS: tuple[tuple[str, str, tuple[int, ...], int, str], ...] = (
    ("mlp", "cartpole", (4,), 2, "float32"),
    ("cnn", "pong", (4, 84, 84), 6, "uint8"),
)


def cases(args: argparse.Namespace) -> list[tuple[str, str, tuple[int, ...], int, str, int]]:
    chosen = {m.strip() for m in args.models.split(",")}
    return [(*m, k) for m in MODELS if m[0] in chosen for k in SGD_ITERS]


def trial(args: argparse.Namespace) -> dict[str, Any]:
    """One side, every case, in this process."""
    out: dict[str, Any] = {}
    for name, manifest, obs_shape, actions, dtype, k in cases(args):
        spec = load_spec(manifest, [*args.overrides, f"training.numSgdIter={k}"]).spec
        if args.trial == "ours":
            from ours_side import learner_only
        else:
            from rllib_side import learner_only as rl_learner_only

            def learner_only(*a: Any, **kw: Any) -> dict[str, Any]:
                return rl_learner_only(
                    *a, **kw, stack="old" if args.trial == "rllib_old" else "new"
                )

        r = learner_only(spec, obs_shape, actions, dtype, args.seconds, args.warmup)
        out[f"{name}/sgd{k}"] = r
        write_trial(args, {"cases": out})  # a crash in a later case keeps the earlier ones
        print(f"{args.trial} {name} sgd={k}: {r['samples_per_s']:.0f} samples/s", file=sys.stderr)
    return {"cases": out}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trial_args(parser, sides="ours,rllib,rllib_old")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured window per case")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds per case")
    parser.add_argument("--models", default="mlp,cnn", help="mlp, cnn or both")
    args = parser.parse_args(argv)
    if is_child(args):
        write_trial(args, trial(args))
        exit_child()
    info = machine_info()
    per_case = (args.seconds + args.warmup + 90) * len(cases(args))
    trials = alternate(Path(__file__), args, argv, timeout=per_case + 120)
    sides = list(trials)
    summary: dict[str, Any] = {"cases": {}}
    rows = []
    for name, _, _, _, _, k in cases(args):
        key = f"{name}/sgd{k}"
        meds = {
            s: median(t.get("cases", {}).get(key, {}).get("samples_per_s") for t in trials[s])
            for s in sides
        }
        entry = {f"{s}_samples_per_s": meds[s] for s in sides}
        for peer in (s for s in sides if s != "ours"):
            entry[f"ratio_vs_{peer}"] = ratio(meds.get("ours"), meds[peer])
        summary["cases"][key] = entry
        rows.append(
            [
                name,
                k,
                *(meds[s] for s in sides),
                *(entry[f"ratio_vs_{p}"] for p in sides if p != "ours"),
            ]
        )
    headers = ["model", "numSgdIter", *(f"{s} samples/s" for s in sides)]
    headers += [f"ours/{p}" for p in sides if p != "ours"]
    print(table(headers, rows))
    report("learner_only", summary, trials, info, args, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
