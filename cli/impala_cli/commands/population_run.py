"""`impalajob train -f population.yaml`: an ImpalaPopulation's members side by side on one
embedded Ray, with the same PBT decisions a cluster's operator takes.

Each member is an `impalajob train` of its own ImpalaJob (`runs/<population>/<member>/`), a
driver process that joins the population's Ray (its actors take the Ray resources the
population declared for all). This process is the population's controller: it reads each
member's status, takes `impala_api.population.pbt`'s decisions, asks a loser to adopt its
winner's newest checkpoint with new live hyperparameters (`rundir.control`), and keeps the
lineage (`lineage.jsonl`, one line per decision, read back by `--resume` so a decision is
neither lost nor taken twice) and the leaderboard (`population.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from impala_api.population.members import Member, draw_members
from impala_api.population.paths import live_value
from impala_api.population.pbt import Decision, MemberFigures, decide, ready
from impala_api.population.spec import ImpalaPopulation
from impala_api.snapshot import StatusSnapshot
from impala_cli.commands import EXIT_FAILED, EXIT_STOPPED, CommandError

SHARED_RAY_ENV = "IMPALAJOB_RAY_ADDRESS"
"""Set for a population's members: the address of the Ray their drivers join."""
POLL_SECONDS = 1.0
LEADERBOARD_SECONDS = 30.0
LINEAGE_FILE = "lineage.jsonl"
SUMMARY_FILE = "population.json"


@dataclass
class MemberRun:
    """One member as the controller follows it."""

    member: Member
    run_dir: Path
    figures: MemberFigures
    process: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    parent: str | None = None
    last_iteration: int = -1
    readings_from: int = 0
    """Env steps from which its readings count: where the member applied its last exploit."""
    awaiting: int | None = None
    """The control request it has not answered yet (`rundir.control`)."""
    history: list[tuple[int, float]] = field(default_factory=list)
    """(env steps, fitness) of every reading, for the leaderboard's curve."""

    @property
    def phase(self) -> str:
        if self.exit_code is None:
            return "Pending" if self.process is None else "Running"
        return {0: "Succeeded", EXIT_STOPPED: "Stopped"}.get(self.exit_code, "Failed")


def run_population(pop: ImpalaPopulation, args: argparse.Namespace) -> int:
    root = Path(args.run_dir or Path("runs") / pop.name)
    runs = _prepare(pop, root, resume=args.resume, overwrite=args.overwrite)
    lineage = _replay_lineage(root, runs) if args.resume else []
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=os.cpu_count() or 1, resources=_resources(runs),
             include_dashboard=False, log_to_driver=False)  # fmt: skip
    address = ray.get_runtime_context().gcs_address
    limit = pop.spec.max_concurrent or len(runs)
    print(f"{pop.name}: {len(runs)} members, at most {limit} at once; run directories {root}/",
          flush=True)  # fmt: skip
    try:
        _control_loop(pop, root, runs, lineage, address, limit, args.resume)
    except KeyboardInterrupt:
        for run in runs:
            if run.process is not None and run.exit_code is None:
                run.process.terminate()
        for run in runs:
            if run.process is not None:
                run.exit_code = run.process.wait()
        _write_summary(pop, root, runs, lineage)
        print(f"{pop.name}: stopped; `--resume` continues from {root}", file=sys.stderr)
        return EXIT_STOPPED
    finally:
        ray.shutdown()
    _write_summary(pop, root, runs, lineage)
    best = _best(runs)
    failed = [r.member.name for r in runs if r.phase == "Failed"]
    print(f"{pop.name}: best member {best.member.name if best else 'none'}"
          + (f"; failed: {', '.join(failed)}" if failed else "")
          + f"; summary {root / SUMMARY_FILE}", flush=True)  # fmt: skip
    return EXIT_FAILED if len(failed) == len(runs) else 0


