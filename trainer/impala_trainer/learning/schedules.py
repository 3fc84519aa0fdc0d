"""Piecewise-linear schedules over env steps (RLlib's lr_schedule / entropy_coeff_schedule)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence


class PiecewiseSchedule:
    """Linear interpolation between [timestep, value] points.

    Before the first point the first value holds, after the last point the last value holds
    (RLlib's PiecewiseSchedule with outside_value = the last value).
    """

    def __init__(self, points: Sequence[Sequence[float]]) -> None:
        if not points:
            raise ValueError("a schedule needs at least one [timestep, value] point")
        steps = [float(p[0]) for p in points]
        if any(b <= a for a, b in itertools.pairwise(steps)):
            raise ValueError(f"schedule timesteps must strictly increase, got {steps}")
        self._steps = steps
        self._values = [float(p[1]) for p in points]

    def value(self, timestep: float) -> float:
        """The scheduled value at `timestep` env steps."""
        steps, values = self._steps, self._values
        if timestep <= steps[0]:
            return values[0]
        if timestep >= steps[-1]:
            return values[-1]
        i = bisect.bisect_right(steps, timestep)  # steps[i-1] <= timestep < steps[i]
        frac = (timestep - steps[i - 1]) / (steps[i] - steps[i - 1])
        return values[i - 1] + frac * (values[i] - values[i - 1])

    __call__ = value


def make_schedule(points: Sequence[Sequence[float]] | None, constant: float) -> PiecewiseSchedule:
    """The schedule from `points`, or a constant one at `constant` when none is given."""
    return PiecewiseSchedule(points if points else [[0, constant]])
