"""The Pong example runs end to end (not to convergence): frames through the CNN learner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.train]


def test_pong_example_trains_briefly(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = subprocess.run(
        [
            sys.executable, "-m", "impala_cli.main", "train",
            "-f", "manifests/examples/pong.yaml", "--run-dir", str(run),
            # Small fragments and batches: a few CNN updates in a short run on a CPU learner.
            "--set", "env.numEnvsPerWorker=4", "--set", "training.rolloutFragmentLength=25",
            "--set", "training.trainBatchSize=200", "--set", "stop.timesteps=3000",
        ],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    status = json.loads((run / "status.json").read_text())
    assert status["stop"]["stopped_by"] == "timesteps"
    assert status["counters"]["num_env_steps_sampled"] >= 3000
    assert status["counters"]["learner_updates"] >= 1
    assert status["learner"]["default/entropy"] > 0
    assert "ALE/Pong-v5" in (run / "config.yaml").read_text()
    assert list((run / "checkpoints").glob("ckpt-*/learner.pt"))
