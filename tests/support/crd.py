"""The ImpalaJob and ImpalaPopulation CRDs on a test cluster: `install_crd`, for every e2e module
that needs them."""

from __future__ import annotations

from pathlib import Path

from harness.cluster import Kube

CRD = Path(__file__).resolve().parents[2] / "manifests" / "crd.yaml"
"""manifests/crd.yaml: the CRD both install paths apply."""


def install_crd(kube: Kube) -> None:
    """Apply the CRD and wait until the API server serves it (idempotent; other modules too)."""
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    kube.wait_crd_established("impalajobs.impala.dev")
    kube.wait_crd_established("impalapopulations.impala.dev")
