"""A user's own environment trains for real: `impalajob train` on `module:Env-vN` with a wrapper
of theirs and a Dict observation (flattened), their package on PYTHONPATH only (the driver and
every Ray rollout worker import it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.jobs import job_manifest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.train
def test_a_module_env_with_a_wrapper_trains_to_its_best_return(tmp_path: Path) -> None:
    # Corridor's best return is 0.95 (six cells, 0.01 a step); the wrapper doubles every reward,
    # so 1.8 is reached only by the wrapped env, and only once the policy walks straight on.
    env = {
        "id": "tests.support.corridor:DictCorridor-v0",
        "numEnvsPerWorker": 8,
        "wrappers": [{"import": "tests.support.corridor:RewardScale", "kwargs": {"scale": 2.0}}],
    }
    manifest = tmp_path / "corridor.yaml"
    stop = {"episodeReturnMean": 1.8, "timesteps": 400_000}
    manifest.write_text(yaml.safe_dump(job_manifest("corridor", env=env, stop=stop)))
    run = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "impala_cli.main", "train", "-f", str(manifest), "--run-dir",
         str(run)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_by"] == "episodeReturnMean", summary
    assert summary["episode_return_mean"] >= 1.8
    status = json.loads((run / "status.json").read_text())
    assert status["membership"]["rollout_workers"] >= 1  # sampled by Ray workers, not the driver
