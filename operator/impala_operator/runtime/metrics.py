"""The operator's own Prometheus metrics, served on `Settings.metrics_port` at /metrics.

A private registry (not prometheus_client's global one) keeps the exposition to what this module
defines plus the process collector (RSS, CPU, open fds), and lets tests build fresh ones.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
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
TICK_SECONDS = Histogram(
    "impala_operator_reconcile_seconds",
    "Wall time of one timer reconcile of one job (sidecar read and API writes included).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)


class PhaseCollector(Collector):
    """`impala_operator_jobs{phase}`: jobs per phase, from the last phase seen of each job."""

    def __init__(self) -> None:
        self.phases: dict[str, str] = {}

    def record(self, key: str, phase: str | None) -> None:
        """Remember `key`'s phase (None: not yet reconciled, counted as Pending)."""
        self.phases[key] = phase or "Pending"

    def forget(self, key: str) -> None:
        """The job is gone."""
        self.phases.pop(key, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "impala_operator_jobs", "ImpalaJobs watched by this operator, by phase.",
            labels=["phase"],
        )  # fmt: skip
        for phase in PHASES:
            family.add_metric([phase], sum(1 for p in self.phases.values() if p == phase))
        yield family


JOBS = PhaseCollector()
REGISTRY.register(JOBS)


def serve(port: int) -> None:
    """Serve /metrics on `port` from a daemon thread (0 disables)."""
    if port:
        start_http_server(port, registry=REGISTRY)
