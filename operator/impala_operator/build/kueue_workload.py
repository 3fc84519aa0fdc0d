"""The Kueue Workload of a job labelled `kueue.x-k8s.io/queue-name`, built purely.

The operator plays the part Kueue's jobframework plays for its built-in integrations, as an
external framework (`integrations.externalFrameworks: ["ImpalaJob.v1alpha1.impala.dev"]`): one
Workload per job, owned by it, whose pod sets are the learner (1 pod), the rollouts (maxReplicas,
with minCount minReplicas: Kueue's partial admission grants what the quota allows) and the
aggregators. Pod sets are immutable: a job whose pods changed gets a new Workload (`stale`).
What Kueue decides about it is read in `lifecycle.admission`.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from impala_api import names
from impala_api.spec import API_GROUP, API_VERSION, KIND, ImpalaJob
from impala_operator.build import children
from impala_operator.build.children import Manifest
from impala_operator.scale import autoscaler

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
"""A WorkloadPriorityClass for the job (else the learner pod's priorityClassName, if any)."""
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
GROUP = "kueue.x-k8s.io"
WORKLOAD_API_VERSION = f"{GROUP}/v1beta2"
FRAMEWORK = f"{KIND}.{API_VERSION}.{API_GROUP}"
"""The entry of Kueue's `integrations.externalFrameworks` that names this operator's jobs."""
POD_SETS_HASH_ANNOTATION = f"{API_GROUP}/pod-sets-hash"
LEARNER, ROLLOUT, AGGREGATOR = "learner", "rollout", "aggregator"


def queue_name(job: ImpalaJob) -> str | None:
    """The LocalQueue the job asks for, or None: a job without the label is not Kueue's."""
    return job.metadata.labels.get(QUEUE_LABEL) or None


def workload_name(job_name: str) -> str:
    """`impalajob-<job>`, as jobframework prefixes a Workload with its owner's kind."""
    return f"{KIND.lower()}-{job_name}"


@dataclass(frozen=True)
class Priority:
    """The priority class a Workload names and its value (looked up by the runtime)."""

    name: str
    value: int
    kind: Literal["WorkloadPriorityClass", "PriorityClass"] = "WorkloadPriorityClass"

    def ref(self) -> dict[str, str]:
        group = GROUP if self.kind == "WorkloadPriorityClass" else "scheduling.k8s.io"
        return {"group": group, "kind": self.kind, "name": self.name}


def priority_class(
    job: ImpalaJob,
) -> tuple[str, Literal["WorkloadPriorityClass", "PriorityClass"]] | None:
    """Which priority class to look up: the job's `kueue.x-k8s.io/priority-class` label (a
    WorkloadPriorityClass), else the learner pod's priorityClassName (a PriorityClass)."""
    label = job.metadata.labels.get(PRIORITY_LABEL)
    if label:
        return label, "WorkloadPriorityClass"
    pod_class = job.spec.learner.pod.priority_class_name
    return (pod_class, "PriorityClass") if pod_class else None


def _template(spec: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    """A pod set's template: the pods' spec and labels (a Workload allows no other metadata)."""
    return {"metadata": {"labels": dict(labels)}, "spec": copy.deepcopy(dict(spec))}


def max_aggregators(job: ImpalaJob, workers_per_aggregator: int) -> int:
    """Aggregators the job runs at its rollouts' maximum: what their pod set asks for."""
    return autoscaler.aggregator_replicas(
        job.spec.aggregators,
        rollout_replicas=job.spec.rollouts.max_replicas,
        workers_per_pod=job.spec.rollouts.workers_per_pod,
        workers_per_aggregator=workers_per_aggregator,
    )


def pod_sets(job: ImpalaJob, uid: str, *, workers_per_aggregator: int) -> list[dict[str, Any]]:
    """The Workload's pod sets: the learners (spec.learner.replicas), the rollouts (partially
    admissible down to their minimum), the aggregators (when the job runs any)."""
    # Rank 0's template for every learner: the others are the same but for the sidecar, which
    # asks little; one pod set admits them together (a group cannot train on some of them).
    learner = children.build_learner_pod(job, uid)
    sets: list[dict[str, Any]] = [
        {
            "name": LEARNER,
            "count": job.spec.learner.replicas,
            "template": _template(learner["spec"], learner["metadata"]["labels"]),
        }
    ]
    rollouts = job.spec.rollouts
    deployment = children.build_node_deployment(job, uid, "rollout", rollouts.max_replicas)
    template = deployment["spec"]["template"]
    rollout_set: dict[str, Any] = {
        "name": ROLLOUT,
        "count": rollouts.max_replicas,
        "template": _template(template["spec"], template["metadata"]["labels"]),
    }
    minimum = max(1, rollouts.min_replicas)
    if rollouts.max_replicas > minimum:
        rollout_set["minCount"] = minimum  # Kueue's partial admission: one pod set may shrink
    sets.append(rollout_set)
    aggregators = max_aggregators(job, workers_per_aggregator)
    if aggregators > 0:
        deployment = children.build_node_deployment(job, uid, "aggregator", aggregators)
        template = deployment["spec"]["template"]
        sets.append(
            {
                "name": AGGREGATOR,
                "count": aggregators,
                "template": _template(template["spec"], template["metadata"]["labels"]),
            }
        )
    return sets


def pod_sets_hash(sets: Sequence[Mapping[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(list(sets), sort_keys=True).encode()).hexdigest()[:16]


def build_workload(
    job: ImpalaJob, uid: str, priority: Priority | None, *, workers_per_aggregator: int
) -> Manifest:
    """The Workload of a queued job, owned by it (garbage-collected with it)."""
    sets = pod_sets(job, uid, workers_per_aggregator=workers_per_aggregator)
    labels = {**names.selector_labels(job.name, "learner"), JOB_UID_LABEL: uid}
    labels.pop(names.COMPONENT, None)
    spec: dict[str, Any] = {"queueName": queue_name(job), "podSets": sets}
    if priority is not None:
        spec["priorityClassRef"] = priority.ref()
        spec["priority"] = priority.value
    return {
        "apiVersion": WORKLOAD_API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job.name),
            "namespace": job.metadata.namespace,
            "labels": labels,
            "annotations": {POD_SETS_HASH_ANNOTATION: pod_sets_hash(sets)},
            "ownerReferences": [children.owner_reference(job, uid)],
        },
        "spec": spec,
    }


def stale(
    workload: Mapping[str, Any], job: ImpalaJob, uid: str, *, workers_per_aggregator: int
) -> bool:
    """The job's pod sets changed since its Workload was made (pod sets are immutable)."""
    recorded = ((workload.get("metadata") or {}).get("annotations") or {}).get(
        POD_SETS_HASH_ANNOTATION
    )
    wanted = pod_sets_hash(pod_sets(job, uid, workers_per_aggregator=workers_per_aggregator))
    return recorded != wanted
