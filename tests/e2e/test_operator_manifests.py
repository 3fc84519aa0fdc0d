"""The operator suite again, installed with `kubectl apply -f manifests/` instead of Helm.

The operator process authenticates as the manifests' ServiceAccount (impala-system/
impala-operator, bound to the ClusterRole in manifests/rbac.yaml) and watches the test namespace.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import Kube
from tests.support.operator_suite import OperatorSuite

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


class TestOperatorManifests(OperatorSuite):
    """Installed with `kubectl apply -f manifests/` (cluster-wide RBAC)."""

    @pytest.fixture(scope="class")
    def operator_identity(self, kube: Kube, ns: str) -> Path:
        # Not recursive: manifests/examples/ holds jobs, not the installation.
        kube.kubectl("apply", "-f", str(MANIFESTS))
        return kube.sa_kubeconfig("impala-system", "impala-operator")
