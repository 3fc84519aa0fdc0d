"""Piecewise-linear schedules over env steps."""

from __future__ import annotations

import pytest

from impala_trainer.learning.schedules import PiecewiseSchedule, make_schedule


def test_interpolates_between_points() -> None:
    s = PiecewiseSchedule([[0, 1.0], [100, 0.0], [300, 1.0]])
    assert s(0) == 1.0
    assert s(25) == pytest.approx(0.75)
    assert s(100) == 0.0
    assert s(200) == pytest.approx(0.5)
    assert s(300) == 1.0


def test_constant_outside_the_points() -> None:
    s = PiecewiseSchedule([[1000, 5e-4], [2000, 1e-4]])
    assert s(0) == 5e-4  # before the first point: its value
    assert s(10**9) == 1e-4  # after the last point: its value


def test_single_point_and_default() -> None:
    assert PiecewiseSchedule([[0, 0.3]])(12345) == 0.3
    assert make_schedule(None, 0.01)(10**6) == 0.01
    assert make_schedule([[0, 1.0], [10, 0.0]], 0.01)(5) == pytest.approx(0.5)


@pytest.mark.parametrize("points", [[], [[10, 1.0], [5, 0.5]], [[0, 1.0], [0, 2.0]]])
def test_rejects_bad_points(points) -> None:
    with pytest.raises(ValueError):
        PiecewiseSchedule(points)
