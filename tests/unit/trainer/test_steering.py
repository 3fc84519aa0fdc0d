"""A run steered from outside (rundir.control, driver.steering), on the in-process backend: a
request's values reach the learner's updates, another run's checkpoint is adopted with this
run's own counters, the answer is written once, and a resumed run keeps what was in effect."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from impala_api.spec import ImpalaJob
from impala_trainer.driver.launch import Wiring, build_driver
from impala_trainer.driver.local_backend import LocalBackend
from impala_trainer.rundir import checkpoint as ckpt_mod
from impala_trainer.rundir.control import (
    ControlRequest,
    read_applied,
    write_request,
)
from impala_trainer.rundir.writer import RunDir


def _job(name: str, timesteps: int, **training: Any) -> ImpalaJob:
    job = ImpalaJob.model_validate({
        "metadata": {"name": name},
        "spec": {
            "env": {"id": "CartPole-v1", "numEnvsPerWorker": 4},
            "model": {"type": "mlp", "hidden": [16]},
            "training": {"rolloutFragmentLength": 8, "trainBatchSize": 32, "lr": 1e-3,
                         **training},
            "stop": {"timesteps": timesteps},
        },
    })  # fmt: skip
    return job


def _run(job: ImpalaJob, path: Path) -> RunDir:
    run_dir = RunDir(path)
    run_dir.prepare(job)
    _run_prepared(job, run_dir)
    return run_dir


def _newest(run_dir: RunDir) -> tuple[dict[str, Any], ckpt_mod.DriverState]:
    return ckpt_mod.load_checkpoint(ckpt_mod.list_checkpoints(run_dir.checkpoints)[-1])


def test_a_request_adopts_the_winner_and_trains_with_its_values(tmp_path: Path) -> None:
    winner = _run(_job("winner", 3_000), tmp_path / "winner")
    winner_state, _ = _newest(winner)
    winner_version = winner_state["policies"]["default"]["policy_version"]

    loser_dir = tmp_path / "loser"
    loser = RunDir(loser_dir)
    job = _job("loser", 1_000)
    loser.prepare(job)
    write_request(loser_dir, ControlRequest(1, {"training.lr": 2.5e-4}, str(winner.checkpoints),
                                            parent="winner"))  # fmt: skip
    _run_prepared(job, loser)

    applied = read_applied(loser_dir)
    assert applied is not None and applied.seq == 1 and applied.parent == "winner"
    assert applied.adopted == str(ckpt_mod.list_checkpoints(winner.checkpoints)[-1])
    state, driver_state = _newest(loser)
    own = state["policies"]["default"]
    # Its own counters: the updates of its own 1,000 env steps, not the winner's on top.
    assert own["policy_version"] < winner_version
    asked = {"seq": 1, "values": {"training.lr": 2.5e-4}, "adopt": str(winner.checkpoints),
             "parent": "winner"}  # fmt: skip
    assert driver_state.control == asked
    status = json.loads((loser_dir / "status.json").read_text())
    assert status["learner"]["default/cur_lr"] == 2.5e-4
    # Adam's step counts went on from the winner's: its optimiser state was adopted.
    steps = own["optimizers"][0]["state"][0]["step"]
    assert float(torch.as_tensor(steps)) > own["policy_version"]


def _run_prepared(job: ImpalaJob, run_dir: RunDir, resume: bool = False) -> None:
    driver = build_driver(job, run_dir, LocalBackend(rollout_units=1),
                          Wiring(rollout_workers=1, resume=resume))  # fmt: skip
    result = driver.run()
    assert result.phase == "Succeeded", result.message


def test_a_resumed_run_trains_with_the_values_in_effect_and_applies_a_request_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "member"
    run_dir = RunDir(path)
    job = _job("member", 1_000)
    run_dir.prepare(job)
    write_request(path, ControlRequest(3, {"training.lr": 3e-4, "training.entropyCoeff": 0.02}))
    _run_prepared(job, run_dir)
    first = read_applied(path)
    assert first is not None and first.seq == 3 and first.adopted is None

    job.spec.stop.timesteps = 2_000
    (path / "control-applied.json").unlink()
    _run_prepared(job, run_dir, resume=True)
    assert read_applied(path) is None  # request 3 was in effect: not applied again
    status = json.loads((path / "status.json").read_text())
    assert status["learner"]["default/cur_lr"] == 3e-4
    assert status["learner"]["default/entropy_coeff"] == 0.02
