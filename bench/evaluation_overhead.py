"""What evaluation during training (spec.evaluation) costs the training it runs beside.

Each trial is `impalajob train -f manifests/examples/<example>.yaml` for a fixed training time,
alternately without and with `spec.evaluation` (A B A B ...), on the same machine; the rate is
the env steps sampled per second of training after a warm-up, read from the run's history.jsonl.
The evaluation actors run on the driver's node, i.e. on the same cores as the rollout workers
and the learner here, which is the worst case: on a cluster they share only the learner pod.

    python bench/evaluation_overhead.py --example cartpole --seconds 40 --rounds 3
    python bench/evaluation_overhead.py --example pong --seconds 150 --rounds 2 \\
        --evaluation intervalTimesteps=100000 --evaluation duration=2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, machine_line, median, ratio, table

DEFAULT_EVALUATION = {"intervalTimesteps": "50000", "duration": "10"}


def trial(
    example: str, seconds: float, evaluation: dict[str, str] | None, warmup: float
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="eval-overhead-") as tmp:
        run = Path(tmp) / "run"
        sets = ["training.seed=0", f"stop.timeLimitSeconds={seconds}", "stop.episodeReturnMean=1e9"]
        for key, value in (evaluation or {}).items():
            sets.append(f"evaluation.{key}={value}")
        argv = [sys.executable, "-m", "impala_cli.main", "train", "-f",
                f"manifests/examples/{example}.yaml", "--run-dir", str(run)]  # fmt: skip
        for s in sets:
            argv += ["--set", s]
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=seconds * 3 + 300)  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        history = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
        after = [h for h in history if h["wall_seconds"] >= warmup]
        first, last = after[0], after[-1]
        rate = (last["env_steps"] - first["env_steps"]) / (
            last["wall_seconds"] - first["wall_seconds"]
        )
        status = json.loads((run / "status.json").read_text())
        ev = status.get("evaluation") or {}
        return {"rate": rate, "steps": last["env_steps"], "evaluations": ev.get("evaluations", 0),
                "eval_seconds": ev.get("seconds")}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default="cartpole")
    parser.add_argument("--seconds", type=float, default=40.0, help="training time per trial")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds left out of the rate")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--evaluation",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="spec.evaluation fields (default intervalTimesteps=50000, duration=10)",
    )
    args = parser.parse_args()
    evaluation = dict(DEFAULT_EVALUATION)
    evaluation.update(dict(kv.split("=", 1) for kv in args.evaluation))
    print(machine_line(), flush=True)
    runs: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
    for i in range(args.rounds):
        for side in ("without", "with"):
            result = trial(args.example, args.seconds, evaluation if side == "with" else None,
                           args.warmup)  # fmt: skip
            runs[side].append(result)
            print(f"round {i + 1} {side} evaluation: {result}", flush=True)
    off, on = median(r["rate"] for r in runs["without"]), median(r["rate"] for r in runs["with"])
    cost = None if ratio(on, off) is None else 1.0 - ratio(on, off)  # type: ignore[operator]
    print(table(
        ["example", "evaluation", "env steps/s (median)", "rounds per trial", "cost"],
        [[args.example, "off", off, None, None],
         [args.example, ", ".join(f"{k} {v}" for k, v in evaluation.items()), on,
          median(r["evaluations"] for r in runs["with"]),
          None if cost is None else f"{100 * cost:.1f}%"]],
    ))  # fmt: skip


if __name__ == "__main__":
    main()
