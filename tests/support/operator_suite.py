"""The operator's end-to-end suite: `OperatorSuite` (its tests), run by each install path's test
module as a `Test*` subclass that provides `operator_identity` (tests/e2e/test_operator_helm.py,
test_operator_manifests.py); `Operator` (`impalajob operator` as a child process) and `Sidecar` (a
real status sidecar over a run directory the test writes).

Imports `cluster` (the harness under tests/cluster/), which tests/e2e/conftest.py puts on the path.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster import Kube, wait_for
from impala_api.roles import LOCAL_EXECUTABLE, status_command
from impala_api.snapshot import (
    STATUS_FILE,
    Counters,
    LearnerQueue,
    StatusSnapshot,
    Throughput,
    write_json_atomic,
)
from tests.support.jobs import job_manifest, static_volume
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "cartpole.yaml"
URL_ANNOTATION = "impala.dev/status-url"
OPERATOR_ENV = {
    "IMPALA_OPERATOR_RECONCILE_INTERVAL": "1",
    "IMPALA_OPERATOR_RESTART_BACKOFF_SECONDS": "1",
    "IMPALA_OPERATOR_SIDECAR_TIMEOUT": "1",
    "IMPALA_OPERATOR_HEALTH_PORT": "0",
}


class Operator:
    """`impalajob operator` as a child process, restartable (and killable) by tests."""

    def __init__(self, kube: Kube, kubeconfig: Path, namespace: str, logdir: Path) -> None:
        self.kube, self.kubeconfig, self.namespace, self.logdir = (
            kube,
            kubeconfig,
            namespace,
            logdir,
        )
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, *extra: str) -> None:
        self.starts += 1
        log = (self.logdir / f"operator-{self.starts}.log").open("wb")
        env = {**self.kube.env_for(self.kubeconfig), **OPERATOR_ENV}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "impala_cli.main",
                "operator",
                "--namespace",
                self.namespace,
                "--kubeconfig",
                str(self.kubeconfig),
                "--metrics-port",
                str(self.metrics_port),
                *(["--log-level=debug"] if os.environ.get("E2E_OPERATOR_VERBOSE") else []),
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        wait_for(self.metrics, timeout=60, what="operator /metrics")

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as response:
            return str(response.read().decode())

    def kill(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log_tail(self, lines: int = 60) -> str:
        text = (self.logdir / f"operator-{self.starts}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    @classmethod
    @contextlib.contextmanager
    def running(
        cls, kube: Kube, kubeconfig: Path, namespace: str, logdir: Path
    ) -> Iterator[Operator]:
        """An operator started for the block, stopped after it (its log tail printed)."""
        op = cls(kube, kubeconfig, namespace, logdir)
        op.start()
        try:
            yield op
        finally:
            op.kill()
            print(f"--- operator log tail\n{op.log_tail()}")


class Sidecar:
    """A real status sidecar (`impalajob status-server`) over a run directory the test writes."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/status"
        self.steps = 0
        self.write(fill=0.5, idle=0.1)
        self.proc = subprocess.Popen(
            status_command(
                str(run_dir), status_port=self.port, host="127.0.0.1", executable=LOCAL_EXECUTABLE
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for(
            lambda: urllib.request.urlopen(self.url, timeout=2).status == 200,
            timeout=60,
            what="status sidecar",
        )

    def write(self, *, fill: float, idle: float, steps: int | None = None) -> None:
        """A fresh snapshot of a running learner: queue fill, idle fraction, env steps."""
        self.steps = self.steps + 500 if steps is None else steps
        write_json_atomic(
            self.run_dir / STATUS_FILE,
            StatusSnapshot(
                job="e2e",
                phase="Running",
                started_at=time.time() - 60,
                updated_at=time.time(),
                counters=Counters(num_env_steps_sampled=self.steps, episodes=self.steps // 50),
                episode_return_mean=round(self.steps / 100, 1),
                throughput=Throughput(env_steps_per_s=700.0),
                learner_queue=LearnerQueue(capacity=16, fill=fill, learner_idle_fraction=idle),
            ),
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


SMALL_JOB: dict[str, Any] = {
    "env": {"id": "CartPole-v1", "numEnvsPerWorker": 4},
    "rollouts": {"minReplicas": 1, "maxReplicas": 3},
}
"""The spec of the suite's jobs (`job_manifest(name, SMALL_JOB, **sections)`)."""


class OperatorSuite:
    """The operator's end-to-end behaviour; subclasses provide `operator_identity` (install)."""

    @pytest.fixture(scope="class")
    def ns(self, kube: Kube) -> Iterator[str]:
        with kube.namespace(type(self).__name__.lower()[:20]) as name:
            yield name

    @pytest.fixture(scope="class")
    def operator_identity(self, kube: Kube, ns: str) -> Path:
        raise NotImplementedError

    @pytest.fixture(scope="class")
    def operator(
        self, kube: Kube, ns: str, operator_identity: Path, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[Operator]:
        with Operator.running(
            kube, operator_identity, ns, tmp_path_factory.mktemp("operator")
        ) as op:
            yield op

    @pytest.fixture
    def sidecar(self, tmp_path: Path) -> Iterator[Sidecar]:
        sc = Sidecar(tmp_path / "run")
        yield sc
        sc.stop()

    # --- helpers ---------------------------------------------------------------------------

    @staticmethod
    def create(kube: Kube, ns: str, manifest: dict[str, Any]) -> None:
        kube.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(manifest))

    @staticmethod
    def ij(kube: Kube, ns: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = kube.get("ij", name, "-n", ns)
        return result

    def wait_status(
        self,
        kube: Kube,
        ns: str,
        name: str,
        check: Callable[[dict[str, Any]], Any],
        what: str,
        timeout: float = 60,
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            status = self.ij(kube, ns, name).get("status") or {}
            return status if check(status) else None

        try:
            return wait_for(probe, timeout=timeout, interval=0.5, what=f"{name}: {what}")
        except TimeoutError as exc:
            status = self.ij(kube, ns, name).get("status") or {}
            raise AssertionError(f"{exc}; status: {json.dumps(status)}") from None

    @staticmethod
    def replicas(kube: Kube, ns: str, name: str) -> int:
        return int(kube.get("deployment", name, "-n", ns)["spec"]["replicas"])

    @staticmethod
    def learner_pods(kube: Kube, ns: str, name: str) -> list[str]:
        pods = kube.pods(
            ns, f"app.kubernetes.io/instance={name},app.kubernetes.io/component=learner"
        )
        return sorted(
            p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")
        )

    @staticmethod
    def events(kube: Kube, ns: str, name: str) -> list[str]:
        items = kube.get("events", "-n", ns, "--field-selector", f"involvedObject.name={name}")
        return [e["reason"] for e in items["items"]]

    @staticmethod
    def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
        return next((c for c in status.get("conditions", []) if c["type"] == type_), {})

    # --- tests -----------------------------------------------------------------------------

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

        table = kube.kubectl("get", "ij", "-n", ns).stdout.splitlines()
        assert table[0].split() == ["NAME", "PHASE", "ROLLOUTS", "STEPS", "RETURN", "AGE"]
        assert table[1].split()[:5] == ["cartpole", "Running", f"{n}/{n}", "12500", "125"]
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
