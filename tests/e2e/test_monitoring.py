"""The chart plugged into the Prometheus Operator: its ServiceMonitor, PodMonitor and
PrometheusRule accepted by the API server under the Prometheus Operator's own CRDs, the alerts
checked and unit-tested by Prometheus's promtool, the dashboard's ConfigMap labelled for Grafana's
sidecar, and the operator told which namespace may scrape the jobs' sidecars."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import Kube, build_binaries
from harness.cluster.monitoring import install_crds, promtool

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHART = str(ROOT / "charts" / "impala-operator")
ALERT_TESTS = Path(__file__).parent / "monitoring" / "alerts_test.yaml"
ALL_ON = [
    "--set", "monitoring.serviceMonitor.enabled=true",
    "--set", "monitoring.podMonitor.enabled=true",
    "--set", "monitoring.rules.enabled=true", "--set", "monitoring.dashboards.enabled=true",
    "--set", "monitoring.labels.release=kube-prometheus-stack",
]  # fmt: skip


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    return build_binaries("promtool", "prometheus-operator-crds", quiet=True)


def _render(kube: Kube, namespace: str, *args: str) -> list[dict[str, Any]]:
    out = kube.helm("template", "impala", CHART, "--namespace", namespace, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_monitoring_is_off_by_default(kube: Kube) -> None:
    kinds = {d["kind"] for d in _render(kube, "impala-system")}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert "ConfigMap" not in kinds


def test_the_monitoring_objects_are_accepted_under_the_prometheus_operators_crds(
    kube: Kube, namespace: str, bin_dir: Path
) -> None:
    """Created for real (not a dry run) against the CRDs' structural schemas; each selects what
    it must: the operator's metrics Service, every job's learner pod by its metrics port."""
    install_crds(kube, bin_dir)
    docs = _render(kube, namespace, *ALL_ON)
    monitoring = [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert sorted(d["kind"] for d in monitoring) == ["PodMonitor", "PrometheusRule",
                                                     "ServiceMonitor"]  # fmt: skip
    kube.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": monitoring}
    ))  # fmt: skip
    service_monitor = kube.get("servicemonitor", "-n", namespace)["items"][0]
    (service,) = [d for d in docs if d["kind"] == "Service"]
    selector = service_monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert service_monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    pod_monitor = kube.get("podmonitor", "-n", namespace)["items"][0]
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert pod_monitor["spec"]["namespaceSelector"] == {"any": True}
    for obj in (service_monitor, pod_monitor):
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rule = kube.get("prometheusrule", "-n", namespace)["items"][0]
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert len(alerts) == 8 and "ImpalaJobFailed" in alerts

    (dashboard,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["impalajob.json"])["uid"] == "impalajob"
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]
           ["containers"][0]["env"]}  # fmt: skip
    assert env["IMPALA_OPERATOR_MONITORING_NAMESPACE"] == "monitoring"


def test_promtool_checks_the_alerts_and_each_fires_only_when_it_should(
    kube: Kube, bin_dir: Path, tmp_path: Path
) -> None:
    """`promtool check rules` on the rendered PrometheusRule's groups, then `promtool test rules`
    (tests/e2e/monitoring/alerts_test.yaml): every alert fires on the series that should fire it,
    at the default thresholds, and stays silent on the one beside it that should not."""
    (rule,) = [d for d in _render(kube, "impala-system", *ALL_ON) if d["kind"] == "PrometheusRule"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    tool = str(promtool(bin_dir))
    checked = subprocess.run([tool, "check", "rules", "rules.yaml"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert checked.returncode == 0 and "SUCCESS: 8 rules found" in checked.stdout, checked
    tested = subprocess.run([tool, "test", "rules", ALERT_TESTS.name], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_long_release_names_keep_every_object_name_within_63(kube: Kube) -> None:
    for doc in _render(kube, "impala-system", *ALL_ON, "--set", "fullnameOverride=" + "x" * 63):
        assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]
