"""Render the tables of docs/benchmarks.md from bench/published.json; publish new runs there.

Every table of the doc sits between `<!-- bench:NAME:begin -->` and `<!-- bench:NAME:end -->`
and is rendered here: the targets table from TARGETS (the aims) and the records' summaries, the
machines table from bench/published.json's machines, every other table from its record NAME (the
table, and the command, date, commit and machine it was measured with). The prose around the
tables is the doc's own.
A benchmark writes its full record to bench/results/NAME.json (not committed); `--publish NAME`
turns that into the published record and rewrites the doc, so a number in the doc is one a
benchmark wrote. Rendering the committed data again changes nothing.

    python bench/render_doc.py                                # rewrite the doc's tables
    python bench/render_doc.py --print                        # print the doc instead
    python bench/render_doc.py --check                        # exit 1 if the doc is stale
    python bench/render_doc.py --publish cartpole_throughput  # a new run in, then rewrite
    python bench/render_doc.py --publish learner_only --as gpu_learner_only

Scenarios whose script writes no results file (ray_calls, evaluation_overhead, the training
runs of `impalajob train`) are published by editing bench/published.json by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from common import REPO, RESULTS_DIR, fmt, hardware_line, software_line, table

DOC = REPO / "docs" / "benchmarks.md"
PUBLISHED = REPO / "bench" / "published.json"
BLOCK = re.compile(
    r"<!-- bench:(?P<name>[a-z0-9_]+):begin -->\n.*?<!-- bench:(?P=name):end -->", re.DOTALL
)
RECORD_FIELDS = ("date", "commit", "machine", "command", "columns", "rows")


# -- the targets ------------------------------------------------------------------------------


def times(digits: int = 1) -> Callable[[float], str]:
    return lambda v: f"{v:.{digits}f}×"


def percent(v: float) -> str:
    return f"{100 * v:.0f}%" if abs(v) >= 0.1 else f"{100 * v:.1f}%"


def count(v: float) -> str:
    return f"{v:,.0f}"


def minutes(v: float) -> str:
    return f"{v:.1f} min"


def signed(v: float) -> str:
    return f"{v:+,.0f}"


def milliseconds(v: float) -> str:
    return f"{v:.0f} ms"


@dataclass(frozen=True)
class Target:
    """An aim: `record`'s summary[`key`] against `limit` (`op` is "<=" or ">="). A summary may
    hold `key`_below instead: an upper bound (the peer missed), shown as "< bound"."""

    what: str
    record: str
    key: str
    op: str
    limit: float
    shown: Callable[[float], str]
    section: str
    """The doc's heading over the record's table."""

    @property
    def aim(self) -> str:
        """`≥ 20×`, `≤ 0.1×`, `≤ 30 min`: the limit as shown, without trailing zeros."""
        shown = self.shown(self.limit)
        shown = re.sub(r"\.(\d*?)0+\b", lambda m: f".{m[1]}" if m[1] else "", shown)
        return f"{'≥' if self.op == '>=' else '≤'} {shown}"


TARGETS = (
    Target("CartPole env steps/s ÷ RLlib's", "cartpole_throughput", "ratio_vs_rllib",
           ">=", 20, times(), "CartPole throughput against RLlib"),
    Target("CartPole time to a return of 450 ÷ RLlib's (from launch)",
           "cartpole_time_to_return", "time_ratio_vs_rllib", "<=", 0.10, times(3),
           "CartPole time to a return of 450 against RLlib"),
    Target("CartPole env steps to 450, median of 20 seeds", "cartpole_steps_to_450",
           "median_env_steps", "<=", 100_000, count, "CartPole env steps to 450 over 20 seeds"),
    Target("CartPole env steps to 450, worst of 20 seeds", "cartpole_steps_to_450",
           "worst_env_steps", "<=", 300_000, count, "CartPole env steps to 450 over 20 seeds"),
    Target("Pipeline efficiency (ours): CartPole env steps/s ÷ the rollout-only ceiling",
           "rollout_ceiling", "efficiency", ">=", 0.8, percent,
           "Rollout ceiling and pipeline efficiency"),
    Target("Learner samples/s ÷ RLlib's, MLP, worst numSgdIter", "learner_only",
           "worst_ratio_mlp", ">=", 3, times(), "Learner only"),
    Target("Learner samples/s ÷ RLlib's, Pong CNN on the CPU, worst numSgdIter", "learner_only",
           "worst_ratio_cnn", ">=", 3, times(), "Learner only"),
    Target("Learner samples/s ÷ RLlib's, Pong CNN on a GPU (float32, batch 250), worst "
           "numSgdIter", "gpu_learner_only", "worst_ratio_cnn", ">=", 3, times(),
           "GPU learner against RLlib"),
    Target("Pong frames/s ÷ RLlib's (the first aim)", "pong_throughput", "ratio_vs_rllib",
           ">=", 2, times(), "Pong frames/s against RLlib"),
    Target("Pong frames/s ÷ RLlib's", "pong_throughput", "ratio_vs_rllib", ">=", 8, times(),
           "Pong frames/s against RLlib"),
    Target("Pong rollout CPU per env step ÷ the Python wrapper stack's", "cpu_budget_pong",
           "rollout_cpu_vs_wrapper", "<=", 0.5, times(2), "CPU budget, Pong"),
    Target("Pong minutes to a 100-episode mean of 18 on 2 cores", "pong_to_18", "minutes",
           "<=", 30, minutes, "Pong to a return of 18 on two cores"),
    Target("Pong env steps to a 100-episode mean of 18", "pong_to_18", "env_steps", "<=",
           3_500_000, count, "Pong to a return of 18 on two cores"),
    Target("HalfCheetah-v5 return at 1M env steps, ours − RLlib's best (APPO, IMPALA)",
           "mujoco_halfcheetah", "ours_minus_best_rllib", ">=", 0, signed,
           "MuJoCo beside RLlib"),
    Target("Hopper-v5 return at 1M env steps, ours − RLlib's best (APPO, IMPALA)",
           "mujoco_hopper", "ours_minus_best_rllib", ">=", 0, signed, "MuJoCo beside RLlib"),
    Target("Two learners' samples/s ÷ one's (Pong CNN, learner.replicas=2)", "learner_scaling",
           "ratio_two_vs_one_cnn", ">=", 1.8, times(2), "Learners beyond one"),
    Target("Evaluation during training: cost to env steps/s", "evaluation_overhead", "cost",
           "<=", 0.05, percent, "Evaluation overhead"),
    Target("Status sidecar: /status p99 at 500 requests/s", "sidecar_wrk",
           "ours_status_p99_ms", "<=", 10, milliseconds, "Status sidecar"),
)  # fmt: skip


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _judge(t: Target, summary: dict[str, Any]) -> tuple[str, str]:
    """(measured, status) of one target."""
    value, bound = summary.get(t.key), summary.get(f"{t.key}_below")
    if value is None and bound is not None and t.op == "<=":
        return f"< {t.shown(bound)}", "**met**" if bound <= t.limit else "not known"
    if value is None:
        return "-", "not measured"
    ok = value >= t.limit if t.op == ">=" else value <= t.limit
    return t.shown(value), "**met**" if ok else "not met"


def targets_block(records: dict[str, Any]) -> str:
    rows = []
    for t in TARGETS:
        measured, status = _judge(t, records.get(t.record, {}).get("summary", {}))
        rows.append([t.what, t.aim, measured, status, f"[{t.section}](#{anchor(t.section)})"])
    return table(["target", "aim", "measured", "status", "table"], rows)


# -- a published record as a table ------------------------------------------------------------


def machines_block(published: dict[str, Any]) -> str:
    used = {r["machine"] for r in published["records"].values()}
    rows = [
        [f"`{key}`", m["hardware"], m["software"]]
        for key, m in published["machines"].items()
        if key in used
    ]
    return table(["machine", "hardware", "software"], rows)


def record_block(name: str, r: dict[str, Any], machines: dict[str, Any]) -> str:
    missing = [f for f in RECORD_FIELDS if f not in r]
    if missing:
        raise ValueError(f"bench/published.json: {name} lacks {', '.join(missing)}")
    if r["machine"] not in machines:
        raise ValueError(f"bench/published.json: {name} names an unknown machine {r['machine']}")
    commands = r["command"] if isinstance(r["command"], list) else [r["command"]]
    how = " and ".join(f"`{c}`" for c in commands)
    on = f"`{r['machine']}`" + (f" with {r['software']}" if r.get("software") else "")
    line = f"{r['date']}, commit {r['commit']}, machine {on}: {how}."
    if r.get("note"):
        line += " " + r["note"]
    return "\n".join([line, "", table(r["columns"], r["rows"], r.get("digits", 1))])


def render_block(name: str, published: dict[str, Any]) -> str:
    records, machines = published["records"], published["machines"]
    if name == "targets":
        return targets_block(records)
    if name == "machines":
        return machines_block(published)
    if name not in records:
        raise KeyError(f"docs/benchmarks.md has a block `{name}` that bench/published.json lacks")
    return record_block(name, records[name], machines)


def render_doc(text: str, published: dict[str, Any]) -> str:
    """`text` with every block rendered afresh; every record and target section must be there."""
    records = published["records"]
    names = [m["name"] for m in BLOCK.finditer(text)]
    unplaced = [n for n in records if n not in names]
    if unplaced:
        raise KeyError(f"no block in docs/benchmarks.md for {', '.join(unplaced)}")
    headings = {h.strip() for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
    lost = sorted({t.section for t in TARGETS} - headings)
    if lost:
        raise KeyError(f"TARGETS name headings docs/benchmarks.md lacks: {', '.join(lost)}")

    def fresh(m: re.Match[str]) -> str:
        name = m["name"]
        block = render_block(name, published)
        return f"<!-- bench:{name}:begin -->\n{block}\n<!-- bench:{name}:end -->"

    return BLOCK.sub(fresh, text)


# -- publishing: a results file as a record ---------------------------------------------------

Converted = tuple[list[str], list[list[Any]], dict[str, Any]]
"""(columns, rows, summary) of a published record."""


def _x(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}×"


def _pct(v: float | None) -> str:
    return "-" if v is None else percent(v)


def _runs(values: Sequence[float | None]) -> str:
    return " / ".join(fmt(v if v is None else float(v)) for v in values)


def _peers(r: dict[str, Any]) -> list[str]:
    return [s for s in r["trials"] if s != "ours"]


def throughput(r: dict[str, Any]) -> Converted:
    s = r["summary"]
    unit = s.get("unit", "env steps")
    rows = [
        [side, s[side]["per_s"], _runs(s[side]["runs"]), _x(s.get(f"ratio_vs_{side}"))]
        for side in r["trials"]
    ]
    columns = ["side", f"{unit}/s (median)", "per run", "ours ÷ side"]
    return columns, rows, {"ratio_vs_rllib": s.get("ratio_vs_rllib")}


def time_to_return(r: dict[str, Any]) -> Converted:
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
        reached = f"{len(d['runs']) - d['misses']}/{len(d['runs'])}"
        seconds = "miss" if d["seconds"] is None else d["seconds"]
        rows.append([side, seconds, d["train_seconds"], d["env_steps"], reached, per])
    summary: dict[str, Any] = {"time_ratio_vs_rllib": s.get("time_ratio_vs_rllib")}
    ours, peer = s.get("ours", {}).get("seconds"), s.get("rllib", {})
    if summary["time_ratio_vs_rllib"] is None and ours is not None and peer.get("misses"):
        summary = {"time_ratio_vs_rllib_below": round(ours / s["cap"], 4)}
    columns = ["side", "s from launch (median)", "s of training", "env steps", "reached",
               "per seed (from launch)"]  # fmt: skip
    return columns, rows, summary


def ceiling(r: dict[str, Any]) -> Converted:
    s = r["summary"]
    rows = [
        [side, s[side]["ceiling_steps_per_s"], s[side]["pipeline_steps_per_s"],
         _pct(s[side]["efficiency"])]
        for side in r["trials"]
    ]  # fmt: skip
    columns = ["side", "ceiling env steps/s", "pipeline env steps/s", "pipeline efficiency"]
    return columns, rows, {"efficiency": s.get("ours", {}).get("efficiency")}


def learner_only(r: dict[str, Any]) -> Converted:
    sides, peers = list(r["trials"]), _peers(r)
    rows, worst = [], {}
    for key, e in r["summary"]["cases"].items():
        model, sgd = key.split("/")
        rates = [e.get(f"{p}_samples_per_s") for p in sides]
        ratios = [_x(e.get(f"ratio_vs_{p}")) for p in peers]
        rows.append([model, int(sgd.removeprefix("sgd")), *rates, *ratios])
        ratio = e.get("ratio_vs_rllib")
        if ratio is not None:
            worst[f"worst_ratio_{model}"] = min(ratio, worst.get(f"worst_ratio_{model}", ratio))
    columns = ["model", "numSgdIter", *(f"{p} samples/s" for p in sides),
               *(f"ours ÷ {p}" for p in peers)]  # fmt: skip
    return columns, rows, {k: round(v, 2) for k, v in worst.items()}


def cpu_budget(r: dict[str, Any]) -> Converted:
    s, sides = r["summary"], list(r["trials"])
    comps: list[str] = []
    for side in sides:
        comps += [c for c in s[side].get("cpu_ms_per_1k_steps", {}) if c not in comps]
    rows = [[c, *(s[side].get("cpu_ms_per_1k_steps", {}).get(c) for side in sides)] for c in comps]
    for label, key in (
        ("**total**", "total_cpu_ms_per_1k_steps"),
        ("cores busy (of the machine's, shared)", "cores_used"),
        ("measured env steps/s", "steps_per_s"),
        ("CPU bound: cores ÷ CPU per step", "cpu_bound_steps_per_s"),
    ):
        rows.append([label, *(s[side].get(key) for side in sides)])
    summary = {f"total_cpu_ms_per_1k_{side}": s[side].get("total_cpu_ms_per_1k_steps")
               for side in sides}  # fmt: skip
    return ["CPU ms per 1,000 env steps", *sides], rows, summary


def learner_scaling(r: dict[str, Any]) -> Converted:
    s = r["summary"]
    row = [s["model"], s["one_samples_per_s"], s["two_samples_per_s"],
           s.get("apart_samples_per_s"), _x(s["ratio_two_vs_one"], 2),
           _x(s.get("ratio_apart_vs_one"), 2), _pct(s["allreduce_share_two"])]  # fmt: skip
    columns = ["model", "1 learner samples/s", "2 learners samples/s", "2 apart samples/s",
               "2 ÷ 1", "2 apart ÷ 1", "all-reduce after backward (2)"]  # fmt: skip
    return columns, [row], {f"ratio_two_vs_one_{s['model']}": round(s["ratio_two_vs_one"], 2)}


def multipod(r: dict[str, Any]) -> Converted:
    peers = _peers(r)
    rows = []
    for pods, e in r["summary"]["by_pods"].items():
        ours = e.get("ours", {})
        rows.append([int(pods), ours.get("steps_per_s"),
                     *(x for p in peers for x in (e[p]["steps_per_s"], _x(e.get(f"ratio_vs_{p}")))),
                     ours.get("learner_cpu_ms_per_1k"), ours.get("rollouts_cpu_ms_per_1k"),
                     _pct(ours.get("learner_share"))])  # fmt: skip
    columns = ["rollout pods", "ours env steps/s",
               *(c for p in peers for c in (f"{p} env steps/s", f"ours ÷ {p}")),
               "learner pod CPU ms/1k", "rollout pods CPU ms/1k", "learner's share"]  # fmt: skip
    return columns, rows, {}


def sidecar(r: dict[str, Any]) -> Converted:
    rows = []
    for key, m in r["summary"].items():
        side, _, endpoint = key.partition("_")
        rows.append([f"/{endpoint}", side, m["rate"], m["p50_ms"], m["p90_ms"], m["p99_ms"],
                     m["p999_ms"], m["server_cpu_pct"], m["cpu_us_per_request"],
                     m.get("asgi", {}).get("cpu_mean_us")])  # fmt: skip
    rows.sort(key=lambda row: (row[0] != "/status", row[1] != "ours"))
    columns = ["endpoint", "side", "req/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms",
               "server CPU %", "CPU µs/req", "app CPU µs/req (in-process)"]  # fmt: skip
    p99 = r["summary"].get("ours_status", {}).get("p99_ms")
    return columns, rows, {"ours_status_p99_ms": p99}


def operator_apply(r: dict[str, Any]) -> Converted:
    one, many, floor = r["one_job"], r["many_jobs"], r["api_floor"]
    label = f"1 ({one['rounds']} rounds)"
    rows = [
        [label, "all children created", one["children_p50_s"], None, None],
        [label, "status Running", one["running_p50_s"], None, None],
        [many["jobs"], "all children created", many["children_p50_s"],
         many["children_p95_s"], None],
        [many["jobs"], "status Running", many["running_p50_s"], many["running_p95_s"],
         many["all_running_s"]],
        [floor["jobs"], "API floor: children written directly", floor["children_p50_s"],
         floor["children_p95_s"], floor["all_children_s"]],
    ]  # fmt: skip
    return ["jobs", "what", "p50 s", "p95 s", "last job s"], rows, {}


def operator_queue(r: dict[str, Any]) -> Converted:
    a, w, t = r["wait_admitted_s"], r["wait_running_s"], r["reconcile_s"]
    rows = [
        [f"all {r['jobs']} jobs Succeeded", f"{r['all_done_s']:.0f} s after the apply"],
        ["most jobs running at once", f"{r['most_running']} (room for {r['room']})"],
        ["wait from apply to admission, p50 / p95 / max",
         f"{a['p50']:.0f} / {a['p95']:.0f} / {a['max']:.0f} s"],
        ["wait from apply to Running, p50 / p95 / max",
         f"{w['p50']:.0f} / {w['p95']:.0f} / {w['max']:.0f} s"],
        ["operator reconcile, mean / p50 / p95",
         f"{t['mean']:.2f} s / ≤ {t['p50_bucket']} s / ≤ {t['p95_bucket']} s "
         f"({t['count']:,.0f} ticks)"],
        ["operator API requests per job (audit log)", f"{r['api_requests_per_job']}"],
        ["operator CPU / RSS", f"{r['operator_cpu_s']:.0f} s / {r['rss_mib']['idle']:.0f} MiB "
         f"idle, {r['rss_mib']['end']:.0f} MiB at the end"],
    ]  # fmt: skip
    return ["what", "measured"], rows, {}


def multi_agent_spread(r: dict[str, Any]) -> Converted:
    s = r["summary"]
    marks = sorted(int(k.rpartition("_")[2]) for k in s["ours"] if k.startswith("return_at_"))
    rows = [[side, s[side]["env_steps"], *(s[side][f"return_at_{m}"] for m in marks)]
            for side in ("ours", "rllib") if side in s]  # fmt: skip
    rows.append(["uniformly random actions", None, *(s["random_return"] for _ in marks)])
    columns = ["side", "env steps in the time", *(f"team return at {m // 1000}K" for m in marks)]
    return columns, rows, {}


def mujoco(r: dict[str, Any]) -> Converted:
    s = r["summary"]
    marks = sorted(int(k.rpartition("_")[2]) for k in s["ours"] if k.startswith("return_at_"))
    names = {"ours": "ours (bare manifest)", "appo": "RLlib APPO", "impala": "RLlib IMPALA"}
    sides = [side for side in ("ours", "rllib", "rllib_old") if side in s]
    # Medians over the side's seeds (a side's runs: the seeds it was measured with).
    rows = [[names[s[side]["algo"]], len(s[side]["runs"]), s[side]["steps_per_s"],
             *(s[side][f"return_at_{m}"] for m in marks), s[side][f"seconds_at_{marks[-1]}"]]
            for side in sides]  # fmt: skip
    rows.append(["uniformly random actions", None, None, *(s["random_return"] for _ in marks),
                 None])  # fmt: skip
    columns = ["side", "seeds", "env steps/s", *(f"return at {_steps(m)}" for m in marks),
               f"s of training to {_steps(marks[-1])}"]  # fmt: skip
    ours = s["ours"][f"return_at_{marks[-1]}"]
    best_peer = max(s[side][f"return_at_{marks[-1]}"] for side in sides if side != "ours")
    return columns, rows, {"ours_minus_best_rllib": ours - best_peer}


def _steps(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n // 1000}K"


CONVERTERS: dict[str, Callable[[dict[str, Any]], Converted]] = {
    "cartpole_throughput": throughput,
    "pong_throughput": throughput,
    "cartpole_time_to_return": time_to_return,
    "rollout_ceiling": ceiling,
    "learner_only": learner_only,
    "cpu_budget_cartpole": cpu_budget,
    "cpu_budget_pong": cpu_budget,
    "learner_scaling": learner_scaling,
    "multi_agent_spread": multi_agent_spread,
    "mujoco_halfcheetah": mujoco,
    "mujoco_hopper": mujoco,
    "multipod_scaling": multipod,
    "multipod_pong": multipod,
    "sidecar_wrk": sidecar,
    "operator_apply": operator_apply,
    "operator_queue": operator_queue,
}


def _tidy(cell: Any) -> Any:
    """A measured float as the table shows it: whole above 100, else to 3 decimals."""
    if isinstance(cell, float):
        return round(cell) if abs(cell) >= 100 else round(cell, 3)
    return cell


def machine_key(m: dict[str, Any], machines: dict[str, Any]) -> str:
    """The key of machine `m` among `machines` (added there when it is new)."""
    hardware = hardware_line(m)
    for key, known in machines.items():
        if known["hardware"] == hardware:
            return key
    key = re.sub(r"[^a-z0-9]+", "-", f"{m.get('cpu', 'cpu')} {m.get('cores', '')}".lower())
    key = re.sub(r"-(r|tm)-|\(r\)|\(tm\)", "-", key).strip("-")
    machines[key] = {"hardware": hardware, "software": software_line(m)}
    return key


def published_record(name: str, result: dict[str, Any], machines: dict[str, Any]) -> dict[str, Any]:
    """bench/results/NAME.json (a script's full record) as the record the doc renders."""
    convert = CONVERTERS.get(name)
    if convert is None:
        raise KeyError(f"no converter for {name}: edit bench/published.json by hand")
    columns, rows, summary = convert(result)
    rows = [[_tidy(cell) for cell in row] for row in rows]
    m = result["machine"]
    key = machine_key(m, machines)
    record = {
        "date": result["finished"][:10],
        "commit": m.get("git", "-"),
        "machine": key,
        "command": result["command"],
        "columns": columns,
        "rows": rows,
        "summary": {k: v for k, v in summary.items() if v is not None},
    }
    if software_line(m) != machines[key]["software"]:
        record["software"] = software_line(m)
    return record


# -- the command ------------------------------------------------------------------------------


def load_published() -> dict[str, Any]:
    """bench/published.json: {"machines": {key: {hardware, software}}, "records": {name: ...}}."""
    return dict(json.loads(PUBLISHED.read_text()))


def save_published(published: dict[str, Any]) -> None:
    """Write it back, without the machines no record names any more."""
    used = {r["machine"] for r in published["records"].values()}
    machines = {k: m for k, m in published["machines"].items() if k in used}
    published = {**published, "machines": machines}
    PUBLISHED.write_text(json.dumps(published, indent=1, ensure_ascii=False) + "\n")


def publish(names: Sequence[str], as_name: str | None, published: dict[str, Any]) -> None:
    if as_name and len(names) != 1:
        raise ValueError("--as names one record: publish one results file with it")
    for name in names:
        path = RESULTS_DIR / f"{name}.json"
        if not path.exists():
            raise FileNotFoundError(f"{path.relative_to(REPO)}: run the benchmark first")
        result = json.loads(path.read_text())
        record = published_record(name, result, published["machines"])
        published["records"][as_name or name] = record
        print(f"published {path.relative_to(REPO)} as {as_name or name}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--print", action="store_true", help="print the doc instead of writing it")
    mode.add_argument("--check", action="store_true", help="exit 1 if the doc is not rendered")
    parser.add_argument(
        "--publish",
        nargs="+",
        metavar="NAME",
        default=[],
        help="take bench/results/NAME.json into bench/published.json first",
    )
    parser.add_argument("--as", dest="as_name", help="the record's name, if not NAME")
    args = parser.parse_args(argv)
    published = load_published()
    try:
        if args.publish:
            publish(args.publish, args.as_name, published)
        text = DOC.read_text()
        rendered = render_doc(text, published)
    except (KeyError, ValueError, FileNotFoundError) as err:
        print(f"render_doc: {err.args[0] if err.args else err}", file=sys.stderr)
        return 1
    if args.print:
        print(rendered, end="")
        return 0
    if args.check:
        if rendered != text:
            print(f"{DOC.relative_to(REPO)} is stale: run python bench/render_doc.py",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0
    if args.publish:
        save_published(published)
    if rendered != text:
        DOC.write_text(rendered)
        print(f"rewrote the tables of {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
