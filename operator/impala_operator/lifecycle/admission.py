"""Kueue admission, planned purely: a job labelled `kueue.x-k8s.io/queue-name` runs only while
Kueue admits the Workload the operator owns for it (built in `build.kueue_workload`).

Until Kueue admits it the job is held (no pods, `Admitted=False` naming the queue); admitted,
its pods get the assigned flavors' node labels and tolerations and the rollouts autoscale up to
the admitted count; evicted (preempted, deactivated, queue stopped), it stops like a suspend (the
learner checkpoints on SIGTERM, no failure counted) and, once its pods are gone, hands the quota
back by clearing the admission, as jobframework does; readmitted, the same learner attempt
resumes from its checkpoint. A job that ends marks its Workload Finished. A job that asks for
more than its ClusterQueue could ever give (Kueue: "> maximum capacity", borrowing included)
fails at once, naming the fields to lower, instead of waiting in the queue forever.

Nothing here calls the API: `runtime.handlers` reads the Workload and the ResourceFlavors and
executes what this module and `plan` decide.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from impala_operator.lifecycle.conditions import set_condition

ADMITTED_CONDITION = "Admitted"

State = Literal["queued", "admitted", "evicted", "finished", "inadmissible"]

NEVER_FITS = "> maximum capacity"
"""Kueue's words (its flavor assigner) for a pod set's request above all the quota the
ClusterQueue could ever have, what it may borrow from its cohort included."""
WAITING_HELPS = "insufficient unused quota"
"""Kueue's words for a flavor where waiting (or preempting) frees enough quota."""
POD_SET_FIELDS = {
    "learner": "spec.learner.replicas or spec.learner.resources",
    "rollout": "spec.rollouts.minReplicas or spec.rollouts.resources",
    "aggregator": "spec.aggregators.replicas or spec.aggregators.resources",
}
"""What sizes each pod set of the Workload (build.kueue_workload)."""


@dataclass(frozen=True)
class Placement:
    """What admission adds to a pod set's pods: the flavors' node labels and tolerations, and
    an admission check's pod set update."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in (
            ("nodeSelector", dict(self.node_selector)),
            ("tolerations", [dict(t) for t in self.tolerations]),
            ("labels", dict(self.labels)),
            ("annotations", dict(self.annotations)),
        ):
            if value:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Placement:
        return cls(
            node_selector=dict(data.get("nodeSelector") or {}),
            tolerations=tuple(dict(t) for t in data.get("tolerations") or []),
            labels=dict(data.get("labels") or {}),
            annotations=dict(data.get("annotations") or {}),
        )


@dataclass(frozen=True)
class Admission:
    """Kueue's decision about a job, read from its Workload."""

    state: State
    queue: str
    cluster_queue: str = ""
    reason: str = ""
    message: str = ""
    counts: Mapping[str, int] = field(default_factory=dict)
    """Admitted pods per pod set."""
    placement: Mapping[str, Placement] = field(default_factory=dict)
    reserved: bool = False
    """The Workload still holds quota (an evicted one does until the operator releases it)."""

    @property
    def runs(self) -> bool:
        return self.state == "admitted"

    @property
    def never_runs(self) -> bool:
        """Kueue can never admit it (over the ClusterQueue's maximum capacity): the job fails."""
        return self.state == "inadmissible"

    def cap(self, pod_set: str) -> int | None:
        """The most pods the pod set may run (None: not admitted or not in the Workload)."""
        return self.counts.get(pod_set) if self.runs else None

    def to_status(self) -> dict[str, Any] | None:
        """`status.admission` of the job: where Kueue put it, so every handler builds its pods
        alike (None while not admitted)."""
        if not self.runs:
            return None
        return {
            "clusterQueue": self.cluster_queue,
            "podSets": [
                {"name": name, "count": count, **self.placement.get(name, Placement()).as_dict()}
                for name, count in sorted(self.counts.items())
            ],
        }

    @classmethod
    def from_status(cls, queue: str, status: Mapping[str, Any] | None) -> Admission | None:
        """The admission a job's status recorded (None if it records none)."""
        if not status:
            return None
        sets = status.get("podSets") or []
        cluster_queue = str(status.get("clusterQueue", ""))
        return cls(
            state="admitted",
            queue=queue,
            cluster_queue=cluster_queue,
            reason="Admitted",
            message=_admitted_message(cluster_queue, queue),
            counts={s["name"]: int(s.get("count", 0)) for s in sets},
            placement={s["name"]: Placement.from_dict(s) for s in sets},
            reserved=True,
        )


