"""The operator end to end on the real control plane, installed with the Helm chart.

The operator runs as a local process (`impalajob operator --namespace NS`) authenticated as the
chart's own ServiceAccount, so every test also proves the chart's RBAC is enough. Pods are kwok's:
tests end learner pods through the exit-code annotation, and point the operator at a REAL status
sidecar (`impalajob status-server`) over run directories they write. `OperatorSuite`
(tests/support/operator_suite.py) holds the tests; `test_operator_manifests.py` runs the same suite
after `kubectl apply -f manifests/`.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import Kube, wait_for
from tests.support.jobs import job_manifest
from tests.support.operator_suite import OPERATOR_ENV, SMALL_JOB, Operator, OperatorSuite

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHART = Path(__file__).resolve().parents[2] / "charts" / "impala-operator"


class TestOperatorHelm(OperatorSuite):
    """Installed with `helm install` in namespaced mode (a Role in the watched namespace)."""

    @pytest.fixture(scope="class")
    def operator_identity(self, kube: Kube, ns: str) -> Iterator[Path]:
        release = "impala-e2e"
        kube.helm("install", release, str(CHART), "-n", ns, "--set", f"watchNamespaces={{{ns}}}")
        sa = kube.get("serviceaccount", "-n", ns, "-l", f"app.kubernetes.io/instance={release}")
        (account,) = [a["metadata"]["name"] for a in sa["items"]]
        try:
            yield kube.sa_kubeconfig(ns, account)
        finally:
            kube.helm("uninstall", release, "-n", ns, check=False)

    def test_two_replicas_elect_one_leader_and_fail_over(
        self, kube: Kube, ns: str, operator: Operator, operator_identity: Path,
        tmp_path: Path,
    ) -> None:  # fmt: skip
        """The chart's two replicas: only the Lease holder reconciles; SIGKILL it and the
        standby takes the Lease and the jobs over (lease 4 s here; the chart's default 15)."""
        operator.kill()  # the suite's operator (no election) steps aside for this test
        replicas = [Operator(kube, operator_identity, ns, tmp_path / f"r{i}") for i in (0, 1)]
        env = {"IMPALA_OPERATOR_LEASE_DURATION": "4"}
        try:
            for op in replicas:
                op.logdir.mkdir()
                OPERATOR_ENV.update(env)
                op.start("--leader-elect")

            def holder() -> str:
                lease = kube.get("lease", "impala-operator", "-n", ns)
                return str(lease["spec"].get("holderIdentity") or "")

            leader_id = wait_for(holder, timeout=30, what="a lease holder")
            leading = [op for op in replicas if str(op.proc.pid) in leader_id]  # type: ignore[union-attr]
            assert len(leading) == 1, (leader_id, [op.proc.pid for op in replicas])  # type: ignore[union-attr]
            (leader,) = leading
            (standby,) = [op for op in replicas if op is not leader]
            self.create(kube, ns, job_manifest("ha-one", SMALL_JOB))
            self.wait_status(kube, ns, "ha-one", lambda s: s.get("phase") == "Running", "Running")
            assert "standing by" in standby.log_tail(200)
            assert "ha-one" not in standby.log_tail(200)  # the standby reconciled nothing
            leader.kill(signal.SIGKILL)
            t0 = time.monotonic()
            wait_for(lambda: holder() not in ("", leader_id), timeout=30, what="a new holder")
            self.create(kube, ns, job_manifest("ha-two", SMALL_JOB))
            self.wait_status(kube, ns, "ha-two", lambda s: s.get("phase") == "Running", "Running")
            print(f"failover: ha-two Running {time.monotonic() - t0:.1f} s after the SIGKILL")
            assert "took over lease" in standby.log_tail(200)
        finally:
            for key in env:
                OPERATOR_ENV.pop(key, None)
            for op in replicas:
                op.kill()
            operator.start()

    def test_sigterm_exits_zero_and_the_leader_hands_its_lease_over(
        self, kube: Kube, ns: str, operator: Operator, operator_identity: Path,
        tmp_path: Path,
    ) -> None:  # fmt: skip
        """A deleted operator pod (SIGTERM) exits 0 whether it stands by or leads, and a leader
        releases its Lease: the standby leads at its next poll, not after the 15 s lease."""
        operator.kill()
        replicas = [Operator(kube, operator_identity, ns, tmp_path / f"r{i}") for i in (0, 1, 2)]

        def holder() -> str:
            got = kube.kubectl("get", "lease", "impala-operator", "-n", ns, "-o", "json",
                               check=False)  # fmt: skip
            if got.returncode != 0:
                return ""
            return str(json.loads(got.stdout)["spec"].get("holderIdentity") or "")

        def leading(ops: list[Operator]) -> list[Operator]:
            return [op for op in ops if op.proc is not None and str(op.proc.pid) in holder()]

        def stop(op: Operator) -> int:
            assert op.proc is not None
            op.proc.send_signal(signal.SIGTERM)
            code = op.proc.wait(timeout=60)
            op.proc = None
            return code

        try:
            for op in replicas[:2]:
                op.logdir.mkdir()
                op.start("--leader-elect")
            (leader,) = wait_for(lambda: leading(replicas[:2]), timeout=60, what="a leader")
            (standby,) = [op for op in replicas[:2] if op is not leader]
            wait_for(lambda: "standing by" in standby.log_tail(200), timeout=30, what="standby")
            assert stop(standby) == 0, standby.log_tail()
            successor = replicas[2]
            successor.logdir.mkdir()
            successor.start("--leader-elect")
            wait_for(lambda: "standing by" in successor.log_tail(200), timeout=30, what="standby")
            t0 = time.monotonic()
            assert stop(leader) == 0, leader.log_tail()
            assert "released lease" in leader.log_tail(200)
            wait_for(lambda: leading([successor]), timeout=30, what="the hand-over")
            handover = time.monotonic() - t0
            print(f"handover: the successor led {handover:.1f} s after the leader's SIGTERM")
            assert handover < 12, handover  # the lease is 15 s: a release, not a lapse
        finally:
            for op in replicas:
                op.kill()
            operator.start()
