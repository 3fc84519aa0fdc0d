"""The chart's dashboard and alerts ask only for series the product serves: every metric name in
a panel's query or an alert's expression is one the status sidecar or the operator exposes (a
renamed metric fails here, not on a blank panel in someone's Grafana)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from harness.sample_run import sample_history, sample_snapshot
from impala_api.snapshot import (
    CheckpointInfo,
    EvaluationInfo,
    PolicyStatus,
    ReturnTrend,
    StatusSnapshot,
    StopProgress,
)
from impala_operator.runtime import metrics as operator_metrics
from impala_trainer.sidecar.collector import snapshot_metrics

CHART = Path(__file__).resolve().parents[3] / "charts" / "impala-operator"
NAME = re.compile(r"\b(impala_[a-z_]+|up)\b(?!\s*\()")


def _full_snapshot() -> StatusSnapshot:
    """A multi-agent job's snapshot with an evaluation and a checkpoint: every family appears."""
    snap = sample_snapshot("j", sample_history(5, start_time=0.0)[-1])
    return snap.model_copy(update={
        "checkpoint": CheckpointInfo(path="checkpoints/ckpt-000001", time=1.0,
                                     num_env_steps_sampled=10),
        "evaluation": EvaluationInfo(evaluations=1, episode_return_mean=1.0, best_return_mean=1.0,
                                     opponent="random", wins=1, win_rate=1.0),
        "policies": {"main": PolicyStatus(episode_return_mean=0.5, episodes=3,
                                          self_play_score=0.5)},
        "return_trend": ReturnTrend(first_return_mean=0.0, best_return_mean=1.0),
        "stop": StopProgress(criteria={"timesteps": 100.0}, progress=0.5, foreseeable=0.5,
                             remaining_seconds=60.0),
    })  # fmt: skip


def _served() -> set[str]:
    class Snapshot(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            return snapshot_metrics(_full_snapshot(), "j")

    registry = CollectorRegistry()
    registry.register(Snapshot())
    operator_metrics.JOBS.record("uid", "Running", "ns", "j")
    try:
        families = [*registry.collect(), *operator_metrics.REGISTRY.collect()]
    finally:
        operator_metrics.JOBS.forget("uid")
    # A labelled counter has no sample until its first increment: its names come from its type.
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names = {f.name + s for f in families for s in suffixes.get(f.type, ("",))}
    return names | {s.name for f in families for s in f.samples} | {"up"}  # `up`: Prometheus's


def _queried(text: str) -> set[str]:
    return set(NAME.findall(text))


def test_every_dashboard_query_reads_a_served_metric() -> None:
    dashboard = json.loads((CHART / "dashboards" / "impalajob.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if "query" in v
              and isinstance(v["query"], dict)]  # fmt: skip
    assert len(exprs) > 20
    served = _served()
    for expr in exprs:
        assert _queried(expr), expr
        assert _queried(expr) <= served, f"{expr}: {_queried(expr) - served} is not served"


def test_every_alert_reads_a_served_metric() -> None:
    rules = (CHART / "templates" / "prometheusrule.yaml").read_text()
    exprs = re.findall(r"^\s*expr: (.*)$", rules, re.MULTILINE)
    exprs.append(re.search(r"\$running := `(.*)`", rules).group(1))  # type: ignore[union-attr]
    assert len(exprs) == 9
    served = _served()
    for expr in exprs:
        assert _queried(expr) <= served, f"{expr}: {_queried(expr) - served} is not served"
