"""Rollout/aggregator autoscaling: a pure policy over a window of sidecar metric samples.

The learner's queue says who is the bottleneck. Nearly empty while the learner thread waits for
data: the learner is starved, more rollout pods help. Nearly full: samples pile up faster than the
learner trains, fewer rollouts waste nothing. The shape follows the HorizontalPodAutoscaler:

- a decision needs its condition to hold for *every* sample over the whole stabilization window,
  and the window must be fully observed since the last scale (samples taken before a scale say
  nothing about the current replica count), so noise that crosses a threshold now and then never
  moves the replicas, and opposite decisions cannot alternate faster than the window;
- a cooldown between decisions and a step limit per decision;
- bounds [min, max] always win, even over the cooldown (a spec edit takes effect at once);
- when the sidecar is unreachable or its snapshot stale, hold.

Aggregators follow the rollout volume instead of their own metric: one per N rollout workers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from impala_api.spec import AggregatorsSpec, AutoscalingSpec

# Decision reasons (also the Event reasons the handlers post for changes).
LEARNER_STARVED = "LearnerStarved"
QUEUE_SATURATED = "LearnerQueueSaturated"
OUT_OF_BOUNDS = "ReplicasOutOfBounds"
COOLDOWN = "Cooldown"
STABILIZING = "Stabilizing"
METRICS_UNAVAILABLE = "MetricsUnavailable"
WITHIN_TARGET = "WithinTarget"
AT_LIMIT = "AtLimit"
DISABLED = "AutoscalingDisabled"


@dataclass(frozen=True)
class MetricSample:
    """One reading of the job's sidecar, taken by the operator at `time` (unix seconds)."""

    time: float
    available: bool
    """False when the sidecar did not answer, answered garbage, or its snapshot was stale."""
    queue_fill: float = 0.0
    """learner_queue.fill in [0, 1]."""
    idle_fraction: float = 0.0
    """learner_queue.learner_idle_fraction in [0, 1]."""
    env_steps_per_s: float = 0.0
    """throughput.env_steps_per_s (reported in messages; not a decision input)."""


@dataclass(frozen=True)
class ScaleDecision:
    """The replicas to run next and why (`reason`: one CamelCase word; `message`: a sentence)."""

    replicas: int
    reason: str
    message: str
    changed: bool


def clamp(value: int, low: int, high: int) -> int:
    """`value` forced into [low, high]."""
    return max(low, min(high, value))


def _hold(current: int, reason: str, message: str) -> ScaleDecision:
    return ScaleDecision(current, reason, message, changed=False)


def decide_rollouts(
    samples: Sequence[MetricSample],
    policy: AutoscalingSpec,
    *,
    current: int,
    min_replicas: int,
    max_replicas: int,
    last_scale_time: float | None,
    now: float,
    idle_threshold: float = 0.5,
) -> ScaleDecision:
    """Decide the rollout replica count from the samples (in time order) and the policy.

    `current` is the replica count in force; `last_scale_time` the time of the last change (None
    if there was none since the job started). The result is always within [min, max].
    """
    bounded = clamp(current, min_replicas, max_replicas)
    if bounded != current:
        return ScaleDecision(
            bounded,
            OUT_OF_BOUNDS,
            f"{current} rollout replicas is outside [{min_replicas}, {max_replicas}]; "
            f"set to {bounded}",
            changed=True,
        )
    if not policy.enabled:
        return _hold(current, DISABLED, "autoscaling is disabled")
    if last_scale_time is not None and now - last_scale_time < policy.cooldown_seconds:
        left = policy.cooldown_seconds - (now - last_scale_time)
        return _hold(current, COOLDOWN, f"cooling down for another {left:.0f}s")

    # The window must be observed from its start with the replicas now in force: the newest
    # sample at or before the window start proves that, and is part of the window since it
    # describes the state at window_start. A sample taken at the scale time predates the scale.
    window_start = now - policy.stabilization_window_seconds
    older = [s for s in samples if s.time <= window_start]
    if not older or (last_scale_time is not None and older[-1].time <= last_scale_time):
        return _hold(current, STABILIZING, "the window is not yet observed at this replica count")
    window = [older[-1], *(s for s in samples if window_start < s.time <= now)]
    if not all(s.available for s in window):
        return _hold(current, METRICS_UNAVAILABLE, "learner metrics unavailable in the window")

    fills = [s.queue_fill for s in window]
    span = f"over {policy.stabilization_window_seconds}s"
    if all(
        s.queue_fill <= policy.starved_queue_fill and s.idle_fraction >= idle_threshold
        for s in window
    ):
        if current >= max_replicas:
            return _hold(current, AT_LIMIT, f"learner starved but already at max {max_replicas}")
        target = min(max_replicas, current + policy.scale_up_step)
        idle = min(s.idle_fraction for s in window)
        return ScaleDecision(
            target,
            LEARNER_STARVED,
            f"learner queue fill <= {policy.starved_queue_fill:g} (max {max(fills):.2f}) and "
            f"learner idle >= {idle:.0%} {span}; rollouts {current} -> {target}",
            changed=True,
        )
    if all(f >= policy.saturated_queue_fill for f in fills):
        if current <= min_replicas:
            return _hold(current, AT_LIMIT, f"queue saturated but already at min {min_replicas}")
        target = max(min_replicas, current - policy.scale_down_step)
        return ScaleDecision(
            target,
            QUEUE_SATURATED,
            f"learner queue fill >= {policy.saturated_queue_fill:g} (min {min(fills):.2f}) "
            f"{span}; rollouts {current} -> {target}",
            changed=True,
        )
    return _hold(current, WITHIN_TARGET, "learner queue fill within target")


def aggregator_replicas(
    spec: AggregatorsSpec,
    *,
    rollout_replicas: int,
    workers_per_pod: int,
    workers_per_aggregator: int,
) -> int:
    """Aggregator pods for the rollout volume: one per `workers_per_aggregator` rollout workers.

    With autoscaling disabled the requested count (clamped) is kept. Zero rollouts need no
    aggregators beyond the minimum.
    """
    if not spec.autoscaling.enabled:
        return spec.initial_replicas
    workers = rollout_replicas * workers_per_pod
    wanted = math.ceil(workers / workers_per_aggregator)
    return clamp(wanted, spec.min_replicas, spec.max_replicas)