def _admitted_message(cluster_queue: str, queue: str) -> str:
    return f"admitted by ClusterQueue {cluster_queue} (LocalQueue {queue})"


def _condition(workload: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), None)


def _true(workload: Mapping[str, Any], type_: str) -> bool:
    cond = _condition(workload, type_)
    return cond is not None and cond.get("status") == "True"


def flavor_names(workload: Mapping[str, Any]) -> set[str]:
    """ResourceFlavors the Workload's admission assigned (the runtime reads each once)."""
    admission = (workload.get("status") or {}).get("admission") or {}
    return {
        str(flavor)
        for assignment in admission.get("podSetAssignments") or []
        for flavor in (assignment.get("flavors") or {}).values()
    }


def _placement(
    assignment: Mapping[str, Any],
    flavors: Mapping[str, Mapping[str, Any]],
    updates: Sequence[Mapping[str, Any]],
) -> Placement:
    """Node labels and tolerations of the assigned flavors, plus the admission checks' updates
    of this pod set (what jobframework's podset.FromAssignment + FromUpdate merge)."""
    selector: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    for flavor_name in sorted(set((assignment.get("flavors") or {}).values())):
        spec = (flavors.get(flavor_name) or {}).get("spec") or {}
        selector.update(spec.get("nodeLabels") or {})
        tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for update in updates:
        if update.get("name") != assignment.get("name"):
            continue
        selector.update(update.get("nodeSelector") or {})
        tolerations += [t for t in update.get("tolerations") or [] if t not in tolerations]
        labels.update(update.get("labels") or {})
        annotations.update(update.get("annotations") or {})
    return Placement(selector, tuple(tolerations), labels, annotations)


def _admitted(
    workload: Mapping[str, Any], queue: str, flavors: Mapping[str, Mapping[str, Any]]
) -> Admission:
    status = workload.get("status") or {}
    admission = status.get("admission") or {}
    updates = [
        u for check in status.get("admissionChecks") or [] for u in check.get("podSetUpdates") or []
    ]
    counts: dict[str, int] = {}
    placement: dict[str, Placement] = {}
    spec_counts = {
        s["name"]: s.get("count", 1) for s in (workload.get("spec") or {}).get("podSets") or []
    }
    for assignment in admission.get("podSetAssignments") or []:
        name = assignment["name"]
        counts[name] = int(assignment.get("count", spec_counts.get(name, 1)))
        placement[name] = _placement(assignment, flavors, updates)
    cluster_queue = str(admission.get("clusterQueue", ""))
    return Admission(
        "admitted",
        queue,
        cluster_queue,
        "Admitted",
        _admitted_message(cluster_queue, queue),
        counts,
        placement,
        reserved=True,
    )


def read(
    workload: Mapping[str, Any] | None,
    queue: str,
    flavors: Mapping[str, Mapping[str, Any]] | None = None,
) -> Admission:
    """What the job may do by its Workload (None: not created yet, so queued)."""
    if workload is None:
        return Admission(
            "queued",
            queue,
            reason="Queued",
            message=f"queued in LocalQueue {queue}: creating its Workload",
        )
    reserved = _true(workload, "QuotaReserved")
    if _true(workload, "Finished"):
        message = "its Workload is Finished: the quota it held is released"
        return Admission("finished", queue, reason="Finished", message=message)
    evicted = _condition(workload, "Evicted")
    if evicted is not None and evicted.get("status") == "True":
        why = str(evicted.get("reason", "Evicted"))
        text = str(evicted.get("message", "")).strip()
        message = (
            f"evicted by Kueue ({why}){': ' + text if text else ''}; requeued in LocalQueue "
            f"{queue}, the checkpoint is kept"
        )
        return Admission(
            "evicted",
            queue,
            reason=f"Evicted{why}" if why != "Evicted" else why,
            message=message,
            reserved=reserved,
        )
    if _true(workload, "Admitted") and (workload.get("status") or {}).get("admission"):
        return _admitted(workload, queue, flavors or {})
    pending = _condition(workload, "QuotaReserved")
    detail = str(pending.get("message", "")).strip() if pending else ""
    if reserved:
        detail = "quota reserved; waiting for its admission checks"
    elif sets := never_fits(detail):
        lower = "; ".join(f"lower {POD_SET_FIELDS.get(s, f'pod set {s}')}" for s in sets)
        message = (
            f"the ClusterQueue of LocalQueue {queue} can never admit it: {detail}. To run it, "
            f"{lower}, or raise the ClusterQueue's quota, and create the job again"
        )
        return Admission("inadmissible", queue, reason="ExceedsQuota", message=message)
    message = (
        f"waiting for Kueue to admit it in LocalQueue {queue}{': ' + detail if detail else ''}"
    )
    return Admission("queued", queue, reason="Queued", message=message, reserved=reserved)


