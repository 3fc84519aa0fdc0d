"""The autoscaling policy: starved -> up, saturated -> down, holds, bounds, and no flapping."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from impala_api.spec import AggregatorsSpec, AutoscalingSpec
from impala_operator.scale import autoscaler
from impala_operator.scale.autoscaler import MetricSample, ScaleDecision, decide_rollouts

POLICY = AutoscalingSpec(
    cooldown_seconds=30,
    stabilization_window_seconds=20,
    scale_up_step=2,
    scale_down_step=1,
    starved_queue_fill=0.1,
    saturated_queue_fill=0.9,
)
STARVED = {"queue_fill": 0.0, "idle_fraction": 0.9}
SATURATED = {"queue_fill": 1.0, "idle_fraction": 0.0}
MIDDLE = {"queue_fill": 0.5, "idle_fraction": 0.2}


def _series(start: float, end: float, every: float, **values: float) -> list[MetricSample]:
    out = []
    t = start
    while t <= end:
        out.append(MetricSample(time=t, available=True, **values))
        t += every
    return out


def _decide(
    samples: Sequence[MetricSample],
    now: float,
    current: int = 3,
    last: float | None = None,
    policy: AutoscalingSpec = POLICY,
    lo: int = 1,
    hi: int = 6,
) -> ScaleDecision:
    return decide_rollouts(
        samples,
        policy,
        current=current,
        min_replicas=lo,
        max_replicas=hi,
        last_scale_time=last,
        now=now,
        idle_threshold=0.5,
    )


def test_starved_over_whole_window_scales_up_by_step() -> None:
    d = _decide(_series(0, 30, 5, **STARVED), now=30)
    assert (d.replicas, d.reason, d.changed) == (5, autoscaler.LEARNER_STARVED, True)
    assert "3 -> 5" in d.message


def test_scale_up_stops_at_max() -> None:
    assert _decide(_series(0, 30, 5, **STARVED), now=30, current=5).replicas == 6
    held = _decide(_series(0, 30, 5, **STARVED), now=30, current=6)
    assert (held.replicas, held.reason, held.changed) == (6, autoscaler.AT_LIMIT, False)


def test_saturated_scales_down_by_step_to_min() -> None:
    d = _decide(_series(0, 30, 5, **SATURATED), now=30, current=4)
    assert (d.replicas, d.reason) == (3, autoscaler.QUEUE_SATURATED)
    assert _decide(_series(0, 30, 5, **SATURATED), now=30, current=1).reason == autoscaler.AT_LIMIT


def test_empty_queue_with_busy_learner_is_not_starvation() -> None:
    # An empty queue while the learner is busy training means it consumes as fast as it gets.
    d = _decide(_series(0, 30, 5, queue_fill=0.0, idle_fraction=0.1), now=30)
    assert (d.replicas, d.reason) == (3, autoscaler.WITHIN_TARGET)


def test_one_sample_outside_the_condition_holds() -> None:
    samples = _series(0, 30, 5, **STARVED)
    samples[4] = MetricSample(time=samples[4].time, available=True, **MIDDLE)
    assert _decide(samples, now=30).reason == autoscaler.WITHIN_TARGET


def test_window_not_yet_covered_holds() -> None:
    # 15 s of starvation is not 20 s of it.
    d = _decide(_series(15, 30, 5, **STARVED), now=30)
    assert (d.replicas, d.reason) == (3, autoscaler.STABILIZING)
    assert _decide([], now=30).reason == autoscaler.STABILIZING


def test_samples_before_the_window_do_not_count() -> None:
    # Saturated long ago, starved for exactly the window: the old samples are outside it.
    samples = _series(0, 5, 5, **SATURATED) + _series(10, 30, 5, **STARVED)
    assert _decide(samples, now=30).reason == autoscaler.LEARNER_STARVED


def test_unavailable_metrics_hold() -> None:
    samples = _series(0, 30, 5, **STARVED)
    samples[3] = MetricSample(time=samples[3].time, available=False)
    assert _decide(samples, now=30).reason == autoscaler.METRICS_UNAVAILABLE


def test_cooldown_holds_then_releases() -> None:
    samples = _series(0, 100, 5, **STARVED)
    assert _decide(samples, now=60, last=40).reason == autoscaler.COOLDOWN
    assert _decide(samples, now=75, last=40).reason == autoscaler.LEARNER_STARVED


def test_window_must_be_observed_after_last_scale() -> None:
    # Cooldown 0: still, samples taken before (or at) the scale describe the old replica count.
    policy = POLICY.model_copy(update={"cooldown_seconds": 0})
    samples = _series(0, 100, 5, **STARVED)
    assert _decide(samples, now=60, last=45, policy=policy).reason == autoscaler.STABILIZING
    assert _decide(samples, now=65, last=45, policy=policy).reason == autoscaler.STABILIZING
    assert _decide(samples, now=70, last=45, policy=policy).reason == autoscaler.LEARNER_STARVED


def test_out_of_bounds_is_corrected_even_in_cooldown() -> None:
    d = _decide([], now=10, current=9, last=9)
    assert (d.replicas, d.reason, d.changed) == (6, autoscaler.OUT_OF_BOUNDS, True)
    assert _decide([], now=10, current=0, last=9).replicas == 1


def test_disabled_holds() -> None:
    policy = POLICY.model_copy(update={"enabled": False})
    assert (
        _decide(_series(0, 30, 5, **STARVED), now=30, policy=policy).reason == autoscaler.DISABLED
    )


def test_zero_window_uses_latest_sample() -> None:
    policy = POLICY.model_copy(update={"stabilization_window_seconds": 0, "cooldown_seconds": 0})
    samples = _series(0, 10, 5, **SATURATED) + _series(15, 15, 5, **STARVED)
    assert _decide(samples, now=15, policy=policy).reason == autoscaler.LEARNER_STARVED


def test_aggregators_follow_rollout_volume() -> None:
    spec = AggregatorsSpec(min_replicas=1, max_replicas=3)
    agg = autoscaler.aggregator_replicas
    assert agg(spec, rollout_replicas=2, workers_per_pod=2, workers_per_aggregator=4) == 1
    assert agg(spec, rollout_replicas=5, workers_per_pod=2, workers_per_aggregator=4) == 3
    assert agg(spec, rollout_replicas=50, workers_per_pod=2, workers_per_aggregator=4) == 3
    assert agg(spec, rollout_replicas=0, workers_per_pod=2, workers_per_aggregator=4) == 1
    fixed = AggregatorsSpec(min_replicas=0, max_replicas=3, replicas=2)
    fixed.autoscaling.enabled = False
    assert agg(fixed, rollout_replicas=50, workers_per_pod=2, workers_per_aggregator=4) == 2
    none = AggregatorsSpec()
    assert agg(none, rollout_replicas=8, workers_per_pod=1, workers_per_aggregator=4) == 0


def _simulate(
    fills: list[float], idles: list[float], policy: AutoscalingSpec, every: float = 5.0
) -> list[tuple[float, int, int, ScaleDecision]]:
    """Run the policy as the operator's timer does; return (time, before, after, decision)."""
    samples: list[MetricSample] = []
    current, last = 3, None
    changes = []
    for i, (fill, idle) in enumerate(zip(fills, idles, strict=True)):
        now = i * every
        samples.append(MetricSample(time=now, available=True, queue_fill=fill, idle_fraction=idle))
        d = _decide(samples, now=now, current=current, last=last, policy=policy, lo=1, hi=8)
        if d.changed:
            changes.append((now, current, d.replicas, d))
            current, last = d.replicas, now
    return changes


unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(st.tuples(unit, unit), min_size=1, max_size=120),
    window=st.sampled_from([0, 5, 10, 20, 60]),
    cooldown=st.sampled_from([0, 10, 30]),
)
def test_every_decision_is_justified_and_spaced(
    data: list[tuple[float, float]], window: int, cooldown: int
) -> None:
    policy = POLICY.model_copy(
        update={"stabilization_window_seconds": window, "cooldown_seconds": cooldown}
    )
    fills = [f for f, _ in data]
    idles = [i for _, i in data]
    changes = _simulate(fills, idles, policy)
    previous = None
    for now, before, after, _ in changes:
        assert 1 <= after <= 8
        # Each decision's window (every sample from now-window to now) satisfied its condition.
        lo = int((now - window) // 5)
        seen = list(zip(fills, idles, strict=True))[max(0, lo) : int(now // 5) + 1]
        if after > before:
            assert after - before <= policy.scale_up_step
            assert all(f <= 0.1 and i >= 0.5 for f, i in seen), (now, seen)
        else:
            assert before - after <= policy.scale_down_step
            assert all(f >= 0.9 for f, _ in seen), (now, seen)
        if previous is not None:
            assert now - previous >= max(cooldown, window + 5)
        previous = now


@settings(max_examples=200, deadline=None)
@given(data=st.lists(st.tuples(unit, unit), min_size=1, max_size=200))
def test_noise_around_thresholds_never_flaps(data: list[tuple[float, float]]) -> None:
    # Noisy metrics where every 20 s window holds a reading on the other side of each threshold
    # (one in four samples is mid-range): the replicas never move, however wild the rest is.
    fills = [0.5 if i % 4 == 0 else f for i, (f, _) in enumerate(data)]
    idles = [i for _, i in data]
    policy = POLICY.model_copy(update={"cooldown_seconds": 0})
    assert _simulate(fills, idles, policy) == []


def test_flip_flopping_metrics_do_not_flap() -> None:
    fills = [0.0, 1.0] * 100
    idles = [1.0, 0.0] * 100
    assert _simulate(fills, idles, POLICY.model_copy(update={"cooldown_seconds": 0})) == []


def test_sustained_phases_move_up_then_down_within_bounds() -> None:
    fills = [0.0] * 60 + [1.0] * 60
    idles = [1.0] * 60 + [0.0] * 60
    changes = _simulate(fills, idles, POLICY)
    ups = [c for c in changes if c[2] > c[1]]
    downs = [c for c in changes if c[2] < c[1]]
    assert ups and downs and max(u[0] for u in ups) < min(d[0] for d in downs)
    assert max(c[2] for c in changes) == 8 and changes[-1][2] == 1
