"""What the chart's monitoring is checked with, built by build.sh beside the cluster's binaries:
the Prometheus Operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule, as its Go module
ships them), Prometheus's `promtool` and the Prometheus server itself; and the scrape jobs the
Prometheus Operator renders from a ServiceMonitor and a PodMonitor (not the operator itself: a
Prometheus configured as it would configure one)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from harness.cluster.kube import Kube

CRDS = ("servicemonitors", "podmonitors", "prometheusrules")


def crds_file(bin_dir: Path) -> Path:
    version = os.environ.get("PROMETHEUS_OPERATOR_VERSION", "v0.94.0")
    return bin_dir.parent / f"prometheus-operator-crds-{version}.yaml"


def install_crds(kube: Kube, bin_dir: Path) -> None:
    """Apply the three CRDs (server-side: they are larger than client-side apply's annotation
    allows) and wait until the API server serves them."""
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds_file(bin_dir)))
    for plural in CRDS:
        kube.wait_crd_established(f"{plural}.monitoring.coreos.com")


def promtool(bin_dir: Path) -> Path:
    return bin_dir / "promtool"


def _label(key: str) -> str:
    """A Kubernetes label key as Prometheus's service discovery names it."""
    return "".join(c if c.isalnum() else "_" for c in key)


def _keep_labels(kind: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {
            "action": "keep",
            "source_labels": [f"__meta_kubernetes_{kind}_label_{_label(k)}",
                              f"__meta_kubernetes_{kind}_labelpresent_{_label(k)}"],
            "regex": f"({v});true",
        }
        for k, v in sorted(labels.items())
    ]  # fmt: skip


def _namespaces(selector: dict[str, Any]) -> dict[str, Any]:
    return {} if selector.get("any") else {"namespaces": {"names": selector["matchNames"]}}


def pod_monitor_scrape(monitor: dict[str, Any]) -> dict[str, Any]:
    """The scrape job the Prometheus Operator renders for a PodMonitor's first endpoint (its
    `kubernetes_sd` pod role, the selector and port kept, namespace/pod/container labels)."""
    meta, spec = monitor["metadata"], monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    name = f"{meta['namespace']}/{meta['name']}"
    return {
        "job_name": f"podMonitor/{name}/0",
        "honor_labels": bool(endpoint.get("honorLabels")),
        "scrape_interval": endpoint.get("interval", "30s"),
        "metrics_path": endpoint.get("path", "/metrics"),
        "kubernetes_sd_configs": [{"role": "pod", **_namespaces(spec["namespaceSelector"])}],
        "relabel_configs": [
            *_keep_labels("pod", spec["selector"]["matchLabels"]),
            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
             "regex": "(Failed|Succeeded)"},
            {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
             "regex": endpoint["port"]},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"],
             "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": name},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
        ],
    }  # fmt: skip


def service_monitor_scrape(monitor: dict[str, Any]) -> dict[str, Any]:
    """The scrape job the Prometheus Operator renders for a ServiceMonitor's first endpoint
    (the endpoints role; `job` is the Service's name, as the operator sets it)."""
    meta, spec = monitor["metadata"], monitor["spec"]
    (endpoint,) = spec["endpoints"]
    return {
        "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/0",
        "honor_labels": bool(endpoint.get("honorLabels")),
        "scrape_interval": endpoint.get("interval", "30s"),
        "metrics_path": endpoint.get("path", "/metrics"),
        "kubernetes_sd_configs": [{"role": "endpoints",
                                   **_namespaces(spec["namespaceSelector"])}],
        "relabel_configs": [
            *_keep_labels("service", spec["selector"]["matchLabels"]),
            {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
             "regex": endpoint["port"]},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
        ],
    }  # fmt: skip


def prometheus_objects(
    namespace: str, image: str, bin_dir: Path, config: dict[str, Any]
) -> list[dict[str, Any]]:
    """A Prometheus server in `namespace` (the binary from the cache, mounted into `image`),
    with `config` and the read access its Kubernetes service discovery needs."""
    name = "prometheus"
    rbac_name = f"{namespace}-{name}"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": rbac_name},
         "rules": [{"apiGroups": [""], "resources": ["pods", "services", "endpoints"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": rbac_name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": rbac_name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": name, "namespace": namespace},
         "data": {"prometheus.yml": yaml.safe_dump(config)}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
         "spec": {
             "serviceAccountName": name,
             "terminationGracePeriodSeconds": 1,
             "containers": [{
                 "name": name, "image": image, "imagePullPolicy": "IfNotPresent",
                 "command": ["/prometheus/bin/prometheus",
                             "--config.file=/etc/prometheus/prometheus.yml",
                             "--storage.tsdb.path=/tmp/tsdb",
                             "--web.listen-address=0.0.0.0:9090"],
                 "ports": [{"name": "web", "containerPort": 9090}],
                 "volumeMounts": [
                     {"name": "bin", "mountPath": "/prometheus/bin", "readOnly": True},
                     {"name": "config", "mountPath": "/etc/prometheus", "readOnly": True},
                 ],
             }],
             "volumes": [
                 {"name": "bin", "hostPath": {"path": str(bin_dir), "type": "Directory"}},
                 {"name": "config", "configMap": {"name": name}},
             ],
         }},
    ]  # fmt: skip
