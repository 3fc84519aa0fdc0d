"""What the chart's monitoring is checked with, built by build.sh beside the cluster's binaries:
the Prometheus Operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule, as its Go module
ships them) and Prometheus's `promtool`."""

from __future__ import annotations

import os
from pathlib import Path

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
