"""The harness itself: the control plane behaves like a real cluster where the operator needs it.

Each test names the Kubernetes behaviour that later operator tests rely on: controllers run,
garbage collection follows ownerReferences, RBAC is enforced, Helm works, kwok fakes pods.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import EXIT_CODE_ANNOTATION, CommandError, Kube, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHART = Path(__file__).resolve().parent / "testdata" / "chart"
# kwok never pulls it; on an existing cluster it must be pullable (override for air-gapped ones).
IMAGE = os.environ.get("IMPALA_E2E_IMAGE", "busybox:1.36")


def _deployment(name: str, replicas: int, gpus: int = 0) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": IMAGE,
                            "command": ["sleep", "3600"],
                            "resources": resources,
                        }
                    ]
                },
            },
        },
    }


def _running_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    ready = any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
    )
    return status.get("phase") == "Running" and ready and "deletionTimestamp" not in pod["metadata"]


def _wait_running(kube: Kube, ns: str, selector: str, count: int) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        pods = [p for p in kube.pods(ns, selector) if _running_ready(p)]
        return pods if len(pods) == count else None

    return wait_for(check, timeout=120, what=f"{count} Running pods {selector} in {ns}")


def test_version_reports_built_release(kube: Kube) -> None:
    version = json.loads(kube.kubectl("get", "--raw", "/version").stdout)
    assert re.fullmatch(r"v1\.\d+\.\d+", version["gitVersion"]), version
    assert version["gitVersion"] == kube.version
    assert version["major"] == "1" and version["minor"] == version["gitVersion"].split(".")[1]
    if kube.is_local:
        assert kube.bin_dir is not None
        versions = (kube.bin_dir.parent / "versions.env").read_text()
        assert f"K8S_VERSION={version['gitVersion']}\n" in versions
        client = json.loads(kube.kubectl("version", "--client", "-o", "json").stdout)
        assert client["clientVersion"]["gitVersion"] == version["gitVersion"]


def test_deployment_pods_become_running(kube: Kube, namespace: str) -> None:
    kube.apply(_deployment("web", 3), "-n", namespace)
    pods = _wait_running(kube, namespace, "app=web", 3)
    # Scheduled by kube-scheduler onto (fake) nodes, with pod IPs, like on a real cluster.
    assert all(p["spec"].get("nodeName") for p in pods)
    assert all(p["status"].get("podIP") for p in pods)
    kube.kubectl(
        "wait", "deployment/web", "-n", namespace, "--for=condition=Available", "--timeout=60s"
    )


def test_deleting_owner_garbage_collects_children(kube: Kube, namespace: str) -> None:
    kube.apply(_deployment("gc", 2), "-n", namespace)
    _wait_running(kube, namespace, "app=gc", 2)
    assert kube.get("replicasets", "-n", namespace, "-l", "app=gc")["items"]

    # Background cascading deletion: the API removes the Deployment at once and the garbage
    # collector, not the client, deletes the ReplicaSet and then its Pods via ownerReferences.
    kube.kubectl("delete", "deployment", "gc", "-n", namespace, "--cascade=background")

    def gone() -> bool:
        rs = kube.get("replicasets", "-n", namespace, "-l", "app=gc")["items"]
        return not rs and not kube.pods(namespace, "app=gc")

    wait_for(gone, timeout=120, what="ReplicaSet and Pods garbage-collected")


def test_rbac_is_enforced_for_service_accounts(kube: Kube, namespace: str) -> None:
    kube.kubectl("create", "serviceaccount", "limited", "-n", namespace)
    kube.kubectl(
        "create", "role", "pod-reader", "-n", namespace, "--verb=get,list,watch", "--resource=pods"
    )
    kube.kubectl(
        "create",
        "rolebinding",
        "limited-pod-reader",
        "-n",
        namespace,
        "--role=pod-reader",
        f"--serviceaccount={namespace}:limited",
    )
    env = kube.env_for(kube.sa_kubeconfig(namespace, "limited"))

    whoami = json.loads(kube.kubectl("auth", "whoami", "-o", "json", env=env).stdout)
    assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:limited"

    kube.kubectl("get", "pods", "-n", namespace, env=env)  # allowed by the Role
    with pytest.raises(CommandError, match=r"(?i)forbidden"):
        kube.kubectl("get", "pods", "--all-namespaces", env=env)
    with pytest.raises(CommandError, match=r"(?i)forbidden"):
        kube.kubectl("get", "pods", "-n", "kube-system", env=env)
    with pytest.raises(CommandError, match=r"(?i)forbidden"):
        kube.kubectl("create", "configmap", "nope", "-n", namespace, env=env)
    can = kube.kubectl("auth", "can-i", "list", "nodes", env=env, check=False)
    assert can.stdout.strip() == "no"


def test_helm_lint_template_and_install(kube: Kube, namespace: str) -> None:
    kube.helm("lint", str(CHART), "--strict")

    rendered = kube.helm("template", "demo", str(CHART), "--set", "replicas=1").stdout
    assert "kind: Deployment" in rendered and "kind: ConfigMap" in rendered
    with pytest.raises(CommandError, match="additional properties"):
        kube.helm("template", "demo", str(CHART), "--set", "bogus=1")

    kube.helm(
        "install",
        "demo",
        str(CHART),
        "-n",
        namespace,
        "--set",
        "replicas=2",
        "--wait",
        "--timeout",
        "120s",
    )
    cm = kube.get("configmap", "demo-e2e-demo", "-n", namespace)
    assert cm["data"]["greeting"] == "hello"
    _wait_running(kube, namespace, "app.kubernetes.io/instance=demo", 2)
    kube.helm("uninstall", "demo", "-n", namespace, "--wait")


@pytest.mark.usefixtures("kwok_only")
def test_kwok_pods_end_on_request(kube: Kube, namespace: str) -> None:
    for name in ("ok", "crash"):
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": "end"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": IMAGE}],
                },
            },
            "-n",
            namespace,
        )
    _wait_running(kube, namespace, "app=end", 2)

    kube.end_pod(namespace, "ok", exit_code=0)
    kube.end_pod(namespace, "crash", exit_code=137, reason="OOMKilled")

    def phase(name: str, want: str) -> dict[str, Any] | None:
        pod: dict[str, Any] = kube.get("pod", name, "-n", namespace)
        return pod if pod["status"].get("phase") == want else None

    ok = wait_for(lambda: phase("ok", "Succeeded"), timeout=60, what="pod ok Succeeded")
    crash = wait_for(lambda: phase("crash", "Failed"), timeout=60, what="pod crash Failed")
    assert ok["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    term = crash["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 137 and term["reason"] == "OOMKilled"
    assert crash["metadata"]["annotations"][EXIT_CODE_ANNOTATION] == "137"


@pytest.mark.usefixtures("kwok_only")
def test_gpu_pods_schedule_on_fake_nodes(kube: Kube, namespace: str) -> None:
    kube.apply(_deployment("learner", 2, gpus=4), "-n", namespace)
    pods = _wait_running(kube, namespace, "app=learner", 2)
    nodes = {p["spec"]["nodeName"] for p in pods}
    for node in nodes:
        alloc = kube.get("node", node)["status"]["allocatable"]
        assert int(alloc["nvidia.com/gpu"]) >= 4