def never_fits(message: str) -> list[str]:
    """The pod sets of a pending Workload's message that no quota of the ClusterQueue could ever
    hold: Kueue writes a clause `couldn't assign flavors to pod set NAME: REASONS` per pod set
    that does not fit, REASONS over every flavor; it never fits when one is over the maximum
    capacity and none would fit by waiting (the others: taints, affinity, also lasting)."""
    prefix = "couldn't assign flavors to pod set "
    sets = []
    for clause in message.split("; "):
        head, sep, reasons = clause.partition(": ")
        never = NEVER_FITS in reasons and WAITING_HELPS not in reasons
        if sep and head.startswith(prefix) and never:
            sets.append(head.removeprefix(prefix))
    return sets


def released(workload: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The Workload with its quota handed back after an eviction, once the job's pods are gone:
    what jobframework writes (admission cleared, QuotaReserved and Admitted False, Requeued
    True for a preemption or a node failure), to be written back as a status update."""
    body = copy.deepcopy(dict(workload))
    status = body.setdefault("status", {})
    generation = (body.get("metadata") or {}).get("generation")
    evicted = _condition(workload, "Evicted") or {}
    reason, message = str(evicted.get("reason", "")), str(evicted.get("message", ""))
    conditions = status.get("conditions") or []
    requeue = reason in ("Preempted", "NodeFailures")
    conditions = set_condition(
        conditions, "Requeued", requeue, reason or "Evicted", message, now, generation
    )
    conditions = set_condition(
        conditions, "QuotaReserved", False, "Pending", message, now, generation
    )
    if any(c.get("type") == "Admitted" for c in conditions):
        conditions = set_condition(
            conditions,
            "Admitted",
            False,
            "NoReservation",
            "The workload has no reservation",
            now,
            generation,
        )
    status["conditions"] = list(conditions)
    status.pop("admission", None)
    return body


def finished(
    workload: Mapping[str, Any], succeeded: bool, message: str, now: float
) -> dict[str, Any]:
    """The Workload marked Finished when the job ends (Kueue then frees its quota)."""
    body = copy.deepcopy(dict(workload))
    status = body.setdefault("status", {})
    generation = (body.get("metadata") or {}).get("generation")
    reason = "Succeeded" if succeeded else "Failed"
    status["conditions"] = list(
        set_condition(
            status.get("conditions") or [], "Finished", True, reason, message, now, generation
        )
    )
    return body


def place(pod_meta: dict[str, Any], pod_spec: dict[str, Any], placement: Placement | None) -> None:
    """Add an admission's placement to a pod (its node labels win: Kueue chose the flavor by
    them, so a selector of the job's own that disagreed could not have been admitted there)."""
    if placement is None:
        return
    if placement.node_selector:
        pod_spec["nodeSelector"] = {**pod_spec.get("nodeSelector", {}), **placement.node_selector}
    if placement.tolerations:
        existing = list(pod_spec.get("tolerations", []))
        pod_spec["tolerations"] = existing + [
            dict(t) for t in placement.tolerations if t not in existing
        ]
    if placement.labels:
        pod_meta["labels"] = {**pod_meta.get("labels", {}), **placement.labels}
    if placement.annotations:
        pod_meta["annotations"] = {**pod_meta.get("annotations", {}), **placement.annotations}


def pods_gone(learner_phases: Sequence[str], deployment_pods: Sequence[int]) -> bool:
    """No learner pod is pending or running (terminating ones included: the learner is still
    writing its checkpoint) and the rollout/aggregator Deployments report no pods, terminating
    ones included: Kueue may give the quota to another job only once the nodes are free."""
    return all(p not in ("Pending", "Running", "Unknown") for p in learner_phases) and not any(
        deployment_pods
    )
