"""The local population controller's records: a decision is written to the lineage once, before
the member is asked; a controller that restarts reads the lineage back, takes no decision again,
and asks again a member it had not asked yet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from impala_api.manifest import parse_population
from impala_api.population.pbt import Decision
from impala_cli.commands.population_run import (
    LINEAGE_FILE,
    _prepare,
    _read,
    _record,
    _replay_lineage,
)
from impala_trainer.rundir.control import Applied, read_request, write_applied


def _population() -> Any:
    return parse_population({
        "apiVersion": "impala.dev/v1alpha1", "kind": "ImpalaPopulation",
        "metadata": {"name": "pop"},
        "spec": {"members": 2, "template": {"stop": {"timesteps": 10_000}},
                 "search": {"parameters": {"training.lr": {"grid": [1e-3, 1e-5]}}},
                 "pbt": {"readyIntervalTimesteps": 1000, "mutations": {"training.lr": {}}}},
    })  # fmt: skip


def _exploit() -> Decision:
    return Decision(member="pop-1", index=0, timesteps=4000, fitness=20.0, parent="pop-0",
                    parent_fitness=90.0, values={"training.lr": 1.2e-3}, reason="test")  # fmt: skip


def test_a_decision_is_recorded_once_and_read_back(tmp_path: Path) -> None:
    pop = _population()
    runs = _prepare(pop, tmp_path, resume=False, overwrite=False)
    assert [r.figures.values for r in runs] == [{"training.lr": 1e-3}, {"training.lr": 1e-5}]
    lineage: list[dict[str, Any]] = []
    _record(tmp_path, lineage, _exploit(), runs)
    (line,) = (tmp_path / LINEAGE_FILE).read_text().splitlines()
    assert json.loads(line)["parent"] == "pop-0"
    request = read_request(tmp_path / "pop-1")
    assert request is not None and request.seq == 1 and request.parent == "pop-0"
    assert request.adopt == str(tmp_path / "pop-0" / "checkpoints")
    loser = runs[1]
    assert loser.figures.decisions == 1 and loser.figures.values == {"training.lr": 1.2e-3}
    assert loser.awaiting == 1

    # The controller restarts before the member read its request, which is lost too.
    (tmp_path / "pop-1" / "control.json").unlink()
    again = _prepare(pop, tmp_path, resume=True, overwrite=False)
    entries = _replay_lineage(tmp_path, again)
    assert len(entries) == 1 and again[1].figures.decisions == 1 and again[1].parent == "pop-0"
    asked = read_request(tmp_path / "pop-1")
    assert asked is not None and asked.seq == 1  # asked again, the same request
    assert len((tmp_path / LINEAGE_FILE).read_text().splitlines()) == 1  # not decided again


def test_readings_count_from_where_the_member_applied_its_exploit(tmp_path: Path) -> None:
    pop = _population()
    runs = _prepare(pop, tmp_path, resume=False, overwrite=False)
    _record(tmp_path, [], _exploit(), runs)
    loser = runs[1]
    status = {"job": "pop-1", "iteration": 5,
              "counters": {"num_env_steps_sampled": 9000}, "episode_return_mean": 30.0}
    (loser.run_dir / "status.json").write_text(json.dumps(status))
    _read(pop, loser)
    assert loser.figures.readings == []  # not answered yet: still its old weights' return
    write_applied(loser.run_dir, Applied(seq=1, timesteps=8000, adopted="x", parent="pop-0"))
    _read(pop, loser)
    assert loser.figures.readings == [30.0] and loser.readings_from == 8000
    assert loser.figures.last_decision_timesteps == 8000 and loser.awaiting is None


def test_status_of_a_local_population_prints_its_leaderboard_and_exploits(
    tmp_path: Path, capsys: Any
) -> None:
    from impala_cli.commands.population_run import _write_summary
    from impala_cli.main import main

    pop = _population()
    runs = _prepare(pop, tmp_path, resume=False, overwrite=False)
    lineage: list[dict[str, Any]] = []
    _record(tmp_path, lineage, _exploit(), runs)
    runs[0].history, runs[1].history = [(5000, 90.0)], [(4000, 20.0)]
    _write_summary(pop, tmp_path, runs, lineage)
    capsys.readouterr()  # the exploit's own line
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ImpalaPopulation pop: 2 members, 1 exploits")
    rows = out.splitlines()
    assert rows[2].startswith("pop-0") and rows[3].startswith("pop-1")  # best first
    assert "pop-1 <- pop-0 at 4,000 env steps: test; lr=0.0012" in out
