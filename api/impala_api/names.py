"""Names and labels of an ImpalaJob's children: the one place that spells them.

The builders, the runtime (status, autoscaling, lifecycle) and the tests all derive child names,
label sets and selectors from here, so they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from impala_api.spec import API_GROUP

CONDITION_TYPES = (
    "Created",
    "Running",
    "Restarting",
    "Suspended",
    "Succeeded",
    "Failed",
    "Admitted",
    "ReturnRegressed",
)
"""Every condition type the lifecycle sets (the CRD documents exactly these); `Admitted` only
on a job labelled `kueue.x-k8s.io/queue-name`."""

Component = Literal[
    "config", "learner", "learner-peer", "rollout", "aggregator", "status", "network", "auth"
]
"""`learner-peer`: the learner pods of ranks 1..N-1 (`spec.learner.replicas`); `learner` is rank
0 alone, which the learner Service and the status sidecar's Service select."""

APP_NAME = "impalajob"
PART_OF = "impalajob"
MANAGED_BY = "impala-operator"

# Label keys the operator owns; a job's own labels never override them (they select children).
NAME = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
PART_OF_KEY = "app.kubernetes.io/part-of"
MANAGED_BY_KEY = "app.kubernetes.io/managed-by"
RESTART_KEY = f"{API_GROUP}/restart"
"""On the learner pod: which learner attempt it is (0 = first run)."""
RANK_KEY = f"{API_GROUP}/learner-rank"
"""On each learner pod: its rank among `spec.learner.replicas` (0: the Ray head, the driver and
the status sidecar; 1..N-1: a learner that joins the head's Ray cluster)."""
CONFIG_HASH_KEY = f"{API_GROUP}/config-hash"
"""Annotation on the learner pod: hash of the job.yaml it was started with."""

STATUS_ACCESS_LABEL = f"{API_GROUP}/status-access"
"""Pods labelled `impala.dev/status-access: "true"` (in the job's namespace, and the operator's
own) may reach a job's status port through its NetworkPolicy."""
STATUS_TOKEN_KEY = "status-token"
"""Key of the job's auth Secret (`<job>-auth`) holding the sidecar's bearer token."""
RAY_TOKEN_KEY = "ray-token"
"""Key of the job's auth Secret holding the Ray cluster's RAY_AUTH_TOKEN."""
STATUS_URL_ANNOTATION = f"{API_GROUP}/status-url"
"""ImpalaJob annotation overriding where the operator reads the job's sidecar `/status`.

By default the operator reads `http://<job>-status.<namespace>.svc:8080/status`; the annotation
lets a test (or an operator running outside the cluster) point it at any reachable sidecar."""

JOB_ONLY_LABEL_PREFIXES = ("kueue.x-k8s.io/", "scheduling.x-k8s.io/")
"""Labels that admit the job as one workload (Kueue's queue-name, priority-class, ...; the
scheduler-plugins' pod-group): copied onto the pods and Deployments, they would make Kueue queue
every child as a workload of its own, so they stay on the ImpalaJob."""

MAX_NAME = 63
"""DNS-1123/1035 label limit: Service names and label values must fit in it."""


def child_name(job_name: str, component: Component) -> str:
    """`<job>-<component>`; with job names of at most 40 characters this is at most 51."""
    name = f"{job_name}-{component}"
    if len(name) > MAX_NAME:  # the spec caps job names at 40, so only a hand-built job gets here
        raise ValueError(f"child name {name!r} is longer than {MAX_NAME} characters")
    return name


def learner_pod_name(job_name: str, restart_count: int, rank: int = 0) -> str:
    """`<job>-learner-<attempt>` (rank 0) and `<job>-learner-<attempt>-<rank>`: a restarted
    learner gets a new name, so the operator can create it while the failed pod (kept for its
    logs) is still being deleted; within an attempt, each rank's name is fixed."""
    suffix = f"-{rank}" if rank else ""
    name = f"{child_name(job_name, 'learner')}-{restart_count}{suffix}"
    if len(name) > MAX_NAME:
        raise ValueError(f"learner pod name {name!r} is longer than {MAX_NAME} characters")
    return name


def learner_host(job_name: str, namespace: str) -> str:
    """DNS name of the learner's headless Service (Ray GCS), resolvable from any pod."""
    return f"{child_name(job_name, 'learner')}.{namespace}.svc"


def status_url(job_name: str, namespace: str, port: int) -> str:
    """Base URL of the status sidecar via its Service (`status.statusURL` adds /status)."""
    return f"http://{child_name(job_name, 'status')}.{namespace}.svc:{port}"


def selector_labels(job_name: str, component: Component | None = None) -> dict[str, str]:
    """Labels that select a job's pods (all of them, or one component's). Immutable on a
    Deployment, so nothing that can change over the job's life goes in here."""
    labels = {NAME: APP_NAME, INSTANCE: job_name}
    if component is not None:
        labels[COMPONENT] = component
    return labels


def label_selector(labels: Mapping[str, str]) -> str:
    """Equality labels as a `labelSelector`'s `k=v,k=v` text, keys sorted."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def selector_string(job_name: str, component: Component) -> str:
    """The same selector as `k=v,k=v` text: `status.rollouts.selector` for the scale subresource."""
    return label_selector(selector_labels(job_name, component))


def child_labels(
    job_name: str, component: Component, job_labels: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Every child's labels: the job's own labels (less the JOB_ONLY ones), then the operator's
    (which win on conflict)."""
    labels = {
        k: v for k, v in (job_labels or {}).items() if not k.startswith(JOB_ONLY_LABEL_PREFIXES)
    }
    labels.update(selector_labels(job_name, component))
    labels[PART_OF_KEY] = PART_OF
    labels[MANAGED_BY_KEY] = MANAGED_BY
    return labels