def _prepare(
    pop: ImpalaPopulation, root: Path, *, resume: bool, overwrite: bool
) -> list[MemberRun]:
    if (root / LINEAGE_FILE).exists() and not (resume or overwrite):
        raise CommandError(
            f"{root} already holds a population's run; pass --resume to continue it, "
            "--overwrite to replace it, or --run-dir for a new directory"
        )
    if overwrite and not resume:
        (root / LINEAGE_FILE).unlink(missing_ok=True)
    manifests = root / "manifests"
    manifests.mkdir(parents=True, exist_ok=True)
    runs = []
    for member in draw_members(pop.name, pop.spec):
        job = {"apiVersion": "impala.dev/v1alpha1", "kind": "ImpalaJob",
               "metadata": {"name": member.name,
                            "labels": {"impala.dev/population": pop.name}},
               "spec": member.spec.model_dump(mode="json", by_alias=True, exclude_none=True)}
        (manifests / f"{member.name}.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
        values: dict[str, float] = {}
        for path in pop.spec.pbt.mutations if pop.spec.pbt is not None else {}:
            value = live_value(member.spec, path)
            if value is not None:
                values[path] = value
        figures = MemberFigures(member.name, 0, [], values)
        runs.append(MemberRun(member, root / member.name, figures))
    return runs


def _resources(runs: list[MemberRun]) -> dict[str, float]:
    """Every member's Ray units (what `impalajob train` declares for one job), summed."""
    total = {"rollout": 0.0, "aggregator": 0.0, "learner": 0.0}
    for run in runs:
        spec = run.member.spec
        total["rollout"] += max(1, spec.rollouts.initial_replicas * spec.rollouts.workers_per_pod)
        total["aggregator"] += spec.aggregators.initial_replicas
        total["learner"] += spec.learner.replicas if spec.learner.replicas > 1 else 0
    return total


def _start(run: MemberRun, root: Path, address: str, resume: bool) -> None:
    cmd = [sys.executable, "-m", "impala_cli.main", "train",
           "-f", str(root / "manifests" / f"{run.member.name}.yaml"), "--run-dir", str(run.run_dir)]
    cmd.append("--resume" if resume else "--overwrite")
    env = {**os.environ, SHARED_RAY_ENV: address}
    env.setdefault("OMP_NUM_THREADS", "1")  # several learners share the machine's cores
    log = open(root / f"{run.member.name}.log", "ab")  # noqa: SIM115 - the child keeps it
    run.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)  # fmt: skip
    log.close()


def _control_loop(pop: ImpalaPopulation, root: Path, runs: list[MemberRun],
                  lineage: list[dict[str, Any]], address: str, limit: int,
                  resume: bool) -> None:  # fmt: skip
    last_board = time.monotonic()
    while True:
        running = [r for r in runs if r.process is not None and r.exit_code is None]
        for run in runs:
            if run.process is None and run.exit_code is None and len(running) < limit:
                _start(run, root, address, resume)
                running.append(run)
        for run in running:
            run.exit_code = run.process.poll() if run.process is not None else None
            _read(pop, run)
        if pop.spec.pbt is not None:
            live = [r for r in runs if r.phase == "Running"]
            for run in live:
                if ready(pop.spec.pbt, run.figures):
                    decision = decide(pop.spec, run.figures, [r.figures for r in live])
                    _record(root, lineage, decision, runs)
        if time.monotonic() - last_board >= LEADERBOARD_SECONDS:
            last_board = time.monotonic()
            print(_leaderboard(runs), flush=True)
            _write_summary(pop, root, runs, lineage)
        if all(r.exit_code is not None for r in runs):
            return
        time.sleep(POLL_SECONDS)


def _read(pop: ImpalaPopulation, run: MemberRun) -> None:
    """A new status of the member: its env steps, and a fitness reading when it has one. Until
    it has answered an exploit, none: what it reports is still its old weights'."""
    if run.awaiting is not None:
        from impala_trainer.rundir.control import read_applied

        applied = read_applied(run.run_dir)
        if applied is None or applied.seq < run.awaiting:
            return
        run.awaiting = None
        run.readings_from = applied.timesteps
        run.figures.readings = []
        run.figures.last_decision_timesteps = applied.timesteps
    try:
        snap = StatusSnapshot.model_validate_json((run.run_dir / "status.json").read_bytes())
    except (OSError, ValueError):
        return
    if snap.iteration == run.last_iteration:
        return
    run.last_iteration = snap.iteration
    steps = snap.counters.num_env_steps_sampled
    run.figures.timesteps = steps
    metric = "episodeReturnMean" if pop.spec.pbt is None else pop.spec.pbt.fitness.metric
    value = snap.episode_return_mean
    if metric == "evaluationReturnMean":
        info = snap.evaluation
        value = info.episode_return_mean if info is not None else None
        at = info.num_env_steps_sampled if info is not None else 0
        if value is None or at < run.readings_from or (run.history and run.history[-1][0] == at):
            return
        steps = at
    if value is None or steps < run.readings_from:
        return
    run.figures.readings.append(float(value))
    run.history.append((steps, float(value)))


def _record(root: Path, lineage: list[dict[str, Any]], decision: Decision,
            runs: list[MemberRun]) -> None:  # fmt: skip
    """A decision, once: appended to the lineage before it is acted on (a controller that
    restarts reads it back, `_replay_lineage`), then the request to the member."""
    entry = {**asdict(decision), "time": time.time()}
    with open(root / LINEAGE_FILE, "a") as f:
        f.write(json.dumps(entry) + "\n")
    lineage.append(entry)
    by_name = {r.member.name: r for r in runs}
    _advance(by_name[decision.member], decision)
    if decision.parent is not None:
        _request(decision, by_name)
        print(f"exploit: {decision.member} ({decision.fitness:.4g}) <- {decision.parent}: "
              f"{decision.reason}; {_values(decision.values)}", flush=True)  # fmt: skip


