"""`impalajob train -f population.yaml` on one embedded Ray: the members run as ImpalaJobs of
their own, PBT's exploit moves the winner's real weights into the loser's running learner (its
return jumps), and the lineage and leaderboard say so. Everything is counted in env steps, not
seconds: how fast the machine samples changes none of what is asserted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

TIMEOUT = 900  # generous: the machines these run on are shared and noisy


def _population(tmp_path: Path) -> Path:
    manifest = {
        "apiVersion": "impala.dev/v1alpha1",
        "kind": "ImpalaPopulation",
        "metadata": {"name": "pbt"},
        "spec": {
            "members": 2,
            "template": {
                "env": {"id": "CartPole-v1", "numEnvsPerWorker": 8},
                "model": {"type": "mlp", "hidden": [64, 64]},
                "training": {"rolloutFragmentLength": 16, "trainBatchSize": 128,
                             "separateVfOptimizer": True, "lrVf": 0.005},
                "stop": {"timesteps": 200_000},
                "checkpoint": {"intervalSeconds": 2},
            },
            # One member that learns, one whose rate is far too small to.
            "search": {"parameters": {"training.lr": {"grid": [2e-3, 1e-5]}}},
            "pbt": {"readyIntervalTimesteps": 10_000, "burnInTimesteps": 10_000,
                    "selection": {"method": "tournament", "margin": 0.0, "noiseSigmas": 0.0},
                    "mutations": {"training.lr": {}}, "fitness": {"window": 1}},
        },
    }  # fmt: skip
    path = tmp_path / "population.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def _history(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


def test_an_exploit_moves_the_winners_weights_into_the_running_loser(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    res = subprocess.run(
        [sys.executable, "-m", "impala_cli.main", "train", "-f", str(_population(tmp_path)),
         "--run-dir", str(root)],
        capture_output=True, text=True, timeout=TIMEOUT, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((root / "population.json").read_text())
    assert [m["phase"] for m in summary["members"]] == ["Succeeded", "Succeeded"]
    lineage = [json.loads(line) for line in (root / "lineage.jsonl").read_text().splitlines()]
    exploits = [d for d in lineage if d["parent"]]
    # The first: the member that cannot learn copies the one that can (later the two may trade
    # places: a CartPole run at these rates can collapse, and then it copies the other).
    assert exploits and (exploits[0]["member"], exploits[0]["parent"]) == ("pbt-1", "pbt-0")
    assert summary["exploits"] == len(exploits)

    loser = root / "pbt-1"
    applied = json.loads((loser / "control-applied.json").read_text())
    assert applied["parent"] == "pbt-0" and applied["error"] is None
    assert applied["adopted"].startswith(str(root / "pbt-0" / "checkpoints"))
    # Its newest answer: a later exploit may come too close to its end to be applied.
    assert 1 <= applied["seq"] <= sum(1 for d in exploits if d["member"] == "pbt-1")
    # Its own counters: it ended at its own 200K env steps.
    history = _history(loser)
    assert history[-1]["env_steps"] >= 200_000
    # What the loser played up to its first exploit, and from 30K env steps after it applied
    # it (its log says where; control-applied.json holds the newest answer only).
    log = (loser / "trainer.log").read_text()
    match = re.search(r"control request 1 applied at (\d+) env steps", log)
    assert match, log[-2000:]
    applied_at, decided_at = int(match.group(1)), exploits[0]["timesteps"]
    before = [p["episode_return_mean"] for p in history
              if p["episode_return_mean"] is not None and p["env_steps"] <= decided_at]
    after = [p["episode_return_mean"] for p in history
             if p["episode_return_mean"] is not None and applied_at + 30_000 <= p["env_steps"]]
    assert before and after
    assert max(after) > 3 * max(before), (before[-3:], after[:3])
    # Its rate from then on: the winner's, perturbed by 1.2 or 1/1.2, not its own 1e-5.
    lr = exploits[0]["values"]["training.lr"]
    assert any(abs(lr - 2e-3 * f) < 1e-9 for f in (1.2, 1 / 1.2))
