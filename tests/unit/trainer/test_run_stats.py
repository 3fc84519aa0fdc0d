"""RunStats: stop criteria, progress, resume state, snapshot contents; the progress printer."""

from __future__ import annotations

import io

import pytest

from impala_trainer.commands.progress import ProgressReporter
from impala_trainer.job.spec import StopSpec
from impala_trainer.rundir.checkpoint import DriverState
from impala_trainer.rundir.snapshot import Membership
from impala_trainer.rundir.stats import EPISODE_WINDOW, RunStats


def test_timesteps_criterion() -> None:
    stats = RunStats("j", StopSpec(timesteps=1000))
    stats.counters.env_steps_sampled = 999
    assert stats.stop_reason() is None
    assert stats.progress() == pytest.approx(0.999)
    stats.counters.env_steps_sampled = 1000
    assert stats.stop_reason() == "timesteps"


def test_return_criterion_needs_a_full_window_of_the_newest_episodes() -> None:
    stats = RunStats("j", StopSpec(episode_return_mean=450))
    stats.add_episodes([500.0] * (EPISODE_WINDOW - 1), [500] * (EPISODE_WINDOW - 1))
    assert stats.stop_reason() is None, "99 episodes are not a 100-episode mean"
    stats.add_episodes([10.0], [10])
    assert stats.return_mean == pytest.approx((99 * 500 + 10) / 100)
    assert stats.stop_reason() == "episodeReturnMean"
    stats.add_episodes([0.0] * 20, [5] * 20)  # old episodes leave the window
    assert stats.return_mean == pytest.approx((79 * 500 + 10) / 100)
    assert stats.stop_reason() is None
    assert stats.counters.episodes == 120


def test_time_limit_and_first_criterion_wins() -> None:
    stats = RunStats("j", StopSpec(timesteps=10, time_limit_seconds=1e-9))
    assert stats.stop_reason() == "timeLimitSeconds"
    stats.counters.env_steps_sampled = 10
    assert stats.stop_reason() == "timesteps"  # both met: manifest order decides


def test_negative_return_target_progress() -> None:
    stats = RunStats("j", StopSpec(episode_return_mean=-5))
    stats.add_episodes([-21.0] * 100, [1000] * 100)
    assert stats.progress() == 0.0 and stats.stop_reason() is None
    stats.add_episodes([-1.0] * 100, [1000] * 100)
    assert stats.progress() == 1.0 and stats.stop_reason() == "episodeReturnMean"


def test_resumed_state_continues_exactly() -> None:
    first = RunStats("j", StopSpec(timesteps=100))
    first.counters.env_steps_sampled = 4096
    first.counters.learner_updates = 17
    first.add_episodes([1.0, 2.0, 3.0], [1, 2, 3])
    state = first.driver_state()
    resumed = RunStats("j", StopSpec(timesteps=100), DriverState(**vars(state)))
    assert resumed.counters == first.counters
    assert list(resumed.returns) == [1.0, 2.0, 3.0]
    assert resumed.wall_seconds() >= state.wall_seconds
    assert resumed.started_at == first.started_at


def test_snapshot_and_summary_fields() -> None:
    stats = RunStats("job", StopSpec(timesteps=100, episode_return_mean=5))
    stats.counters.env_steps_sampled = 50
    stats.add_episodes([2.0, 4.0], [20, 40])
    stats.add_policy_lag(2.0)
    stats.add_policy_lag(4.0)
    stats.set_learner_queue({"learner_queue_size_mean": 2.0, "learner_idle_fraction": 0.25}, 8)
    stats.tick()
    snap = stats.snapshot("Running", Membership(rollout_workers=2))
    assert snap.job == "job" and snap.phase == "Running"
    assert snap.episode_return_mean == 3.0 and snap.episode_len_mean == 30.0
    assert (snap.episode_return_min, snap.episode_return_max) == (2.0, 4.0)
    assert snap.policy_lag_mean == 3.0
    assert snap.learner_queue.fill == 0.25 and snap.learner_queue.learner_idle_fraction == 0.25
    assert snap.stop.criteria == {"timesteps": 100.0, "episodeReturnMean": 5.0}
    assert snap.stop.progress == pytest.approx(0.5)
    summary = stats.summary("Succeeded", "timesteps", None)
    assert summary.timesteps == 50 and summary.stopped_by == "timesteps"
    point = stats.history_point()
    assert point.env_steps == 50 and point.episode_return_mean == 3.0


def test_plain_progress_lines_when_not_a_tty() -> None:
    out = io.StringIO()
    reporter = ProgressReporter("cartpole", stream=out, tty=False, log_interval=3600)
    stats = RunStats("cartpole", StopSpec(timesteps=1000))
    stats.counters.env_steps_sampled = 250
    reporter.update(stats.snapshot("Running", Membership()))
    reporter.update(stats.snapshot("Running", Membership()))  # rate limited
    reporter.update(stats.snapshot("Succeeded", Membership()))  # the end always prints
    reporter.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "steps 250" in lines[0] and "progress 25%" in lines[0]
    assert "\x1b" not in out.getvalue()
    assert lines[1].startswith("[cartpole] succeeded")
