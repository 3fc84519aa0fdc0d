"""Prometheus metrics from the latest snapshot: a custom Collector over status.json.

A Collector (rather than Gauges set by a background loop) means a scrape always shows the file as
it is now and the sidecar runs no threads of its own; the /metrics route renders it once per
file version (the output is a pure function of the file). Every family carries a `job` label; note
that Prometheus renames it `exported_job` unless the scrape config sets `honor_labels: true`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from impala_api.snapshot import RunPhase, StatusSnapshot
from impala_trainer.rundir.reader import RunDirReader

PHASES: tuple[str, ...] = get_args(RunPhase)

# (counter name without _total, help, attribute of Counters)
_COUNTERS = (
    ("impala_env_steps_sampled", "Env steps returned by rollout workers.", "num_env_steps_sampled"),
    ("impala_env_steps_trained", "Env steps the learner trained on.", "num_env_steps_trained"),
    ("impala_episodes", "Completed episodes.", "episodes"),
    ("impala_learner_updates", "Optimiser steps taken.", "learner_updates"),
    ("impala_weight_broadcasts", "Weight broadcasts to the workers.", "num_weight_broadcasts"),
    (
        "impala_learner_queue_full",
        "Train batches that found the learner queue full.",
        "num_times_learner_queue_full",
    ),
    ("impala_replayed_batches", "Train batches served from the replay buffer.", "replayed_batches"),
    (
        "impala_worker_restarts",
        "Rollout/aggregator actors replaced after a failure.",
        "worker_restarts",
    ),
)


def job_label(snapshot: StatusSnapshot, override: str | None, reader: RunDirReader) -> str:
    """The `job` label: the configured name, else the snapshot's, else the directory's."""
    return override or snapshot.job or reader.run_dir.resolve().name


class SnapshotCollector(Collector):
    """Turns status.json into `impala_*` metric families when the registry is collected."""

    def __init__(self, reader: RunDirReader, job_name: str | None = None) -> None:
        self._reader = reader
        self._job_name = job_name

    def describe(self) -> Iterable[Metric]:
        # Registration would otherwise call collect(), which needs a snapshot that may not exist.
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self._reader.status.read()  # SnapshotError propagates: the route answers 503
        job = job_label(snap, self._job_name, self._reader)
        yield from snapshot_metrics(snap, job)


def _gauge(name: str, doc: str, job: str, value: float | None) -> Iterator[Metric]:
    if value is None:
        return
    g = GaugeMetricFamily(name, doc, labels=["job"])
    g.add_metric([job], float(value))
    yield g


def snapshot_metrics(snap: StatusSnapshot, job: str) -> Iterator[Metric]:
    """All metric families for one snapshot (pure)."""
    c = snap.counters
    for name, doc, attr in _COUNTERS:
        fam = CounterMetricFamily(name, doc, labels=["job"])
        fam.add_metric([job], float(getattr(c, attr)))
        yield fam

    phase = GaugeMetricFamily(
        "impala_phase", "1 for the run's current phase.", labels=["job", "phase"]
    )
    for p in PHASES:
        phase.add_metric([job, p], 1.0 if snap.phase == p else 0.0)
    yield phase

    t, q, m = snap.throughput, snap.learner_queue, snap.membership
    for name, doc, value in (
        ("impala_policy_version", "Version of the learner's weights.", c.policy_version),
        (
            "impala_episode_return_mean",
            "Mean return of the last 100 episodes.",
            snap.episode_return_mean,
        ),
        (
            "impala_episode_return_min",
            "Min return of the last 100 episodes.",
            snap.episode_return_min,
        ),
        (
            "impala_episode_return_max",
            "Max return of the last 100 episodes.",
            snap.episode_return_max,
        ),
        (
            "impala_episode_length_mean",
            "Mean length of the last 100 episodes.",
            snap.episode_len_mean,
        ),
        ("impala_env_steps_per_second", "Env steps sampled per second.", t.env_steps_per_s),
        ("impala_trained_steps_per_second", "Env steps trained per second.", t.trained_steps_per_s),
        (
            "impala_learner_updates_per_second",
            "Optimiser steps per second.",
            t.learner_updates_per_s,
        ),
        ("impala_learner_queue_capacity", "Learner queue capacity.", q.capacity),
        ("impala_learner_queue_size_mean", "Mean learner queue size.", q.size_mean),
        ("impala_learner_queue_fill", "Learner queue fill (size/capacity).", q.fill),
        (
            "impala_learner_idle_fraction",
            "Fraction of time the learner waited for data.",
            q.learner_idle_fraction,
        ),
        ("impala_rollout_workers", "Healthy rollout actors.", m.rollout_workers),
        ("impala_aggregator_workers", "Healthy aggregator actors.", m.aggregator_workers),
        ("impala_rollout_nodes", "Ray nodes offering the rollout resource.", m.rollout_nodes),
        (
            "impala_aggregator_nodes",
            "Ray nodes offering the aggregator resource.",
            m.aggregator_nodes,
        ),
        (
            "impala_policy_lag_mean",
            "Mean policy-version lag of trained batches.",
            snap.policy_lag_mean,
        ),
        (
            "impala_stop_progress",
            "Progress toward the nearest stop criterion (0..1).",
            snap.stop.progress,
        ),
        (
            "impala_training_seconds",
            "Training wall time, accumulated across resumes.",
            snap.wall_seconds,
        ),
        ("impala_start_timestamp_seconds", "Unix time training started.", snap.started_at),
        # A timestamp, not an age (alert on `time() - impala_snapshot_timestamp_seconds`): the
        # exposition is then a pure function of the file, so /metrics can cache it per version.
        ("impala_snapshot_timestamp_seconds", "Unix time of the snapshot.", snap.updated_at),
    ):
        yield from _gauge(name, doc, job, value)

    if snap.checkpoint is not None:
        yield from _gauge(
            "impala_checkpoint_timestamp_seconds",
            "Unix time of the last checkpoint.",
            job,
            snap.checkpoint.time,
        )
        yield from _gauge(
            "impala_checkpoint_env_steps",
            "Env steps at the last checkpoint.",
            job,
            snap.checkpoint.num_env_steps_sampled,
        )

    members = GaugeMetricFamily(
        "impala_members", "Actors by role and state.", labels=["job", "role", "state"]
    )
    for (role, state), n in sorted(Counter((x.role, x.state) for x in m.members).items()):
        members.add_metric([job, role, state], float(n))
    yield members

    stats = GaugeMetricFamily(
        "impala_learner_stat", "Latest learner statistic by name.", labels=["job", "stat"]
    )
    for key, value in sorted(snap.learner.items()):
        stats.add_metric([job, key], float(value))
    yield stats

    # The snapshot reports milliseconds; Prometheus convention is base units.
    timing = GaugeMetricFamily(
        "impala_timing_seconds", "Timing breakdown by section.", labels=["job", "section"]
    )
    for key, value in sorted(snap.timing_breakdown.items()):
        timing.add_metric([job, key], float(value) / 1000.0)
    yield timing
