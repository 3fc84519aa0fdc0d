"""RunStats: stop criteria, progress, resume state, snapshot contents; the progress printer."""

from __future__ import annotations

import io

import pytest

from impala_api.snapshot import (
    Counters,
    EvaluationInfo,
    Membership,
    Throughput,
    duration_text,
)
from impala_api.spec import StopSpec
from impala_cli.commands.progress import ProgressReporter
from impala_trainer.learners.learner_thread import WindowStat
from impala_trainer.rundir.checkpoint import DriverState
from impala_trainer.rundir.stats import EPISODE_WINDOW, RunStats


def test_timesteps_criterion() -> None:
    stats = RunStats("j", StopSpec(timesteps=1000))
    stats.counters.num_env_steps_sampled = 999
    assert stats.stop_reason() is None
    assert stats.progress() == pytest.approx(0.999)
    stats.counters.num_env_steps_sampled = 1000
    assert stats.stop_reason() == "timesteps"


def test_the_time_left_is_the_sooner_of_the_steps_at_the_recent_rate_and_the_time_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stats = RunStats("j", StopSpec(timesteps=10_000, time_limit_seconds=600))
    monkeypatch.setattr(stats, "wall_seconds", lambda: 120.0)
    stats.counters.num_env_steps_sampled = 4_000
    assert stats.remaining_seconds() == pytest.approx(480)  # nothing sampled lately: the limit
    stats.throughput = Throughput(env_steps_per_s=100.0)
    assert stats.remaining_seconds() == pytest.approx(60)  # 6,000 steps at 100/s
    assert stats.foreseeable_progress() == pytest.approx(0.4)
    stats.throughput = Throughput(env_steps_per_s=1.0)
    assert stats.remaining_seconds() == pytest.approx(480)
    stop = stats.snapshot("Running", Membership()).stop
    assert (stop.foreseeable, stop.remaining_seconds) == (pytest.approx(0.4), pytest.approx(480))


