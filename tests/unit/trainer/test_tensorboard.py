"""The run directory's TensorBoard event files, read back with TensorBoard's own loader."""

from __future__ import annotations

import time
from pathlib import Path

# TensorBoard is a dev dependency (pyproject): missing, this fails at import, it never skips.
from tensorboard.backend.event_processing import event_accumulator

from impala_api.snapshot import HistoryPoint
from impala_trainer.rundir.tensorboard import EventFileWriter, crc32c
from impala_trainer.rundir.writer import RunDir


def _scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return {
        tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
    }


def test_crc32c_matches_the_castagnoli_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0


def test_scalars_read_back_through_tensorboard(tmp_path: Path) -> None:
    writer = EventFileWriter(tmp_path)
    writer.add_scalars(0, {"a": 1.5, "b": None})
    writer.add_scalars(2**40, {"a": -2.25, "b": 3.0})  # env-step counts beyond int32
    assert _scalars(tmp_path) == {"a": [(0, 1.5), (2**40, -2.25)], "b": [(2**40, 3.0)]}


def test_history_lines_become_scalars_of_return_throughput_losses_and_queue(
    tmp_path: Path,
) -> None:
    run = RunDir(tmp_path / "run", history_interval=0.0)
    run.path.mkdir()
    for steps, ret in ((1_000, None), (2_000, -20.5), (3_000, -19.0)):
        run.append_history(
            HistoryPoint(
                time=time.time(),
                wall_seconds=1.0,
                env_steps=steps,
                episodes=steps // 1_000,
                learner_updates=steps // 500,
                episode_return_mean=ret,
                env_steps_per_s=1500.0,
                trained_steps_per_s=1400.0,
                learner_queue_fill=0.25,
                policy_loss=0.5,
                vf_loss=4.0,
                entropy=1.75,
            ),
            force=True,
        )
    scalars = _scalars(run.tensorboard_dir)
    assert scalars["episode/return_mean"] == [(2_000, -20.5), (3_000, -19.0)]
    assert [s for s, _ in scalars["throughput/env_steps_per_s"]] == [1_000, 2_000, 3_000]
    assert scalars["learner/entropy"][-1] == (3_000, 1.75)
    assert scalars["learner_queue/fill"][-1] == (3_000, 0.25)
    assert {"learner/policy_loss", "learner/vf_loss", "learner/updates"} <= set(scalars)
    run.clear()
    assert not run.tensorboard_dir.exists()


def test_an_evaluation_episode_is_an_animated_gif_in_the_images_dashboard(tmp_path: Path) -> None:
    import numpy as np

    from impala_trainer.policy.video import preview_gif

    frames = [np.full((400, 600, 3), i * 20, np.uint8) for i in range(12)]
    gif, height, width = preview_gif(frames, max_width=240)
    assert (height, width) == (160, 240) and gif[:6] == b"GIF89a"
    run = RunDir(tmp_path / "run", history_interval=0.0)
    run.path.mkdir()
    run.add_video_preview(12_000, gif, height, width)
    acc = event_accumulator.EventAccumulator(str(run.tensorboard_dir), size_guidance={"images": 0})
    acc.Reload()
    (image,) = acc.Images("evaluation/episode")
    assert (image.step, image.height, image.width) == (12_000, 160, 240)
    assert image.encoded_image_string == gif
