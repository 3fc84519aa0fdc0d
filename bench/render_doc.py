"""Render bench/results/*.json into the results block of docs/benchmarks.md.

Only the text between the `trainer-bench:begin` / `trainer-bench:end` markers (inside the
"Trainer vs RLlib IMPALA" section) is replaced; every other section of the file is left alone.

    python bench/render_doc.py            # rewrite the block
    python bench/render_doc.py --print    # print it instead
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from common import REPO, RESULTS_DIR, fmt, machine_line, table

DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- trainer-bench:begin -->", "<!-- trainer-bench:end -->"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _x(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}×"


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "not met")


def _header(r: dict[str, Any]) -> str:
    load = "/".join(f"{x:.1f}" for x in r["machine"]["load_avg"])
    end = "/".join(f"{x:.1f}" for x in r.get("machine_end_load", []))
    return (
        f"`{r['command']}` — finished {r['finished']}; load average {load} at the start, "
        f"{end} at the end."
    )


def throughput_block(r: dict[str, Any], unit: str) -> str:
    s = r["summary"]
    sides = [k for k in r["trials"]]
    rows = [
        [
            side,
            s[side].get("per_s"),
            s[side].get("trained_per_s"),
            ", ".join(fmt(x) for x in s[side].get("runs", [])),
            _x(s.get(f"ratio_vs_{side}")),
        ]
        for side in sides
    ]
    return "\n".join(
        [
            _header(r),
            "",
            table(
                ["side", f"{unit}/s (median)", f"trained {unit}/s", "per run", "ours ÷ side"],
                rows,
            ),
        ]
    )


def time_block(r: dict[str, Any]) -> str:
    s = r["summary"]
    rows = []
    for side in r["trials"]:
        d = s[side]
        per = ", ".join(
            f"seed {x['seed']}: {x['seconds']:.0f} s / {x['env_steps']:,.0f} steps"
            if x["reached"]
            else f"seed {x['seed']}: miss"
            for x in d["runs"]
        )
        rows.append(
            [
                side,
                d["seconds"],
                d["train_seconds"],
                d["env_steps"],
                f"{len(d['runs']) - d['misses']}/{len(d['runs'])}",
                per,
            ]
        )
    ratio = s.get("time_ratio_vs_rllib")
    return "\n".join(
        [
            _header(r),
            "",
            table(
                [
                    "side",
                    "s from launch (median)",
                    "s of training",
                    "env steps",
                    "reached",
                    "per seed (from launch)",
                ],
                rows,
            ),
            "",
            f"Ours ÷ RLlib, time from launch: {_x(ratio, 2)}.",
        ]
    )


def ceiling_block(r: dict[str, Any]) -> str:
    s = r["summary"]
    rows = [
        [
            side,
            s[side]["ceiling_steps_per_s"],
            s[side]["pipeline_steps_per_s"],
            "-" if s[side]["efficiency"] is None else f"{100 * s[side]['efficiency']:.0f}%",
            ", ".join(fmt(x) for x in s[side]["runs"]),
        ]
        for side in r["trials"]
    ]
    return "\n".join(
        [
            _header(r),
            "",
            table(
                [
                    "side",
                    "ceiling env steps/s",
                    "scenario-1 env steps/s",
                    "pipeline efficiency",
                    "ceiling per run",
                ],
                rows,
            ),
        ]
    )


def learner_block(r: dict[str, Any]) -> str:
    s = r["summary"]["cases"]
    sides = list(r["trials"])
    peers = [p for p in sides if p != "ours"]
    rows = []
    for key, e in s.items():
        model, sgd = key.split("/")
        rows.append(
            [
                model,
                sgd.removeprefix("sgd"),
                *(e.get(f"{p}_samples_per_s") for p in sides),
                *(_x(e.get(f"ratio_vs_{p}")) for p in peers),
            ]
        )
    return "\n".join(
        [
            _header(r),
            "",
            table(
                [
                    "model",
                    "numSgdIter",
                    *(f"{p} samples/s" for p in sides),
                    *(f"ours ÷ {p}" for p in peers),
                ],
                rows,
            ),
        ]
    )


def budget_block(r: dict[str, Any]) -> str:
    s = r["summary"]
    sides = [k for k in r["trials"]]
    comps: list[str] = []
    for side in sides:
        comps += [c for c in s[side].get("cpu_ms_per_1k_steps", {}) if c not in comps]
    rows = [[c, *(s[side].get("cpu_ms_per_1k_steps", {}).get(c) for side in sides)] for c in comps]
    for label, key in (
        ("**total CPU ms per 1k env steps**", "total_cpu_ms_per_1k_steps"),
        ("cores busy (of the machine's, shared)", "cores_used"),
        ("measured env steps/s", "steps_per_s"),
        ("CPU bound: cores ÷ CPU per step", "cpu_bound_steps_per_s"),
    ):
        rows.append([label, *(s[side].get(key) for side in sides)])
    return "\n".join([_header(r), "", table(["CPU ms per 1,000 env steps", *sides], rows)])


def targets_block() -> str:
    tp, ttr = _load("cartpole_throughput"), _load("cartpole_time_to_return")
    ceil, lo, pong = _load("rollout_ceiling"), _load("learner_only"), _load("pong_throughput")
    rows = []
    if tp:
        v = tp["summary"].get("ratio_vs_rllib")
        rows.append(
            ["CartPole env steps/s ÷ RLlib", "≥ 20×", _x(v), _met(None if v is None else v >= 20)]
        )
    if ttr:
        v = ttr["summary"].get("time_ratio_vs_rllib")
        rows.append(
            [
                "CartPole time to 450 ÷ RLlib",
                "≤ 0.10×",
                _x(v, 2),
                _met(None if v is None else v <= 0.1),
            ]
        )
    if ceil:
        v = ceil["summary"].get("ours", {}).get("efficiency")
        shown = "-" if v is None else f"{100 * v:.0f}%"
        rows.append(
            ["pipeline efficiency (ours)", "≥ 80%", shown, _met(None if v is None else v >= 0.8)]
        )
    if lo:
        cases = lo["summary"]["cases"]
        vals = [e.get("ratio_vs_rllib") for e in cases.values() if e.get("ratio_vs_rllib")]
        lo_min = min(vals) if vals else None
        rows.append(
            [
                "learner samples/s ÷ RLlib learner (worst case)",
                "≥ 3×",
                _x(lo_min),
                _met(None if lo_min is None else lo_min >= 3),
            ]
        )
    if pong:
        v = pong["summary"].get("ratio_vs_rllib")
        rows.append(["Pong frames/s ÷ RLlib", "≥ 2×", _x(v), _met(None if v is None else v >= 2)])
    return table(["target", "aim", "measured (same run)", "status"], rows)


# Results files whose script is not named like the file.
NOT_RUN_COMMANDS = {
    "cpu_budget_cartpole": "python bench/cpu_budget.py",
    "cpu_budget_pong": "python bench/cpu_budget.py --manifest pong",
}


def render() -> str:
    parts = ["### Targets", "", targets_block(), ""]
    first = next(
        (r for n in ("cartpole_throughput", "learner_only") if (r := _load(n)) is not None), None
    )
    if first:
        parts += [f"Machine: {machine_line(first['machine'])}.", ""]
    sections = (
        (
            "cartpole_throughput",
            "### 1a. CartPole-v1 env steps/s (2 rollout workers)",
            throughput_block,
            "env steps",
        ),
        (
            "cartpole_time_to_return",
            "### 1b. CartPole-v1 time to a 100-episode mean return of 450",
            time_block,
            None,
        ),
        (
            "rollout_ceiling",
            "### 2. Rollout-only ceiling and pipeline efficiency",
            ceiling_block,
            None,
        ),
        (
            "learner_only",
            "### 3. Learner only (synthetic batches into the learner thread)",
            learner_block,
            None,
        ),
        (
            "pong_throughput",
            "### 4. ALE/Pong-v5 frames/s (2 rollout processes)",
            throughput_block,
            "frames",
        ),
        (
            "cpu_budget_cartpole",
            "### CPU budget, CartPole (the profile that bounds throughput)",
            budget_block,
            None,
        ),
        ("cpu_budget_pong", "### CPU budget, Pong", budget_block, None),
    )
    for name, title, fn, unit in sections:
        r = _load(name)
        parts += [title, ""]
        if r is None:
            command = NOT_RUN_COMMANDS.get(name, f"python bench/{name}.py")
            parts += [f"Not run yet: `{command}`.", ""]
            continue
        parts += [fn(r, unit) if unit else fn(r), ""]
        if name == "cartpole_time_to_return":
            parts += ["![CartPole return vs wall time](img/cartpole_return.png)", ""]
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print instead of writing the doc")
    args = parser.parse_args(argv)
    block = render()
    if args.print:
        print(block)
        return 0
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        print(f"{DOC}: markers {BEGIN} / {END} not found", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{block}{END}{tail}")
    print(f"rewrote the results block of {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