def test_a_return_criterion_alone_has_no_foreseeable_end() -> None:
    """Nobody knows when a return will be reached: no percent, no time left (the progress
    toward the return stays what the bar shows)."""
    stats = RunStats("j", StopSpec(episode_return_mean=450, time_limit_seconds=None))
    stats.throughput = Throughput(env_steps_per_s=100.0)
    stop = stats.snapshot("Running", Membership()).stop
    assert stop.foreseeable is None and stop.remaining_seconds is None
    assert RunStats("j", StopSpec(timesteps=10)).remaining_seconds() is None  # no rate yet


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (44.6, "45s"), (200, "3m20s"), (3900, "1h05m"), (3 * 86400 + 7300, "3d2h")],
)
def test_durations_read_as_kubectl_prints_them(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


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


def test_a_return_criterion_on_one_policy_follows_its_agents_returns() -> None:
    stats = RunStats("j", StopSpec(episode_return_mean=0.8, policy="main"))
    stats.add_episodes([5.0] * EPISODE_WINDOW, [9] * EPISODE_WINDOW)  # the team's: not it
    stats.add_policy_returns({"main": [1.0] * 60, "other": [-1.0] * 60})
    assert stats.stop_reason() is None and stats.progress() == pytest.approx(0.6 / 0.8)
    stats.add_policy_returns({"main": [1.0] * 40})
    assert stats.stop_reason() == "episodeReturnMean"
    snap = stats.snapshot("Running", Membership())
    assert snap.stop.policy == "main" and snap.stop.progress == 1.0


def test_time_limit_and_first_criterion_wins() -> None:
    stats = RunStats("j", StopSpec(timesteps=10, time_limit_seconds=1e-9))
    assert stats.stop_reason() == "timeLimitSeconds"
    stats.counters.num_env_steps_sampled = 10
    assert stats.stop_reason() == "timesteps"  # both met: manifest order decides


def test_negative_return_target_progress() -> None:
    stats = RunStats("j", StopSpec(episode_return_mean=-5))
    stats.add_episodes([-21.0] * 100, [1000] * 100)
    assert stats.progress() == 0.0 and stats.stop_reason() is None
    stats.add_episodes([-1.0] * 100, [1000] * 100)
    assert stats.progress() == 1.0 and stats.stop_reason() == "episodeReturnMean"


def test_resumed_state_continues_exactly() -> None:
    first = RunStats("j", StopSpec(timesteps=100))
    first.counters.num_env_steps_sampled = 4096
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
    stats.counters.num_env_steps_sampled = 50
    stats.add_episodes([2.0, 4.0], [20, 40])
    stats.add_policy_lag(2.0)
    stats.add_policy_lag(4.0)
    size = WindowStat("size")
    for n in (1, 2, 3):
        size.push(n)
    stats.set_learner_queue(size.stats(), 8, idle_fraction=0.25)
    stats.tick()
    snap = stats.snapshot("Running", Membership(rollout_workers=2))
    assert snap.job == "job" and snap.phase == "Running"
    assert snap.episode_return_mean == 3.0 and snap.episode_len_mean == 30.0
    assert (snap.episode_return_min, snap.episode_return_max) == (2.0, 4.0)
    assert snap.policy_lag_mean == 3.0
    q = snap.learner_queue
    assert q.fill == 0.25 and q.learner_idle_fraction == 0.25
    # RLlib's learner_queue keys: size_count/mean/std/quantiles (0, 10, 50, 90, 100th).
    assert (q.size_count, q.size_mean) == (3, 2.0)
    assert q.size_std == pytest.approx((2 / 3) ** 0.5)
    assert q.size_quantiles == pytest.approx([1.0, 1.2, 2.0, 2.8, 3.0])
    assert snap.stop.criteria == {"timesteps": 100.0, "episodeReturnMean": 5.0}
    assert snap.stop.progress == pytest.approx(0.5)
    summary = stats.summary("Succeeded", "timesteps", None)
    assert summary.timesteps == 50 and summary.stopped_by == "timesteps"
    point = stats.history_point()
    assert point.env_steps == 50 and point.episode_return_mean == 3.0


def test_rollout_busy_fraction_is_the_actors_share_of_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr("impala_trainer.rundir.stats.time.monotonic", lambda: clock[0])
    stats = RunStats("j", StopSpec(timesteps=100))
    stats.tick(2)
    clock[0] += 2.0
    for _ in range(10):  # 1 s of work from 2 actors over 2 s
        stats.add_rollout_busy(0.1)
    stats.tick(2)
    assert stats.throughput.rollout_busy_fraction == pytest.approx(0.25)
    stats.tick(0)  # no actors: nothing to share out
    assert stats.throughput.rollout_busy_fraction == 0.0
    clock[0] += 1.0
    stats.add_rollout_busy(9.0)  # a long fragment counted when it arrives: capped
    stats.tick(1)
    assert stats.throughput.rollout_busy_fraction == 1.0


def test_learner_stats_are_the_mean_over_a_snapshots_updates() -> None:
    """RLlib's LearnerInfoBuilder: an iteration reports the mean of its updates' stats; with no
    update since, the previous means stay."""
    stats = RunStats("job", StopSpec(timesteps=100))
    stats.add_learner_stats({"default/entropy": 1.0, "default/vf_loss": 4.0})
    stats.add_learner_stats({"default/entropy": 3.0, "default/vf_loss": 8.0})
    means = {"default/entropy": 2.0, "default/vf_loss": 6.0}
    assert stats.snapshot("Running", Membership()).learner == means
    assert stats.history_point().entropy == 2.0  # the main policy's
    assert stats.snapshot("Running", Membership()).learner == means
    stats.add_learner_stats({"default/entropy": 0.5, "default/vf_loss": 1.0})
    later = {"default/entropy": 0.5, "default/vf_loss": 1.0}
    assert stats.snapshot("Running", Membership()).learner == later


def test_a_policy_without_an_update_in_a_window_keeps_its_learner_stats() -> None:
    """Each policy's learner steps on its own: a window in which only the prey stepped (a busy
    machine's last seconds) still reports the predator's last means beside the prey's new ones."""
    stats = RunStats("job", StopSpec(timesteps=100))
    stats.add_learner_stats({"predator/total_loss": 2.0})
    stats.add_learner_stats({"prey/total_loss": 4.0})
    assert stats.snapshot("Running", Membership()).learner == {
        "predator/total_loss": 2.0, "prey/total_loss": 4.0
    }  # fmt: skip
    stats.add_learner_stats({"prey/total_loss": 1.0})
    assert stats.snapshot("Running", Membership()).learner == {
        "predator/total_loss": 2.0, "prey/total_loss": 1.0
    }  # fmt: skip


def test_counters_of_an_older_run_directory_still_load() -> None:
    """Checkpoints written before the counters took RLlib's names resume with their counts."""
    old = {"env_steps_sampled": 7, "env_steps_trained": 5, "weight_broadcasts": 3,
           "learner_queue_full": 1, "episodes": 2}
    c = Counters(**old)
    assert (c.num_env_steps_sampled, c.num_env_steps_trained) == (7, 5)
    assert (c.num_weight_broadcasts, c.num_times_learner_queue_full, c.episodes) == (3, 1, 2)
    assert Counters(num_env_steps_sampled=9).num_env_steps_sampled == 9


def test_plain_progress_lines_when_not_a_tty() -> None:
    out = io.StringIO()
    reporter = ProgressReporter("cartpole", stream=out, tty=False, log_interval=3600)
    stats = RunStats("cartpole", StopSpec(timesteps=1000))
    stats.counters.num_env_steps_sampled = 250
    reporter.update(stats.snapshot("Running", Membership()))
    reporter.update(stats.snapshot("Running", Membership()))  # rate limited
    reporter.update(stats.snapshot("Succeeded", Membership()))  # the end always prints
    reporter.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "steps 250" in lines[0] and "progress 25%" in lines[0]
    assert "ETA" not in lines[0], "no rate yet: no time left to tell"
    assert "\x1b" not in out.getvalue()
    assert lines[1].startswith("[cartpole] succeeded")


def test_a_progress_line_tells_the_time_left_while_the_run_goes_on() -> None:
    out = io.StringIO()
    reporter = ProgressReporter("cartpole", stream=out, tty=False, log_interval=0)
    stats = RunStats("cartpole", StopSpec(timesteps=1000))
    stats.counters.num_env_steps_sampled = 250
    stats.throughput = Throughput(env_steps_per_s=50.0)
    reporter.update(stats.snapshot("Running", Membership()))
    stats.counters.num_env_steps_sampled = 1000
    reporter.update(stats.snapshot("Succeeded", Membership()))
    running, done = out.getvalue().splitlines()
    assert running.endswith("progress 25%  ETA 15s")
    assert "ETA" not in done


def test_a_self_play_job_shows_the_return_its_trend_follows() -> None:
    """A zero-sum game's training return is 0 whatever is learned: the progress line shows the
    evaluation against the fixed opponent (and its win rate) instead, n/a before the first."""
    out = io.StringIO()
    reporter = ProgressReporter("ttt", stream=out, tty=False, log_interval=0)
    stats = RunStats("ttt", StopSpec(timesteps=10**6), trend_source="evaluation")
    stats.add_episodes([1.0, -1.0] * 50, [7] * 100)
    reporter.update(stats.snapshot("Running", Membership()))
    stats.add_evaluation(EvaluationInfo(evaluations=1, episodes=100, episode_return_mean=0.86,
                                        opponent="random", wins=90, draws=6, losses=4,
                                        win_rate=0.9))  # fmt: skip
    reporter.update(stats.snapshot("Running", Membership()))
    before, after = out.getvalue().splitlines()
    assert "eval return n/a" in before and "return 0.0" not in before
    assert "eval return 0.86 (vs random, win rate 90%)" in after, after
    assert stats.snapshot("Running", Membership()).followed_return_mean == 0.86
