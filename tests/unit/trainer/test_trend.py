"""The training return against its best: a learned policy that is lost is said, once it has been
lost for long; a dip, a run still learning or one that never learned says nothing."""

from __future__ import annotations

import numpy as np

from impala_api.snapshot import EvaluationInfo, Membership, ReturnTrend
from impala_api.spec import StopSpec
from impala_trainer.rundir import trend
from impala_trainer.rundir.stats import RunStats


def _run(points: list[tuple[float, int, int]]) -> ReturnTrend:
    state = ReturnTrend()
    for mean, steps, episodes in points:
        state = trend.observe(state, mean, steps, episodes)
    return state


def test_the_reach_collapse_is_said_once_it_has_lasted() -> None:
    # -56 first, best -9.5 at 76K, then -152 from 100K on (the collapse MEASURED.md reports).
    points = [(-56.0, 4_000, 100), (-21.6, 42_000, 900), (-9.5, 76_000, 1_500)]
    fell = [(-152.0, 100_000 + 2_000 * i, 2_000 + 40 * i) for i in range(13)]
    early = _run(points + fell[:2])  # 2K env steps below: not yet long
    assert early.below_since_env_steps == 100_000 and not early.regressed
    late = _run(points + fell)
    assert late.regressed and late.message is not None
    assert "-152" in late.message and "best -9.5 at 76000 env steps" in late.message
    # It recovers: above the threshold again clears it.
    cleared = trend.observe(late, -20.0, 130_000, 2_600)
    assert not cleared.regressed and cleared.below_since_env_steps is None
    assert (cleared.first_return_mean, cleared.best_return_mean) == (-56.0, -9.5)


def test_a_dip_a_run_still_learning_and_one_that_never_learned_say_nothing() -> None:
    dip = _run([(10.0, 1_000, 100), (100.0, 50_000, 1_000), (40.0, 55_000, 1_050),
                (90.0, 70_000, 1_400)])  # fmt: skip
    assert not dip.regressed and dip.below_since_env_steps is None
    learning = _run([(float(r), 1_000 * r, 100 + r) for r in range(50)])
    assert not learning.regressed and learning.best_return_mean == 49.0
    never = _run([(-5.0, 1_000, 100), (-8.0, 500_000, 9_000), (-9.0, 900_000, 20_000)])
    assert not never.regressed  # the best is the first: nothing was gained to lose
    # Below for long in env steps, but not for a window of episodes yet.
    short = _run([(0.0, 1_000, 100), (10.0, 10_000, 200), (1.0, 20_000, 210), (1.0, 40_000, 250)])
    assert short.below_since_env_steps == 20_000 and not short.regressed


def _training(returns: list[list[float]]) -> tuple[bool, ReturnTrend]:
    """RunStats fed batches of episode returns, a snapshot after each (as the driver does):
    whether the trend ever said regressed, and its last state."""
    stats, steps, ever = RunStats("t", StopSpec(timesteps=10**9)), 0, False
    for batch in returns:
        stats.add_episodes(batch, [max(1, round(r)) for r in batch])
        steps += sum(max(1, round(r)) for r in batch)
        stats.counters.num_env_steps_sampled = steps
        ever |= stats.snapshot("Running", Membership()).return_trend.regressed
    return ever, stats.trend


def test_a_return_wobbling_around_random_play_is_no_regression() -> None:
    # A policy that never learns, CartPole-like returns (mean 22, sd 11) over 6,000 episodes
    # with a snapshot every 20: its rolling window's best rises 3-5 above its first by chance
    # and falls back (a job said REGRESSED 31 s in, "from 20.5 to its best 23.64").
    for seed in range(10):
        rng = np.random.default_rng(seed)
        ever, state = _training([rng.gamma(4.0, 5.5, 20).round().tolist() for _ in range(300)])
        assert not ever, (seed, state)
    # The same noise around a policy that learned (22 -> 120) and then lost it (-> 30) is.
    rng = np.random.default_rng(0)
    levels = [22.0] * 50 + [120.0] * 100 + [30.0] * 150
    ever, state = _training([rng.normal(m, m / 2, 20).clip(1).tolist() for m in levels])
    assert ever and state.regressed and state.first_return_mean is not None
    assert state.first_return_mean < 30 and state.best_return_mean is not None
    assert state.best_return_mean > 110


def test_the_trend_is_in_the_snapshot_and_survives_a_resume() -> None:
    stats = RunStats("t", StopSpec(timesteps=10**9))
    stats.add_episodes([1.0] * 100, [10] * 100)
    stats.counters.num_env_steps_sampled = 1_000
    first = stats.snapshot("Running", Membership())
    assert first.return_trend.first_return_mean == 1.0
    resumed = RunStats("t", StopSpec(timesteps=10**9), stats.driver_state())
    assert resumed.trend == stats.trend


def _rounds(means: list[float], std: float = 0.8) -> RunStats:
    """A self-play job's stats after evaluation rounds of 100 games (a game's return is 1, 0 or
    -1: a standard deviation of about 0.8), one every 50K env steps."""
    stats = RunStats("t", StopSpec(timesteps=10**9), trend_source="evaluation")
    for i, mean in enumerate(means, start=1):
        stats.add_episodes([1.0, -1.0] * 50, [7] * 100)
        stats.counters.num_env_steps_sampled = 50_000 * i
        stats.snapshot("Running", Membership())  # the training return moves nothing here
        info = EvaluationInfo(evaluations=i, num_env_steps_sampled=50_000 * i, episodes=100,
                              episode_return_mean=mean, episode_return_std=std,
                              opponent="random")  # fmt: skip
        stats.add_evaluation(info)
    return stats


def test_a_self_play_job_follows_its_evaluation_rounds() -> None:
    # Tic-tac-toe self-play scored against random (a run of an earlier example, seed 8): the
    # rounds rose to 0.63 at 100K and fell to 0.16; its training return (a zero-sum game's)
    # stayed 0. Half the gain is lost below 0.605, beyond the rounds' noise below 0.47.
    rounds = [0.58, 0.63, 0.47, 0.36, 0.24, 0.16]
    one_below = _rounds(rounds[:4]).trend  # one round of games below: not yet
    assert not one_below.regressed and one_below.below_since_env_steps == 200_000
    trend = _rounds(rounds).trend
    assert trend.source == "evaluation" and trend.regressed
    assert (trend.first_return_mean, trend.best_return_mean) == (0.58, 0.63)
    assert trend.message is not None
    assert trend.message.startswith("the evaluation return 0.16"), trend.message
    # Rounds that only wobble within their noise say nothing.
    assert not _rounds([0.58, 0.63, 0.55, 0.52, 0.57, 0.50]).trend.regressed
    # Resumed as it was, it goes on; resumed following the other return, it starts afresh.
    state = _rounds(rounds).driver_state()
    assert RunStats("t", StopSpec(timesteps=1), state, "evaluation").trend == trend
    assert RunStats("t", StopSpec(timesteps=1), state).trend == ReturnTrend()


def test_a_job_that_follows_the_training_return_ignores_evaluation_rounds() -> None:
    stats = RunStats("t", StopSpec(timesteps=10**9))
    stats.add_evaluation(EvaluationInfo(evaluations=1, episodes=10, episode_return_mean=5.0))
    assert stats.trend == ReturnTrend()
