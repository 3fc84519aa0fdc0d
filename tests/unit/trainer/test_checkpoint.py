"""Checkpoint round trip through a real Learner, atomicity and retention; run-dir writes."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from impala_api.snapshot import HistoryPoint, StatusSnapshot, Summary
from impala_trainer.batches import concat_fragments
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.rollouts.worker import RolloutWorker
from impala_trainer.rundir.checkpoint import (
    DriverState,
    Restored,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_newest_readable,
    save_checkpoint,
)
from impala_trainer.rundir.writer import RunDir
from tests.support.jobs import make_job, make_spec

SPEC = make_spec(
    env={"numEnvsPerWorker": 4}, model={"hidden": [16]}, training={"rolloutFragmentLength": 10}
)


def _trained_learner() -> Learner:
    worker = RolloutWorker(SPEC, "w", seed=0)
    learner = Learner(LearnerConfig.of(SPEC), worker.models["default"].obs_shape,
                      worker.models["default"].actions)  # fmt: skip
    for _ in range(3):
        learner.learn_on_batch(concat_fragments([worker.sample()]))
    learner.global_timestep = 120
    return learner


def test_round_trip_restores_model_optimiser_and_counters(tmp_path: Path) -> None:
    learner = _trained_learner()
    state = DriverState(
        counters={"num_env_steps_sampled": 120, "learner_updates": 3, "episodes": 5},
        wall_seconds=12.5,
        episode_returns=[10.0, 20.0],
        episode_lengths=[10, 20],
        iteration=7,
        started_at=1000.0,
    )
    path = save_checkpoint(tmp_path, learner.state_dict(), state, keep=3)
    restored_state, restored = load_checkpoint(path)
    assert restored == state

    fresh = Learner(LearnerConfig.of(SPEC), (4,), 2)
    fresh.load_state_dict(restored_state)
    assert fresh.policy_version == 3 and fresh.global_timestep == 120
    for k, v in learner.get_weights().items():
        np.testing.assert_array_equal(fresh.get_weights()[k], v)
    # The optimiser moments came back too: the next step from both is identical.
    batch = concat_fragments([RolloutWorker(SPEC, "w", seed=1).sample()])
    learner.learn_on_batch(batch)
    fresh.learn_on_batch(batch)
    for k, v in learner.get_weights().items():
        np.testing.assert_allclose(fresh.get_weights()[k], v, rtol=1e-6, atol=1e-7)


def test_keeps_only_newest_and_latest_is_highest(tmp_path: Path) -> None:
    learner = Learner(LearnerConfig.of(SPEC), (4,), 2)
    for i in range(5):
        save_checkpoint(tmp_path, learner.state_dict(), DriverState(iteration=i), keep=2)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["ckpt-000004", "ckpt-000005"]
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and load_checkpoint(latest)[1].iteration == 4


def test_incomplete_checkpoints_are_ignored(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    learner = Learner(LearnerConfig.of(SPEC), (4,), 2)
    good = save_checkpoint(tmp_path, learner.state_dict(), DriverState(), keep=3)
    (tmp_path / "ckpt-000009").mkdir()  # no files: a crash before they were written
    (tmp_path / ".tmp-ckpt-abc").mkdir()
    assert latest_checkpoint(tmp_path) == good
    nxt = save_checkpoint(tmp_path, learner.state_dict(), DriverState(), keep=3)
    assert nxt.name == "ckpt-000002" and not (tmp_path / ".tmp-ckpt-abc").exists()
    assert torch.load(nxt / "learner.pt", weights_only=True)["policy_version"] == 0


def test_run_dir_writes_config_status_history_summary(tmp_path: Path) -> None:
    job = make_job("t", training={"lr": 0.01})
    run = RunDir(tmp_path / "run", status_interval=3600, history_interval=3600)
    run.prepare(job)
    assert "lr: 0.01" in (run.path / "config.yaml").read_text()
    assert run.write_status(StatusSnapshot(job="t", iteration=1))
    assert not run.write_status(StatusSnapshot(job="t", iteration=2))  # rate limited
    assert run.write_status(StatusSnapshot(job="t", iteration=3), force=True)
    assert json.loads(run.status_file.read_text())["iteration"] == 3
    for i in range(3):
        run.append_history(HistoryPoint(time=i, wall_seconds=i, env_steps=i), force=True)
    lines = run.history_file.read_text().splitlines()
    assert [json.loads(x)["env_steps"] for x in lines] == [0, 1, 2]
    run.write_summary(Summary(job="t", timesteps=5, wall_seconds=1.0, stopped_by="timesteps"))
    assert json.loads(run.summary_file.read_text())["stopped_by"] == "timesteps"
    assert run.has_previous_run()
    # Resumed (a new learner on the same directory): the last process's live snapshot and its
    # summary go, the curve and the checkpoints stay.
    RunDir(run.path).prepare(job)
    assert not run.status_file.exists() and not run.summary_file.exists()
    assert [json.loads(x)["env_steps"] for x in run.history_file.read_text().splitlines()] == [
        0, 1, 2,
    ]  # fmt: skip
    run.clear()
    assert not run.has_previous_run() and not run.history_file.exists()


def test_the_run_log_goes_to_its_own_directory_and_a_pods_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """trainer.log beside the results; in a learner pod also stderr (`kubectl logs`); a second
    run in the same process logs to its own directory only."""
    log = logging.getLogger("impala_trainer.driver.impala")
    first, second = RunDir(tmp_path / "a"), RunDir(tmp_path / "b")
    try:
        for run in (first, second):
            run.path.mkdir()
        first.log_to_file()
        log.info("first run")
        second.log_to_file(also_stderr=True)
        log.info("learner on cpu, in a process of its own")
        assert "learner on cpu" in capsys.readouterr().err
        assert "first run" in (first.path / "trainer.log").read_text()
        assert "learner on cpu" not in (first.path / "trainer.log").read_text()
        assert "learner on cpu" in (second.path / "trainer.log").read_text()
    finally:
        parent = logging.getLogger("impala_trainer")
        for handler in list(parent.handlers):
            parent.removeHandler(handler)
            handler.close()
        parent.propagate = True
        parent.setLevel(logging.NOTSET)


def _three_checkpoints(tmp_path: Path) -> tuple[Path, Learner]:
    learner = _trained_learner()
    ckpts = tmp_path / "checkpoints"
    for steps in (100, 200, 300):
        state = DriverState(counters={"num_env_steps_sampled": steps})
        save_checkpoint(ckpts, learner.state_dict(), state, keep=5)
    return ckpts, learner


def test_a_truncated_newest_checkpoint_is_set_aside_and_the_one_before_it_used(
    tmp_path: Path,
) -> None:
    ckpts, _ = _three_checkpoints(tmp_path)
    newest = latest_checkpoint(ckpts)
    assert newest is not None
    data = (newest / "learner.pt").read_bytes()
    (newest / "learner.pt").write_bytes(data[: len(data) // 2])  # the volume lost the tail
    restored = load_newest_readable(ckpts)
    assert isinstance(restored, Restored)
    assert restored.path.name == "ckpt-000002"
    assert restored.state.counters["num_env_steps_sampled"] == 200
    assert len(restored.skipped) == 1 and restored.skipped[0].startswith("ckpt-000003 (")
    # Set aside, not deleted, and never picked again; the next save does not collide with it.
    assert (ckpts / ".corrupt-ckpt-000003").is_dir()
    assert [p.name for p in list_checkpoints(ckpts)] == ["ckpt-000001", "ckpt-000002"]
    save_checkpoint(ckpts, restored.learner_state, restored.state, keep=5)
    assert latest_checkpoint(ckpts) == ckpts / "ckpt-000003"


def test_no_readable_checkpoint_gives_the_reasons(tmp_path: Path) -> None:
    ckpts, _ = _three_checkpoints(tmp_path)
    for path in list_checkpoints(ckpts):
        (path / "state.json").write_text('{"counters": ')  # cut mid-write
    reasons = load_newest_readable(ckpts)
    assert isinstance(reasons, tuple) and len(reasons) == 3
    assert "JSONDecodeError" in reasons[0]
    assert load_newest_readable(tmp_path / "none") is None


def test_a_full_volume_fails_the_write_and_keeps_the_older_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpts, learner = _three_checkpoints(tmp_path)

    real_write_bytes = Path.write_bytes

    def full(path: Path, data: bytes | memoryview) -> int:
        # What a full volume does: some bytes land, then ENOSPC. (torch.save's own file writer
        # would raise a RuntimeError here instead; the weights are written as plain bytes.)
        real_write_bytes(path, bytes(data)[:64])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(ckpts, learner.state_dict(), DriverState(), keep=2)
    # Nothing pruned, no half checkpoint left behind.
    assert [p.name for p in list_checkpoints(ckpts)] == [
        "ckpt-000001", "ckpt-000002", "ckpt-000003",
    ]  # fmt: skip
    assert not list(ckpts.glob(".tmp-ckpt-*"))


def test_an_append_that_fills_the_volume_part_way_is_cut_back_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """history.jsonl and the TensorBoard event file take whole lines and records or nothing: a
    write that stops part-way (ENOSPC after some bytes) would otherwise leave half a line that
    the next append joins into garbage."""
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    point = HistoryPoint(time=1.0, wall_seconds=1.0, env_steps=10, episodes=1)
    run.append_history(point, force=True)
    sizes = {p: p.stat().st_size for p in [run.history_file, *run.tensorboard_dir.iterdir()]}
    real_write = os.write

    def half_then_full(fd: int, data: bytes | memoryview) -> int:
        if len(data) > 1:
            return real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        run.append_history(point.model_copy(update={"env_steps": 20}), force=True)
    assert {p: p.stat().st_size for p in sizes} == sizes
    monkeypatch.setattr(os, "write", real_write)
    run.append_history(point.model_copy(update={"env_steps": 30}), force=True)
    lines = run.history_file.read_text().splitlines()
    assert [json.loads(line)["env_steps"] for line in lines] == [10, 30]
