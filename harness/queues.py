"""Kueue objects and quotas for the queueing tests (tests/e2e/test_kueue.py on kwok nodes, the
real node's preemption test) and bench/operator_queue.py: queues whose quota is computed from a
job's own pod sets, so a change to the pods' requests cannot make a test pass by accident."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from impala_api.manifest import parse_manifest
from impala_operator.build import kueue_workload
from impala_operator.lifecycle import admission

KUEUE_API = "kueue.x-k8s.io/v1beta2"


def _cpu_millis(value: str) -> int:
    return int(value[:-1]) if value.endswith("m") else int(float(value) * 1000)


def _mebibytes(value: str) -> int:
    for suffix, factor in (("Ki", 1 / 1024), ("Mi", 1), ("Gi", 1024)):
        if value.endswith(suffix):
            return int(float(value[: -len(suffix)]) * factor)
    return int(value) // 2**20


def quota_for(
    manifest: Mapping[str, Any], rollouts: int | None = None, jobs: int = 1
) -> dict[str, str]:
    """CPU and memory of `jobs` such jobs' pods: each one's learner, `rollouts` rollout pods
    (default: its maximum) and its aggregators, as Kueue counts them (every container's
    requests, native sidecars included)."""
    meta = {**manifest["metadata"], "namespace": manifest["metadata"].get("namespace") or "q"}
    job = parse_manifest({**manifest, "metadata": meta}, source="test")
    cpu = mem = 0
    for pod_set in kueue_workload.pod_sets(job, "uid", workers_per_aggregator=4):
        count = pod_set["count"] if pod_set["name"] != "rollout" or rollouts is None else rollouts
        spec = pod_set["template"]["spec"]
        for c in [*spec.get("containers", []), *spec.get("initContainers", [])]:
            requests = (c.get("resources") or {}).get("requests") or {}
            cpu += count * _cpu_millis(str(requests.get("cpu", "0")))
            mem += count * _mebibytes(str(requests.get("memory", "0")))
    return {"cpu": f"{cpu * jobs}m", "memory": f"{mem * jobs}Mi"}


def queued(manifest: dict[str, Any], queue: str, priority: str | None = None) -> dict[str, Any]:
    """`manifest` labelled for LocalQueue `queue` (and a WorkloadPriorityClass)."""
    labels = manifest["metadata"].setdefault("labels", {})
    labels[kueue_workload.QUEUE_LABEL] = queue
    if priority:
        labels[kueue_workload.PRIORITY_LABEL] = priority
    return manifest


def resource_flavor(name: str, node_labels: Mapping[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": dict(node_labels), **spec},
    }


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
        "description": "test",
    }


def cluster_queue(name: str, flavor: str, quota: Mapping[str, str], **spec: Any) -> dict[str, Any]:
    """A ClusterQueue with one flavor's nominal quota for `quota`'s resources."""
    resources = sorted(quota)
    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": resources,
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [{"name": r, "nominalQuota": quota[r]} for r in resources],
                        }
                    ],
                }
            ],
            **spec,
        },
    }


def local_queue(name: str, namespace: str, cluster_queue_name: str) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def condition(status: Mapping[str, Any], type_: str) -> dict[str, Any]:
    return next((dict(c) for c in status.get("conditions") or [] if c["type"] == type_), {})


def admitted(status: Mapping[str, Any]) -> bool:
    """The job's Admitted condition is True."""
    return condition(status, admission.ADMITTED_CONDITION).get("status") == "True"
