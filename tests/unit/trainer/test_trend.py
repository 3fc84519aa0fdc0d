"""The training return against its best: a learned policy that is lost is said, once it has been
lost for long; a dip, a run still learning or one that never learned says nothing."""

from __future__ import annotations

from impala_api.snapshot import Membership, ReturnTrend
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


def test_the_trend_is_in_the_snapshot_and_survives_a_resume() -> None:
    stats = RunStats("t", StopSpec(timesteps=10**9))
    stats.add_episodes([1.0] * 100, [10] * 100)
    stats.counters.num_env_steps_sampled = 1_000
    first = stats.snapshot("Running", Membership())
    assert first.return_trend.first_return_mean == 1.0
    resumed = RunStats("t", StopSpec(timesteps=10**9), stats.driver_state())
    assert resumed.trend == stats.trend
