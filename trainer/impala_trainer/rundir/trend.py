"""Whether a learned policy is being lost: the training return against its own best.

A run whose return climbs and then falls back, and stays down, has lost what it learned (a
continuous-control policy collapsing, a learning rate too high for the late phase, a
non-stationary env). `checkpoints/best` keeps the best evaluated policy, but nobody looks there
unless told: this says so in the status (`ReturnTrend`), which the operator turns into the
job's `ReturnRegressed` condition, an Event and a `kubectl get ij` column.

The rule, scale-free (returns have any sign and scale): with `first` the first full window's
mean (100 episodes) and `best` the best window mean, the run has regressed when the mean is
below `best - LOST_FRACTION * (best - first)` (and below the best by more than the mean's own
noise) and has been for at least `HOLD_FRACTION` of the env steps it took to reach the best, and
for at least a full window of episodes. Where the first window is the run's start (the training
return: an untrained policy's), a best that rose above it by no more than chance does in as many
windows (`chance_rise`) gained nothing, so there is nothing to lose: a return wobbling around
random play is not a regression. It clears as soon as the mean is above the threshold again.
Pure: the driver calls `observe` at each snapshot, or, for a job scored against a fixed opponent
(self-play: the training return of a zero-sum game is the same whatever is learned or lost), at
each evaluation round with the round's return and the evaluation games so far.
"""

from __future__ import annotations

import math

from impala_api.snapshot import ReturnTrend

LOST_FRACTION = 0.5
"""Regressed below best - LOST_FRACTION * (best - first): half of what was gained given back."""
HOLD_FRACTION = 0.25
"""... for at least this fraction of the env steps the best took to reach."""
WINDOW_EPISODES = 100
"""... and for at least this many episodes (a window of its own, not one bad stretch)."""
NOISE_SE = 2.0
"""... and below the best by more than this many standard errors of the mean: a run that gained
less than its returns' noise (an evaluation round of 100 games against random moves its mean by
~0.08) has nothing to lose."""


def chance_rise(std_error: float, windows: int) -> float:
    """How far the best of `windows` independent windows' means of a return that never changes
    rises above the first by chance: each difference of two means has a standard deviation of
    sqrt(2) standard errors, and the largest of n such is about sqrt(2 ln n) of them (plus
    NOISE_SE of margin): 5.5 SE over 20 windows, 8 over 10,000."""
    return (NOISE_SE + 2.0 * math.sqrt(math.log(max(windows, 2)))) * std_error


def observe(
    trend: ReturnTrend,
    mean: float,
    env_steps: int,
    episodes: int,
    std_error: float = 0.0,
    from_start: bool = False,
) -> ReturnTrend:
    """The trend after a full window's mean `mean` (its standard error `std_error`) at these
    counters (`episodes`: of the return it follows, `trend.source`); `from_start`: the first
    window was the run's start, so a gain within `chance_rise` is no gain."""
    source = trend.source
    first = mean if trend.first_return_mean is None else trend.first_return_mean
    best, best_at = trend.best_return_mean, trend.best_env_steps
    if best is None or mean > best:
        best, best_at = mean, env_steps
    threshold = min(best - LOST_FRACTION * (best - first), best - NOISE_SE * std_error)
    by_chance = from_start and best - first <= chance_rise(std_error, episodes // WINDOW_EPISODES)
    if best <= first or by_chance or mean >= threshold:
        return ReturnTrend(
            source=source, first_return_mean=first, best_return_mean=best, best_env_steps=best_at
        )
    since = trend.below_since_env_steps if trend.below_since_env_steps is not None else env_steps
    since_episodes = trend.below_since_episodes
    if since_episodes is None:
        since_episodes = episodes
    regressed = (
        env_steps - since >= HOLD_FRACTION * best_at
        and episodes - since_episodes >= WINDOW_EPISODES
    )
    message = None
    if regressed:
        lost = (best - mean) / (best - first)
        message = (
            f"the {source} return {mean:.4g} has given back {lost:.0%} of what it gained (from "
            f"{first:.4g} to its best {best:.4g} at {best_at} env steps) and stayed below "
            f"{threshold:.4g} for {env_steps - since} env steps (with spec.evaluation, "
            "checkpoints/best keeps the best evaluated policy)"
        )
    return ReturnTrend(
        source=source,
        first_return_mean=first,
        best_return_mean=best,
        best_env_steps=best_at,
        below_since_env_steps=since,
        below_since_episodes=since_episodes,
        regressed=regressed,
        message=message,
    )
