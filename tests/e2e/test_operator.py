"""The operator end to end on the real control plane, installed by each install path.

The operator runs as a local process (`impalajob operator --namespace NS`) authenticated as the
installation's own ServiceAccount, so every test also proves that installation's RBAC is enough.
Pods are kwok's: tests end learner pods through the exit-code annotation, and point the operator
at a REAL status sidecar (`impalajob status-server`) over run directories they write.
`OperatorTests` holds the tests every install path runs: `TestOperatorHelm` after `helm install`
(namespaced, plus leader election's tests), `TestOperatorManifests` after `kubectl apply -f
manifests/` (the manifests' ServiceAccount, impala-system/impala-operator, bound to the
ClusterRole in manifests/rbac.yaml). Fixtures and helpers: tests/support/operator_suite.py.
"""
from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import Kube, wait_for
from tests.support.jobs import job_manifest, static_volume
from tests.support.operator_suite import (
    EXAMPLE,
    OPERATOR_ENV,
    SMALL_JOB,
    URL_ANNOTATION,
    Operator,
    OperatorSuite,
    Sidecar,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHART = Path(__file__).resolve().parents[2] / "charts" / "impala-operator"
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


class OperatorTests(OperatorSuite):
    """The operator's end-to-end behaviour; subclasses provide `operator_identity` (install)."""

    def test_cartpole_example_children_status_and_printer_columns(
        self, kube: Kube, ns: str, operator: Operator, sidecar: Sidecar
    ) -> None:
        docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
        (example,) = [d for d in docs if d["kind"] == "ImpalaJob"]
        (claim,) = [d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"]
        assert example["spec"]["checkpoint"]["volumeClaim"] == claim
        n = example["spec"]["rollouts"]["minReplicas"]  # no replicas requested: start at min
        # No StorageClass here: the example's claim binds to a volume an administrator made.
        kube.apply(static_volume(ns, claim, "/tmp"))
        kube.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))
        kube.kubectl("annotate", "ij", "cartpole", "-n", ns, f"{URL_ANNOTATION}={sidecar.url}")
        live = self.ij(kube, ns, "cartpole")
        uid = live["metadata"]["uid"]

        st = self.wait_status(
            kube,
            ns,
            "cartpole",
            lambda s: s.get("phase") == "Running" and s["rollouts"]["ready"] == n,
            "Running with 2 rollouts",
        )
        config = kube.get("configmap", "cartpole-config", "-n", ns)
        job_yaml = yaml.safe_load(config["data"]["job.yaml"])
        for section, fields in example["spec"].items():  # the job's spec, defaults filled in
            for key, value in fields.items():
                assert job_yaml["spec"][section][key] == value, (section, key)

        pod = kube.get("pod", "cartpole-learner-0", "-n", ns)
        assert pod["metadata"]["ownerReferences"][0]["uid"] == uid
        assert pod["spec"]["restartPolicy"] == "Never"
        assert [c["name"] for c in pod["spec"]["containers"]] == ["learner"]
        assert [c["name"] for c in pod["spec"]["initContainers"]] == ["status"]
        assert pod["status"]["phase"] == "Running"
        learner_svc = kube.get("service", "cartpole-learner", "-n", ns)
        assert learner_svc["spec"]["clusterIP"] == "None"
        kube.get("service", "cartpole-status", "-n", ns)
        kube.get("networkpolicy", "cartpole-network", "-n", ns)
        # The learner's budget: the API server computes it against the running learner pod.
        pdb = kube.get("poddisruptionbudget", "cartpole-learner", "-n", ns)
        assert pdb["spec"]["minAvailable"] == 1
        assert pdb["metadata"]["ownerReferences"][0]["uid"] == uid
        wait_for(
            lambda: (
                kube.get("pdb", "cartpole-learner", "-n", ns).get("status", {}).get("expectedPods")
                == 1
            ),
            timeout=60,
            what="the learner PodDisruptionBudget to cover the learner pod",
        )
        assert self.replicas(kube, ns, "cartpole-rollout") == n
        assert self.replicas(kube, ns, "cartpole-aggregator") == 0
        rollout_pods = kube.pods(
            ns, "app.kubernetes.io/instance=cartpole,app.kubernetes.io/component=rollout"
        )
        assert len(rollout_pods) == n and {p["status"]["phase"] for p in rollout_pods} == {
            "Running"
        }
        for child in ("configmap/cartpole-config", "deployment/cartpole-rollout"):
            owners = kube.get(child, "-n", ns)["metadata"]["ownerReferences"]
            assert owners[0]["uid"] == uid and owners[0]["controller"] is True

        assert st["statusURL"] == f"http://cartpole-status.{ns}.svc:8080/status"
        assert st["learner"] == {
            "ready": True,
            "replicas": 1,
            "readyReplicas": 1,
            "summary": "1/1",
            "restarts": 0,
            "failures": 0,
            "disruptions": 0,
            "podName": "cartpole-learner-0",
        }
        assert st["observedGeneration"] == live["metadata"]["generation"]
        assert st["startTime"] and self.condition(st, "Running")["status"] == "True"
        for cond in st["conditions"]:  # metav1.Condition's shape, on the applied generation
            assert cond["observedGeneration"] == st["observedGeneration"], cond
            assert cond["reason"] and cond["message"] and cond["lastTransitionTime"], cond

        # The status follows the sidecar.
        sidecar.write(fill=0.5, idle=0.1, steps=12_500)
        st = self.wait_status(
            kube,
            ns,
            "cartpole",
            lambda s: s.get("progress", {}).get("timesteps") == 12_500,
            "progress from the sidecar",
        )
        assert st["progress"]["episodeReturnMean"] == 125.0
        assert st["progress"]["envStepsPerSecond"] == 700.0
        assert st["progress"]["learnerQueueFill"] == 0.5

        # 12,500 of the sidecar's 50,000 steps, 37,500 left at 700/s.
        assert (st["progress"]["percentComplete"], st["progress"]["eta"]) == (25, "54s")
        table = kube.kubectl("get", "ij", "-n", ns).stdout.splitlines()
        header = ["NAME", "PHASE", "LEARNERS", "ROLLOUTS", "STEPS", "RETURN", "DONE%", "ETA", "AGE",
                  "REGRESSED"]  # fmt: skip
        assert table[0].split() == header
        row = ["cartpole", "Running", "1/1", f"{n}/{n}", "12500", "125", "25", "54s"]
        assert table[1].split()[:8] == row
        assert "Created" in self.events(kube, ns, "cartpole")
        metrics = operator.metrics()
        assert 'impala_operator_jobs{phase="Running"}' in metrics
        assert "impala_operator_reconciles_total" in metrics

    def test_autoscaling_follows_the_learner_queue(
        self, kube: Kube, ns: str, operator: Operator, sidecar: Sidecar
    ) -> None:
        manifest = job_manifest(
            "scaler",
            SMALL_JOB,
            rollouts={
                "minReplicas": 1,
                "maxReplicas": 3,
                "workersPerPod": 4,
                "autoscaling": {"cooldownSeconds": 1, "stabilizationWindowSeconds": 2},
            },
            aggregators={"minReplicas": 0, "maxReplicas": 2},
        )
        manifest["metadata"]["annotations"] = {URL_ANNOTATION: sidecar.url}
        seen: list[int] = []

        def rollouts_at(n: int, fill: float, idle: float) -> Callable[[], bool]:
            def check() -> bool:
                sidecar.write(fill=fill, idle=idle)  # keep the snapshot fresh
                seen.append(self.replicas(kube, ns, "scaler-rollout"))
                return seen[-1] == n

            return check

        sidecar.write(fill=0.0, idle=0.95)  # starving: the learner waits on an empty queue
        self.create(kube, ns, manifest)
        wait_for(rollouts_at(3, 0.0, 0.95), timeout=90, what="scale up to max 3")
        assert self.replicas(kube, ns, "scaler-aggregator") == 2  # ceil(3 pods * 4 / 4), max 2
        st = self.ij(kube, ns, "scaler")["status"]
        assert st["lastScaleTime"] and st["rollouts"]["desired"] == 3
        wait_for(rollouts_at(1, 1.0, 0.0), timeout=90, what="scale down to min 1")
        assert self.replicas(kube, ns, "scaler-aggregator") == 1
        assert max(seen) == 3 and min(seen) == 1
        reasons = self.events(kube, ns, "scaler")
        # Steps of 1: two decisions each way (1 -> 2 -> 3 -> 2 -> 1), each an Event.
        assert reasons.count("LearnerStarved") == 2 and reasons.count("LearnerQueueSaturated") == 2

    def test_kubectl_scale_sets_rollouts(self, kube: Kube, ns: str, operator: Operator) -> None:
        self.create(
            kube,
            ns,
            job_manifest("scaled", SMALL_JOB, rollouts={"minReplicas": 1, "maxReplicas": 4}),
        )
        self.wait_status(kube, ns, "scaled", lambda s: s.get("phase") == "Running", "Running")
        kube.kubectl("scale", "ij/scaled", "-n", ns, "--replicas=3")
        wait_for(
            lambda: self.replicas(kube, ns, "scaled-rollout") == 3,
            timeout=30,
            what="rollouts scaled to 3",
        )
        self.wait_status(kube, ns, "scaled", lambda s: s["rollouts"]["ready"] == 3, "3 ready")
        scale = kube.get("ij/scaled", "-n", ns, "--subresource=scale")
        assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
        assert "ManualScale" in self.events(kube, ns, "scaled")

    def test_spec_changes_take_effect_live(self, kube: Kube, ns: str, operator: Operator) -> None:
        self.create(
            kube, ns, job_manifest("live", SMALL_JOB, rollouts={"minReplicas": 2, "maxReplicas": 4})
        )
        self.wait_status(
            kube,
            ns,
            "live",
            lambda s: s.get("phase") == "Running" and s["rollouts"]["ready"] == 2,
            "Running with 2 rollouts",
        )
        first_uid = kube.get("pod", "live-learner-0", "-n", ns)["metadata"]["uid"]
        patch = {
            "spec": {
                "rollouts": {
                    "minReplicas": 1,
                    "maxReplicas": 1,
                    "resources": {"limits": {"memory": "1Gi"}},
                },
                "learner": {"resources": {"limits": {"memory": "2Gi"}}},
            }
        }
        kube.kubectl("patch", "ij", "live", "-n", ns, "--type=merge", "-p", json.dumps(patch))
        wait_for(
            lambda: self.replicas(kube, ns, "live-rollout") == 1,
            timeout=30,
            what="rollouts clamped to the new max",
        )
        template = kube.get("deployment", "live-rollout", "-n", ns)["spec"]["template"]
        assert template["spec"]["containers"][0]["resources"]["limits"]["memory"] == "1Gi"

        def recreated() -> dict[str, Any] | None:
            pod = kube.get("pod", "live-learner-0", "-n", ns)
            return pod if pod["metadata"]["uid"] != first_uid else None

        pod = wait_for(recreated, timeout=60, what="learner pod recreated with new resources")
        assert pod["spec"]["containers"][0]["resources"]["limits"]["memory"] == "2Gi"
        st = self.wait_status(
            kube,
            ns,
            "live",
            lambda s: s.get("phase") == "Running" and s["rollouts"]["summary"] == "1/1",
            "Running again",
        )
        assert st["learner"]["restarts"] == 0  # a spec change is not a failure
        reasons = self.events(kube, ns, "live")
        assert "LearnerSpecChanged" in reasons and "ReplicasOutOfBounds" in reasons

    def test_suspend_keeps_the_checkpoint_and_resume_continues(
        self, kube: Kube, ns: str, operator: Operator
    ) -> None:
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"ckpt-{ns}"},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "e2e-manual",
                    "hostPath": {"path": "/var/lib/impala-e2e/ckpt"},
                    "claimRef": {"namespace": ns, "name": "ckpt"},
                },
            }
        )
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "ckpt", "namespace": ns},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "e2e-manual",
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
        )
        self.create(kube, ns, job_manifest("pausy", SMALL_JOB, checkpoint={"volumeClaim": "ckpt"}))
        self.wait_status(kube, ns, "pausy", lambda s: s.get("phase") == "Running", "Running")
        claim_uid = kube.get("pvc", "ckpt", "-n", ns)["metadata"]["uid"]

        kube.kubectl(
            "patch",
            "ij",
            "pausy",
            "-n",
            ns,
            "--type=merge",
            "-p",
            '{"spec": {"runPolicy": {"suspend": true}}}',
        )
        st = self.wait_status(
            kube, ns, "pausy", lambda s: s.get("phase") == "Suspended", "Suspended"
        )
        wait_for(
            lambda: self.learner_pods(kube, ns, "pausy") == [],
            timeout=30,
            what="learner pod deleted",
        )
        assert self.replicas(kube, ns, "pausy-rollout") == 0
        assert self.replicas(kube, ns, "pausy-aggregator") == 0
        assert self.condition(st, "Suspended")["status"] == "True"
        assert kube.get("pvc", "ckpt", "-n", ns)["metadata"]["uid"] == claim_uid

        kube.kubectl(
            "patch",
            "ij",
            "pausy",
            "-n",
            ns,
            "--type=merge",
            "-p",
            '{"spec": {"runPolicy": {"suspend": false}}}',
        )
        st = self.wait_status(
            kube, ns, "pausy", lambda s: s.get("phase") == "Running", "Running again"
        )
        assert self.learner_pods(kube, ns, "pausy") == ["pausy-learner-0"]
        assert st["learner"]["restarts"] == 0 and self.replicas(kube, ns, "pausy-rollout") == 1
        pod = kube.get("pod", "pausy-learner-0", "-n", ns)
        claims = [
            v["persistentVolumeClaim"]["claimName"]
            for v in pod["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        ]
        assert claims == ["ckpt"]
        assert {"Suspended", "Resumed"} <= set(self.events(kube, ns, "pausy"))

    def test_learner_failure_restarts_up_to_backoff_limit(
        self, kube: Kube, ns: str, operator: Operator
    ) -> None:
        policy = {"backoffLimit": 2, "cleanPodPolicy": "All"}
        self.create(kube, ns, job_manifest("flaky", SMALL_JOB, runPolicy=policy))
        for attempt in range(3):
            pod = f"flaky-learner-{attempt}"
            self.wait_status(
                kube,
                ns,
                "flaky",
                lambda s, a=attempt: s.get("phase") == "Running" and s["learner"]["restarts"] == a,
                f"attempt {attempt} running",
            )
            kube.end_pod(ns, pod, exit_code=1, reason="Error")
        st = self.wait_status(kube, ns, "flaky", lambda s: s.get("phase") == "Failed", "Failed")
        failed = self.condition(st, "Failed")
        assert failed["status"] == "True" and failed["reason"] == "BackoffLimitExceeded"
        assert st["learner"]["restarts"] == 2 and st["learner"]["lastExitCode"] == 1
        assert st["completionTime"]
        wait_for(
            lambda: self.learner_pods(kube, ns, "flaky") == [],
            timeout=30,
            what="cleanPodPolicy All removes the learner pods",
        )
        reasons = self.events(kube, ns, "flaky")
        assert reasons.count("LearnerFailed") == 2 and "BackoffLimitExceeded" in reasons

    def test_a_disrupted_learner_uses_no_retry_and_its_budget_refuses_eviction(
        self, kube: Kube, ns: str, operator: Operator
    ) -> None:
        """backoffLimit 0: two SIGTERM ends (a spot reclaim, a drain) restart the learner and the
        job runs on; the learner's PodDisruptionBudget makes the API server refuse an eviction;
        the first real crash fails the job."""
        self.create(kube, ns, job_manifest("spot", SMALL_JOB, runPolicy={"backoffLimit": 0}))
        for attempt, code in enumerate((143, 130)):
            self.wait_status(
                kube,
                ns,
                "spot",
                lambda s, a=attempt: s.get("phase") == "Running" and s["learner"]["restarts"] == a,
                f"attempt {attempt} running",
            )
            if attempt == 0:
                wait_for(
                    lambda: (
                        kube.get("pdb", "spot-learner", "-n", ns)
                        .get("status", {})
                        .get("currentHealthy")
                        == 1
                    ),
                    timeout=60,
                    what="the learner budget to see the ready learner",
                )
                eviction = {
                    "apiVersion": "policy/v1",
                    "kind": "Eviction",
                    "metadata": {"name": "spot-learner-0", "namespace": ns},
                }
                res = kube.kubectl(
                    "create",
                    "--raw",
                    f"/api/v1/namespaces/{ns}/pods/spot-learner-0/eviction",
                    "-f",
                    "-",
                    stdin=json.dumps(eviction),
                    check=False,
                )
                assert res.returncode != 0 and "disruption budget" in res.stderr, res.stderr
            kube.end_pod(ns, f"spot-learner-{attempt}", exit_code=code, reason="Error")
        st = self.wait_status(
            kube,
            ns,
            "spot",
            lambda s: s.get("phase") == "Running" and s["learner"]["restarts"] == 2,
            "attempt 2 running after two disruptions",
        )
        assert (st["learner"]["failures"], st["learner"]["disruptions"]) == (0, 2)
        assert self.events(kube, ns, "spot").count("LearnerDisrupted") == 2
        kube.end_pod(ns, "spot-learner-2", exit_code=1, reason="Error")
        st = self.wait_status(kube, ns, "spot", lambda s: s.get("phase") == "Failed", "Failed")
        assert self.condition(st, "Failed")["reason"] == "BackoffLimitExceeded"

    def test_stop_succeeds_and_cleans_up(self, kube: Kube, ns: str, operator: Operator) -> None:
        self.create(kube, ns, job_manifest("done", SMALL_JOB, runPolicy={"cleanPodPolicy": "All"}))
        self.create(kube, ns, job_manifest("keep", SMALL_JOB, runPolicy={"cleanPodPolicy": "None"}))
        self.create(kube, ns, job_manifest("dflt", SMALL_JOB))  # cleanPodPolicy Running
        for name in ("done", "keep", "dflt"):
            self.wait_status(kube, ns, name, lambda s: s.get("phase") == "Running", "Running")
            kube.end_pod(ns, f"{name}-learner-0", exit_code=0)
        # What a pipeline runs to wait for a job: the Succeeded condition, per API conventions.
        kube.kubectl("wait", "--for=condition=Succeeded", "ij/done", "-n", ns, "--timeout=90s")
        for name in ("done", "keep", "dflt"):
            st = self.wait_status(
                kube, ns, name, lambda s: s.get("phase") == "Succeeded", "Succeeded"
            )
            assert st["completionTime"] and self.condition(st, "Succeeded")["status"] == "True"
        wait_for(
            lambda: self.learner_pods(kube, ns, "done") == [],
            timeout=30,
            what="finished learner pod removed",
        )
        assert self.replicas(kube, ns, "done-rollout") == 0
        assert self.learner_pods(kube, ns, "keep") == ["keep-learner-0"]
        assert self.replicas(kube, ns, "keep-rollout") == 1
        # The default keeps the finished learner pod (its logs, its exit code), stops the rest.
        wait_for(
            lambda: self.replicas(kube, ns, "dflt-rollout") == 0,
            timeout=30,
            what="the default cleanPodPolicy scales the rollouts to zero",
        )
        assert self.learner_pods(kube, ns, "dflt") == ["dflt-learner-0"]
        assert "Completed" in self.events(kube, ns, "done")
        # No claim and no storageUri: the user is told the results die with the pod.
        assert "ResultsNotDurable" in self.events(kube, ns, "done")

    def test_deadline_fails_the_job(self, kube: Kube, ns: str, operator: Operator) -> None:
        self.create(
            kube, ns, job_manifest("late", SMALL_JOB, runPolicy={"activeDeadlineSeconds": 3})
        )
        st = self.wait_status(kube, ns, "late", lambda s: s.get("phase") == "Failed", "Failed")
        assert self.condition(st, "Failed")["reason"] == "DeadlineExceeded"
        assert "DeadlineExceeded" in self.events(kube, ns, "late")

    def test_startup_deadline_fails_a_learner_no_node_fits(
        self, kube: Kube, ns: str, operator: Operator
    ) -> None:
        manifest = job_manifest(
            "unfit",
            SMALL_JOB,
            learner={"nodeSelector": {"e2e.impala.dev/no-such-node": "true"}},
            runPolicy={"startupDeadlineSeconds": 5},
        )
        self.create(kube, ns, manifest)
        wait_for(
            lambda: self.learner_pods(kube, ns, "unfit") == ["unfit-learner-0"],
            timeout=30,
            what="the learner pod",
        )
        pod = kube.get("pod", "unfit-learner-0", "-n", ns)  # created, and never scheduled
        assert pod["status"]["phase"] == "Pending"
        st = self.wait_status(kube, ns, "unfit", lambda s: s.get("phase") == "Failed", "Failed")
        assert self.condition(st, "Failed")["reason"] == "StartupDeadlineExceeded"
        assert "StartupDeadlineExceeded" in self.events(kube, ns, "unfit")
        # The scheduler's reason, as the job's message: which pod, and why it has no node.
        assert "learner pod unfit-learner-0 cannot be scheduled: " in st["message"], st["message"]

    def test_ttl_deletes_the_finished_job(self, kube: Kube, ns: str, operator: Operator) -> None:
        self.create(
            kube, ns, job_manifest("brief", SMALL_JOB, runPolicy={"ttlSecondsAfterFinished": 1})
        )
        self.wait_status(kube, ns, "brief", lambda s: s.get("phase") == "Running", "Running")
        kube.end_pod(ns, "brief-learner-0", exit_code=0)

        def gone() -> bool:
            return kube.kubectl("get", "ij", "brief", "-n", ns, check=False).returncode != 0

        try:
            wait_for(gone, timeout=60, what="the ImpalaJob deleted by its TTL")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {self.ij(kube, ns, 'brief')['metadata']}") from None
        wait_for(
            lambda: (
                kube.get("deployments", "-n", ns, "-l", "app.kubernetes.io/instance=brief")["items"]
                == []
            ),
            timeout=60,
            what="children garbage-collected",
        )

    def test_operator_killed_mid_reconcile_leaves_no_duplicates(
        self, kube: Kube, ns: str, operator: Operator
    ) -> None:
        names = [f"crash-{i}" for i in range(4)]
        items = [job_manifest(n, SMALL_JOB) for n in names]
        kube.kubectl(
            "apply",
            "-n",
            ns,
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )
        # Kill it while it is creating children, then start it again.
        with contextlib.suppress(TimeoutError):
            wait_for(
                lambda: kube.get(
                    "deployments", "-n", ns, "-l", "app.kubernetes.io/instance=crash-0"
                )["items"],
                timeout=20,
                interval=0.1,
                what="first child",
            )
        operator.kill(signal.SIGKILL)
        operator.start()
        for name in names:
            self.wait_status(
                kube,
                ns,
                name,
                lambda s: s.get("phase") == "Running" and s["rollouts"]["ready"] == 1,
                "Running",
                timeout=90,
            )
        for name in names:
            sel = f"app.kubernetes.io/instance={name}"
            kinds = kube.get(
                "configmaps,services,deployments,networkpolicies,poddisruptionbudgets,pods",
                "-n",
                ns,
                "-l",
                sel,
            )["items"]
            counts: dict[str, int] = {}
            for obj in kinds:
                counts[obj["kind"]] = counts.get(obj["kind"], 0) + 1
            # 2 Services; pods: the learner and one rollout pod.
            assert counts == {
                "ConfigMap": 1,
                "Service": 2,
                "Deployment": 2,
                "NetworkPolicy": 1,
                "PodDisruptionBudget": 1,
                "Pod": 2,
            }, (name, counts)
            assert self.learner_pods(kube, ns, name) == [f"{name}-learner-0"]


class TestOperatorHelm(OperatorTests):
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


class TestOperatorManifests(OperatorTests):
    """Installed with `kubectl apply -f manifests/` (cluster-wide RBAC)."""

    @pytest.fixture(scope="class")
    def operator_identity(self, kube: Kube, ns: str) -> Path:
        # Not recursive: manifests/examples/ holds jobs, not the installation.
        kube.kubectl("apply", "-f", str(MANIFESTS))
        return kube.sa_kubeconfig("impala-system", "impala-operator")
