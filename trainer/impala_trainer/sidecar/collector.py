"""Prometheus metrics from the latest snapshot: a custom Collector over status.json.

A Collector (rather than Gauges set by a background loop) means a scrape always shows the file as
it is now and the sidecar runs no threads of its own; the /metrics route renders it once per
file version (the output is a pure function of the file). Every family carries a `job` label; note
that Prometheus renames it `exported_job` unless the scrape config sets `honor_labels: true`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, get_args

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


# (gauge name, help, attribute path in a snapshot; a None on the way leaves the family out)
_GAUGES = (
    ("impala_policy_version", "Version of the learner's weights.", "counters.policy_version"),
    ("impala_episode_return_mean", "Mean return of the last 100 episodes.", "episode_return_mean"),
    ("impala_episode_return_min", "Min return of the last 100 episodes.", "episode_return_min"),
    ("impala_episode_return_max", "Max return of the last 100 episodes.", "episode_return_max"),
    ("impala_episode_length_mean", "Mean length of the last 100 episodes.", "episode_len_mean"),
    (
        "impala_episode_return_best",
        "Best 100-episode mean return so far.",
        "return_trend.best_return_mean",
    ),
    (
        "impala_return_regressed",
        "1 while the mean return has fallen far below its best for long (ReturnRegressed).",
        "return_trend.regressed",
    ),
    (
        "impala_evaluation_return_mean",
        "Mean return of the latest evaluation (spec.evaluation).",
        "evaluation.episode_return_mean",
    ),
    (
        "impala_evaluation_best_return_mean",
        "Best evaluation mean return so far.",
        "evaluation.best_return_mean",
    ),
    (
        "impala_evaluation_win_rate",
        "Wins per game against spec.evaluation.opponent in the latest evaluation.",
        "evaluation.win_rate",
    ),
    ("impala_env_steps_per_second", "Env steps sampled per second.", "throughput.env_steps_per_s"),
    (
        "impala_trained_steps_per_second",
        "Env steps trained per second.",
        "throughput.trained_steps_per_s",
    ),
    (
        "impala_learner_updates_per_second",
        "Optimiser steps per second.",
        "throughput.learner_updates_per_s",
    ),
    ("impala_learner_queue_capacity", "Learner queue capacity.", "learner_queue.capacity"),
    ("impala_learner_queue_size_mean", "Mean learner queue size.", "learner_queue.size_mean"),
    ("impala_learner_queue_fill", "Learner queue fill (size/capacity).", "learner_queue.fill"),
    (
        "impala_learner_idle_fraction",
        "Fraction of time the learner waited for data.",
        "learner_queue.learner_idle_fraction",
    ),
    ("impala_rollout_workers", "Healthy rollout actors.", "membership.rollout_workers"),
    (
        "impala_rollout_busy_fraction",
        "Fraction of time the rollout actors spent on sample requests.",
        "throughput.rollout_busy_fraction",
    ),
    ("impala_aggregator_workers", "Healthy aggregator actors.", "membership.aggregator_workers"),
    (
        "impala_rollout_nodes",
        "Ray nodes offering the rollout resource.",
        "membership.rollout_nodes",
    ),
    (
        "impala_aggregator_nodes",
        "Ray nodes offering the aggregator resource.",
        "membership.aggregator_nodes",
    ),
    ("impala_policy_lag_mean", "Mean policy-version lag of trained batches.", "policy_lag_mean"),
    ("impala_stop_progress", "Progress toward the nearest stop criterion (0..1).", "stop.progress"),
    (
        "impala_stop_remaining_seconds",
        "Estimated seconds until stop.timesteps or stop.timeLimitSeconds (absent without both).",
        "stop.remaining_seconds",
    ),
    ("impala_training_seconds", "Training wall time, accumulated across resumes.", "wall_seconds"),
    ("impala_start_timestamp_seconds", "Unix time training started.", "started_at"),
    # A timestamp, not an age (alert on `time() - impala_snapshot_timestamp_seconds`): the
    # exposition is then a pure function of the file, so /metrics can cache it per version.
    ("impala_snapshot_timestamp_seconds", "Unix time of the snapshot.", "updated_at"),
    ("impala_checkpoint_timestamp_seconds", "Unix time of the last checkpoint.", "checkpoint.time"),
    (
        "impala_checkpoint_env_steps",
        "Env steps at the last checkpoint.",
        "checkpoint.num_env_steps_sampled",
    ),
)


def snapshot_metrics(snap: StatusSnapshot, job: str) -> Iterator[Metric]:
    """All metric families for one snapshot (pure)."""
    for name, doc, attr in _COUNTERS:
        fam = CounterMetricFamily(name, doc, labels=["job"])
        fam.add_metric([job], float(getattr(snap.counters, attr)))
        yield fam
    yield _labelled(
        "impala_phase",
        "1 for the run's current phase.",
        job,
        "phase",
        {p: 1.0 if snap.phase == p else 0.0 for p in PHASES},
    )
    for name, doc, value in _GAUGES:
        yield from _gauge(name, doc, job, _attribute(snap, value))
    members = GaugeMetricFamily(
        "impala_members", "Actors by role and state.", labels=["job", "role", "state"]
    )
    counts = Counter((x.role, x.state) for x in snap.membership.members)
    for (role, state), n in sorted(counts.items()):
        members.add_metric([job, role, state], float(n))
    yield members
    stats = {k: v for k, v in sorted(snap.learner.items()) if "/" not in k}
    yield _labelled(
        "impala_learner_stat", "Latest run-wide learner statistic by name.", job, "stat", stats
    )
    yield _policy_learner_stats(snap, job)
    yield from _policy_metrics(snap, job)
    # The snapshot reports milliseconds; Prometheus convention is base units.
    timing = {k: float(v) / 1000.0 for k, v in sorted(snap.timing_breakdown.items())}
    yield _labelled("impala_timing_seconds", "Timing breakdown by section.", job, "section", timing)


def _policy_learner_stats(snap: StatusSnapshot, job: str) -> Metric:
    """Each policy's learner stats (status.json's `<policy>/<stat>` keys; a gymnasium env's
    one policy is `default`)."""
    stats = GaugeMetricFamily(
        "impala_policy_learner_stat",
        "Latest learner statistic of a policy's learner, by name.",
        labels=["job", "policy", "stat"],
    )
    for key, value in sorted(snap.learner.items()):
        owner, sep, stat = key.partition("/")
        if sep:
            stats.add_metric([job, owner, stat], float(value))
    return stats


def _policy_metrics(snap: StatusSnapshot, job: str) -> Iterator[Metric]:
    """A PettingZoo env's families with a `policy` label: its agents' returns and the
    self-play score."""
    if not snap.policies:
        return
    returns = GaugeMetricFamily(
        "impala_policy_episode_return_mean",
        "Mean return of the policy's agents over their last 100 episodes.",
        labels=["job", "policy"],
    )
    episodes = CounterMetricFamily(
        "impala_policy_episodes", "Agent episodes of the policy.", labels=["job", "policy"]
    )
    score = GaugeMetricFamily(
        "impala_policy_self_play_score",
        "Self-play: mean score of the last 100 games against the snapshot pool (1 a win).",
        labels=["job", "policy"],
    )
    for name, policy in sorted(snap.policies.items()):
        if policy.episode_return_mean is not None:
            returns.add_metric([job, name], policy.episode_return_mean)
        episodes.add_metric([job, name], float(policy.episodes))
        if policy.self_play_score is not None:
            score.add_metric([job, name], policy.self_play_score)
    yield from (returns, episodes, score)


def _labelled(
    name: str, doc: str, job: str, label: str, values: dict[str, float]
) -> GaugeMetricFamily:
    """One gauge family with a series per `label` value, in the dict's order."""
    family = GaugeMetricFamily(name, doc, labels=["job", label])
    for key, value in values.items():
        family.add_metric([job, key], float(value))
    return family


def _attribute(snap: StatusSnapshot, path: str) -> float | None:
    """`snap.<path>`, or None where a part on the way is None (no checkpoint yet)."""
    value: Any = snap
    for part in path.split("."):
        if value is None:
            return None
        value = getattr(value, part)
    return None if value is None else float(value)