def _request(decision: Decision, by_name: dict[str, MemberRun]) -> None:
    """Ask the member to act on an exploit, unless it has the request already."""
    from impala_trainer.rundir.control import ControlRequest, read_request, write_request

    assert decision.parent is not None
    run, parent = by_name[decision.member], by_name[decision.parent]
    seq = decision.index + 1
    there = read_request(run.run_dir)
    if there is not None and there.seq >= seq:
        return
    run.run_dir.mkdir(parents=True, exist_ok=True)
    write_request(run.run_dir, ControlRequest(seq, decision.values,
                                              str(parent.run_dir / "checkpoints"),
                                              decision.parent))  # fmt: skip


def _advance(run: MemberRun, decision: Decision) -> None:
    """The member's figures after `decision`."""
    fig = run.figures
    fig.decisions = decision.index + 1
    fig.last_decision_timesteps = decision.timesteps
    if decision.parent is not None:
        fig.values = dict(decision.values)
        fig.readings = []  # its fitness from now on is its new weights', not the old ones'
        run.readings_from = decision.timesteps
        run.parent = decision.parent
        run.awaiting = decision.index + 1  # the request's seq


def _replay_lineage(root: Path, runs: list[MemberRun]) -> list[dict[str, Any]]:
    path = root / LINEAGE_FILE
    if not path.exists():
        return []
    by_name = {r.member.name: r for r in runs}
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    newest: dict[str, Decision] = {}
    for entry in entries:
        decision = Decision(**{k: v for k, v in entry.items() if k != "time"})
        if decision.member in by_name:
            _advance(by_name[decision.member], decision)
            newest[decision.member] = decision
    for decision in newest.values():  # recorded, maybe not yet asked: the controller stopped
        if decision.parent is not None:
            _request(decision, by_name)
    return entries


def _values(values: dict[str, float]) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v:.3g}" for k, v in values.items())


def _fitness_now(run: MemberRun) -> float | None:
    return run.history[-1][1] if run.history else None


def _best(runs: list[MemberRun]) -> MemberRun | None:
    scored = [r for r in runs if _fitness_now(r) is not None]
    return max(scored, key=lambda r: _fitness_now(r) or 0.0) if scored else None


def _leaderboard(runs: list[MemberRun]) -> str:
    rows = sorted(runs, key=lambda r: -(_fitness_now(r) or float("-inf")))
    lines = [f"{'MEMBER':<24}{'FITNESS':>10}{'STEPS':>12}  {'PHASE':<10}{'PARENT':<24}VALUES"]
    for r in rows:
        fit = _fitness_now(r)
        lines.append(f"{r.member.name:<24}{'-' if fit is None else f'{fit:.4g}':>10}"
                     f"{r.figures.timesteps:>12,}  {r.phase:<10}{r.parent or '-':<24}"
                     f"{_values(r.figures.values) or _values(r.member.values)}")  # fmt: skip
    return "\n".join(lines)


def population_table(summary: dict[str, Any]) -> str:
    """`population.json` as `impalajob status` prints it: the leaderboard, best first, and the
    exploits of the lineage."""
    members = sorted(summary["members"], key=lambda m: -(m["fitness"] or float("-inf")))
    lines = [f"ImpalaPopulation {summary['population']}: {len(members)} members, "
             f"{summary['exploits']} exploits",
             f"{'MEMBER':<24}{'FITNESS':>10}{'STEPS':>12}  {'PHASE':<10}{'PARENT':<24}VALUES"]
    for m in members:
        fit = "-" if m["fitness"] is None else f"{m['fitness']:.4g}"
        lines.append(f"{m['name']:<24}{fit:>10}{m['envSteps']:>12,}  {m['phase']:<10}"
                     f"{m['parent'] or '-':<24}{_values(m['values'] or m['drawn'])}")
    exploits = [e for e in summary["lineage"] if e.get("parent")]
    if exploits:
        lines.append("exploits:")
        lines += [f"  {e['member']} <- {e['parent']} at {e['timesteps']:,} env steps: "
                  f"{e['reason']}; {_values(e['values'])}" for e in exploits]
    return "\n".join(lines)  # fmt: skip


def _write_summary(pop: ImpalaPopulation, root: Path, runs: list[MemberRun],
                   lineage: list[dict[str, Any]]) -> None:  # fmt: skip
    best = _best(runs)
    summary = {
        "population": pop.name,
        "best": None if best is None else {
            "member": best.member.name, "fitness": _fitness_now(best),
            "runDir": str(best.run_dir)},
        "members": [{"name": r.member.name, "phase": r.phase, "exitCode": r.exit_code,
                     "fitness": _fitness_now(r), "envSteps": r.figures.timesteps,
                     "drawn": r.member.values, "values": r.figures.values, "parent": r.parent,
                     "curve": r.history} for r in runs],
        "exploits": sum(1 for e in lineage if e.get("parent")),
        "lineage": lineage,
    }  # fmt: skip
    tmp = root / f".{SUMMARY_FILE}.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(root / SUMMARY_FILE)
