"""The product as users run it, on a real node: nothing on this path is faked.

`helm install` puts the operator in a pod (the chart's ServiceAccount, no admin kubeconfig), the
CartPole example is `kubectl apply`d with a checkpoint claim, and the learner pod (Ray head,
driver, learner thread, status sidecar) and the rollout pods (joining through the learner
Service's DNS name) train it in real containers: containerd + runc, the kubelet, CNI, kube-proxy
and CoreDNS (tests/cluster/node.py), from the image `hack/build-image.sh` builds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster import Kube, wait_for
from cluster.node import NODE_NAME

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "impala-operator"
EXAMPLES = ROOT / "manifests" / "examples"
OPERATOR_NS = "impala-system"
RUN_AS = 1000


def log(msg: str) -> None:
    """Progress on the test log (pytest -s, or the captured output of a failure)."""
    print(f"[real-node {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def diagnose(kube: Kube, namespace: str) -> str:
    """Pods, events and the learner's logs: what a failure message needs."""
    parts = []
    for args in (
        ("get", "pods", "-n", namespace, "-o", "wide"),
        ("get", "ij", "-n", namespace, "-o", "yaml"),
        ("get", "events", "-n", namespace, "--sort-by=.lastTimestamp"),
        ("logs", "-n", OPERATOR_NS, "deployment/impala-impala-operator", "--tail=40"),
    ):
        proc = kube.kubectl(*args, check=False)
        parts.append(f"$ kubectl {' '.join(args)}\n{proc.stdout}{proc.stderr}")
    for pod in kube.pods(namespace):
        for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
            proc = kube.kubectl(
                "logs",
                "-n",
                namespace,
                pod["metadata"]["name"],
                "-c",
                c["name"],
                "--tail=30",
                check=False,
            )
            parts.append(f"--- {pod['metadata']['name']}/{c['name']}\n{proc.stdout}{proc.stderr}")
    return "\n".join(parts)


@pytest.fixture(scope="module")
def operator(real_kube: Kube) -> Iterator[None]:
    """The chart installed into `impala-system`, its operator pod Running on the real node."""
    real_kube.helm(
        "install", "impala", str(CHART), "-n", OPERATOR_NS, "--create-namespace",
        "--set", "reconcileInterval=2", "--wait", "--timeout", "5m", timeout=360,
    )  # fmt: skip
    pods = real_kube.pods(OPERATOR_NS)
    assert [p["spec"]["nodeName"] for p in pods] == [NODE_NAME]
    log(f"operator pod {pods[0]['metadata']['name']} Running on {NODE_NAME}")
    yield
    real_kube.helm("uninstall", "impala", "-n", OPERATOR_NS, "--wait", check=False)


def checkpoint_claim(kube: Kube, namespace: str, name: str, size: str = "1Gi") -> Path:
    """A PersistentVolumeClaim bound to a static hostPath PersistentVolume on the real node.

    hostPath volumes ignore fsGroup, so the directory is made the pods' user's here, as an
    administrator would for a static volume."""
    path = kube.workdir / "volumes" / f"{namespace}-{name}"
    path.mkdir(parents=True)
    os.chown(path, RUN_AS, RUN_AS)
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{namespace}-{name}"},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "claimRef": {"namespace": namespace, "name": name},
                "hostPath": {"path": str(path), "type": "Directory"},
            },
        }
    )
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": f"{namespace}-{name}",
                "resources": {"requests": {"storage": size}},
            },
        }
    )
    return path


def example(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """An example manifest as a user would apply it, plus `spec` overrides (deep-merged)."""
    manifest: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    manifest["metadata"]["namespace"] = namespace

    def merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
        for k, v in extra.items():
            if isinstance(v, dict) and isinstance(into.get(k), dict):
                merge(into[k], v)
            else:
                into[k] = v

    merge(manifest["spec"], spec)
    return manifest


def job_status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return dict(kube.get("ij", name, "-n", namespace).get("status") or {})


def impalajob_status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    """`impalajob status NAME -n NS --json` from outside the cluster (through the API server)."""
    proc = subprocess.run(
        [sys.executable, "-m", "impala_trainer.cli", "status", name, "-n", namespace, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=kube.env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_cartpole_trains_in_real_pods(real_kube: Kube, operator: None) -> None:
    kube = real_kube
    with kube.namespace("cartpole") as ns:
        checkpoints = checkpoint_claim(kube, ns, "cartpole-checkpoints")
        t0 = time.monotonic()
        kube.apply(example("cartpole", ns, checkpoint={"volumeClaim": "cartpole-checkpoints"}))
        log(f"applied manifests/examples/cartpole.yaml in {ns}")
        try:
            seen: list[int] = []
            live: dict[str, Any] = {}

            def finished() -> dict[str, Any] | None:
                st = job_status(kube, ns, "cartpole")
                steps = int((st.get("progress") or {}).get("timesteps") or 0)
                if steps and (not seen or steps != seen[-1]):
                    seen.append(steps)
                    table = kube.kubectl("get", "ij", "-n", ns).stdout.strip().splitlines()[-1]
                    log(f"kubectl get ij: {table}")
                if steps and not live and st.get("phase") == "Running":
                    live.update(impalajob_status(kube, ns, "cartpole"))
                    log(f"impalajob status cartpole (mid-run): {live['counters']}")
                if st.get("phase") in ("Succeeded", "Failed"):
                    return st
                return None

            st = wait_for(finished, timeout=900, interval=3, what="cartpole to finish")
        except BaseException:
            print(diagnose(kube, ns))
            raise
        elapsed = time.monotonic() - t0
        pods = kube.pods(ns)
        for p in pods:
            log(f"pod {p['metadata']['name']} on node {p['spec'].get('nodeName')}: "
                f"{p['status']['phase']}")  # fmt: skip
        progress = st.get("progress") or {}
        ret, steps = progress.get("episodeReturnMean"), progress.get("timesteps")
        log(f"phase {st['phase']} after {elapsed:.0f} s; final return {ret} at {steps} steps")
        assert st["phase"] == "Succeeded", diagnose(kube, ns)
        assert float(progress["episodeReturnMean"]) >= 450
        # Progress was watched rising through the API server, and read live mid-run.
        assert len(seen) >= 2 and seen == sorted(seen), seen
        assert live, "impalajob status never answered mid-run"
        assert {p["spec"]["nodeName"] for p in pods} == {NODE_NAME}
        # The final checkpoint is on the claim, written by the pod's user.
        assert any(checkpoints.rglob("*")), "no checkpoint on the claim"
