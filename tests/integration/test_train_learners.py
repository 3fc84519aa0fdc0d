"""learner.replicas on an embedded Ray: `impalajob train` with two learners in lock step.

The CLI runs as a subprocess, as a user runs it: two learner actors (processes of their own on
the `learner` resource) form a gloo group, each trains batches of its own, and learner 0's
weights go to the rollouts and into the checkpoints, which resume with one learner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

EXAMPLE = "manifests/examples/cartpole.yaml"
TIMEOUT = 900  # generous: the machines these run on are shared and noisy

pytestmark = [pytest.mark.slow, pytest.mark.train]


def _train(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(
        [sys.executable, "-m", "impala_cli.main", "train", "-f", EXAMPLE, *args],
        capture_output=True, text=True, timeout=TIMEOUT, env=env,
    )  # fmt: skip


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def test_two_learners_solve_cartpole_and_their_checkpoint_resumes_with_one(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    first = _train("--run-dir", str(run), "--set", "learner.replicas=2")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "episodeReturnMean reached" in first.stdout
    log = (run / "trainer.log").read_text()
    assert "2 learners in lock step" in log

    summary = _json(run / "summary.json")
    assert summary["phase"] == "Succeeded" and summary["episode_return_mean"] >= 450
    c1 = _json(run / "status.json")["counters"]
    # One optimiser step trains a batch of trainBatchSize on each learner.
    assert c1["num_env_steps_trained"] == 2 * 128 * c1["learner_updates"] > 0
    assert c1["policy_version"] == c1["learner_updates"]

    more = c1["num_env_steps_sampled"] + 20_000
    alone = ["--set", "learner.replicas=1", "--set", "stop.episodeReturnMean=null"]
    second = _train("--run-dir", str(run), "--resume", *alone, "--set", f"stop.timesteps={more}")
    assert second.returncode == 0, second.stdout + second.stderr
    c2 = _json(run / "status.json")["counters"]
    assert c2["learner_updates"] > c1["learner_updates"]
    # The optimiser steps go on from the two learners' count: one state, resumed exactly.
    assert c2["policy_version"] == c2["learner_updates"]
    trained_alone = c2["num_env_steps_trained"] - c1["num_env_steps_trained"]
    assert trained_alone == 128 * (c2["learner_updates"] - c1["learner_updates"])


def test_a_learner_killed_fails_the_run_with_a_checkpoint_not_a_hang(tmp_path: Path) -> None:
    """SIGKILL to one learner's process: its peer's all-reduce fails at once (its connection is
    gone), and the run fails naming the learner, its checkpoints kept, instead of hanging."""
    import signal
    import time

    import psutil

    run = tmp_path / "run"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    sets = ["learner.replicas=2", "stop.episodeReturnMean=null", "stop.timeLimitSeconds=300",
            "checkpoint.intervalSeconds=5"]  # fmt: skip
    cmd = [sys.executable, "-m", "impala_cli.main", "train", "-f", EXAMPLE, "--run-dir", str(run)]
    cmd += [arg for s in sets for arg in ("--set", s)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        learners: list[psutil.Process] = []
        while time.monotonic() < deadline and len(learners) < 2:
            time.sleep(1)
            # This run's own (Ray's workers are children of its raylet, started by the CLI).
            learners = [p for p in psutil.Process(proc.pid).children(recursive=True)
                        if "LearnerActor" in " ".join(p.cmdline())]  # fmt: skip
        assert len(learners) == 2, "two learner actors never started"
        status = run / "status.json"
        while time.monotonic() < deadline:  # training, and a checkpoint written
            if status.exists() and _json(status).get("checkpoint"):
                break
            time.sleep(0.5)
        killed = time.monotonic()
        learners[1].send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
        ended = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    summary = _json(run / "summary.json")
    assert summary["phase"] == "Failed" and "learner" in summary["message"], summary
    assert ended < 60, f"the run took {ended:.0f} s to fail after a learner died"
    assert sorted((run / "checkpoints").glob("ckpt-*")), "the checkpoints before it are kept"
