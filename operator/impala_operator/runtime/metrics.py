"""The operator's own Prometheus metrics, served on `Settings.metrics_port` at /metrics.

A private registry (not prometheus_client's global one) keeps the exposition to what this module
defines plus the process collector (RSS, CPU, open fds), and lets tests build fresh ones.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from impala_operator.lifecycle.run_policy import Phase

PHASES: tuple[Phase, ...] = ("Pending", "Starting", "Running", "Suspended", "Succeeded", "Failed")

disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series only add noise for counters that start with us
REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)

RECONCILES = Counter(
    "impala_operator_reconciles",
    "Reconciles run, by kind: children (create/update/resume handlers) or tick (the timer).",
    ["kind"],
    registry=REGISTRY,
)
ERRORS = Counter(
    "impala_operator_reconcile_errors",
    "Reconciles that failed (retried), by kind.",
    ["kind"],
    registry=REGISTRY,
)
SCALE_DECISIONS = Counter(
    "impala_operator_scale_decisions",
    "Replica changes the operator made, by role and reason (LearnerStarved, ...).",
    ["role", "reason"],
    registry=REGISTRY,
)
TRANSITIONS = Counter(
    "impala_operator_transitions",
    "Events posted on ImpalaJobs, by reason (phase transitions and scaling decisions).",
    ["reason"],
    registry=REGISTRY,
)
LEADER = Gauge(
    "impala_operator_leader",
    "1 while this replica reconciles (it holds the Lease, or runs without election), 0 while it "
    "stands by: summed over the replicas, 0 means no one reconciles.",
    registry=REGISTRY,
)
TICK_SECONDS = Histogram(
    "impala_operator_reconcile_seconds",
    "Wall time of one timer reconcile of one job (sidecar read and API writes included).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)


class PhaseCollector(Collector):
    """`impala_operator_jobs{phase}`: jobs per phase, from the last phase seen of each job; and
    `impala_operator_job_phase{namespace,job,phase}`, 1 for each job's phase and 0 for the others
    (as kube-state-metrics' pod phase): what a job-failed alert or a fleet panel reads, also once
    the job's pods, and with them its sidecar's metrics, are gone."""

    def __init__(self) -> None:
        self.phases: dict[str, str] = {}
        self.names: dict[str, tuple[str, str]] = {}
        """key -> (namespace, name)."""

    def record(self, key: str, phase: str | None, namespace: str = "", name: str = "") -> None:
        """Remember `key`'s phase (None: not yet reconciled, counted as Pending)."""
        self.phases[key] = phase or "Pending"
        self.names[key] = (namespace, name or key)

    def forget(self, key: str) -> None:
        """The job is gone."""
        self.phases.pop(key, None)
        self.names.pop(key, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "impala_operator_jobs", "ImpalaJobs watched by this operator, by phase.",
            labels=["phase"],
        )  # fmt: skip
        for phase in PHASES:
            family.add_metric([phase], sum(1 for p in self.phases.values() if p == phase))
        yield family
        per_job = GaugeMetricFamily(
            "impala_operator_job_phase", "1 for each ImpalaJob's current phase, 0 for the others.",
            labels=["namespace", "job", "phase"],
        )  # fmt: skip
        for key, current in sorted(self.phases.items()):
            namespace, name = self.names[key]
            for phase in PHASES:
                per_job.add_metric([namespace, name, phase], float(phase == current))
        yield per_job


JOBS = PhaseCollector()
REGISTRY.register(JOBS)


def serve(port: int) -> None:
    """Serve /metrics on `port` from a daemon thread (0 disables)."""
    if port:
        start_http_server(port, registry=REGISTRY)
