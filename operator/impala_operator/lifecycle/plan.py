"""One reconcile of a job, planned purely; `handlers.execute` performs the plan through `kube.Api`.

`plan_tick` is the level-based step the timer runs: from the job, its current status, the observed
children (learner pods, Deployments) and the sidecar's metric history it decides the lifecycle
transition, the rollout/aggregator Deployments (their one writer), the learner pods, the API writes
and the Events, and computes the new status. `plan_children` is the edge-triggered part
(create/update/resume): the children that follow the spec alone. Both are pure: nothing here
talks to the API server.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from impala_api import names
from impala_api.snapshot import StatusSnapshot
from impala_api.spec import ImpalaJob
from impala_operator.build import children, kueue_workload
from impala_operator.build.children import Manifest
from impala_operator.build.tokens import JobTokens
from impala_operator.lifecycle import admission, job_status, run_policy
from impala_operator.lifecycle.admission import Admission
from impala_operator.lifecycle.conditions import parse_time, set_condition
from impala_operator.lifecycle.run_policy import Event, LearnerPod
from impala_operator.scale import autoscaler
from impala_operator.settings import Settings

NodeRole = children.NodeRole
ROLES: tuple[NodeRole, ...] = ("rollout", "aggregator")


@dataclass
class TickPlan:
    """What one level-based reconcile decided."""

    status: dict[str, Any]
    apply: list[Manifest] = field(default_factory=list)
    """Children to server-side apply: the Deployments that are missing or whose replicas, request
    or spec changed."""
    create: list[Manifest] = field(default_factory=list)
    """Children to create if absent (the learner pod of the current attempt)."""
    delete_pods: list[str] = field(default_factory=list)
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    scale: autoscaler.ScaleDecision | None = None
    workload: WorkloadWrite | None = None
    """The one write to the job's Kueue Workload this tick, if any."""


@dataclass(frozen=True)
class WorkloadWrite:
    """Create the Workload, delete it (its pod sets changed: a new one is made next tick), or
    update its status (quota released after an eviction, Finished)."""

    action: Literal["create", "delete", "status"]
    body: Manifest


@dataclass(frozen=True)
class Queueing:
    """What the runtime observed of a queued job's Workload (None: not created yet), the
    ResourceFlavors its admission names, and the priority a new Workload gets."""

    workload: Mapping[str, Any] | None
    flavors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    priority: kueue_workload.Priority | None = None
    problem: str = ""
    """Why no Workload can be made (no Kueue API, a missing priority class): the job waits."""


def requested(job: ImpalaJob, role: NodeRole) -> str:
    """The group's `replicas` request as the Deployment annotation stores it ("" for none)."""
    group = job.spec.rollouts if role == "rollout" else job.spec.aggregators
    return "" if group.replicas is None else str(group.replicas)


def deployment(
    job: ImpalaJob,
    uid: str,
    role: NodeRole,
    replicas: int,
    request: str,
    admitted: Admission | None = None,
) -> Manifest:
    """The builder's Deployment, its pods placed where Kueue admitted them, plus the operator's
    request bookkeeping annotation and the hash of its spec bar the replicas."""
    manifest = children.build_node_deployment(job, uid, role, replicas)
    if admitted is not None:
        template = manifest["spec"]["template"]
        admission.place(template["metadata"], template["spec"], admitted.placement.get(role))
    annotations = manifest["metadata"].setdefault("annotations", {})
    annotations[job_status.REQUESTED_ANNOTATION] = request
    annotations[job_status.SPEC_HASH_ANNOTATION] = _spec_hash(
        {k: v for k, v in manifest["spec"].items() if k != "replicas"}
    )
    return manifest


def _spec_hash(spec: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def learner_pod(
    job: ImpalaJob, uid: str, attempt: int, admitted: Admission | None = None, rank: int = 0
) -> Manifest:
    """The builder's learner pod of `rank`, placed where Kueue admitted it, annotated with the
    hash of its spec."""
    pod = children.build_learner_pod(job, uid, restart_count=attempt, rank=rank)
    if admitted is not None:
        admission.place(
            pod["metadata"], pod["spec"], admitted.placement.get(kueue_workload.LEARNER)
        )
    pod["metadata"].setdefault("annotations", {})[job_status.SPEC_HASH_ANNOTATION] = _spec_hash(
        pod["spec"]
    )
    return pod


def plan_children(
    job: ImpalaJob,
    uid: str,
    *,
    tokens: JobTokens,
    operator_namespace: str,
    monitoring_namespace: str | None = None,
) -> list[Manifest]:
    """Children that follow the spec alone (auth Secret, config, Services, NetworkPolicy, the
    learner's disruption budget), for the create/update/resume handlers; the Secret first, as
    the pods mount it. The timer (`plan_tick`) is the one writer of the learner pods and of the
    rollout and aggregator Deployments, so that their replicas, request marker and template are
    decided in one place (an edge handler re-applying the count it last saw would race the
    timer's scaling)."""
    manifests = [
        children.build_auth_secret(job, uid, tokens),
        children.build_config_map(job, uid),
        children.build_learner_service(job, uid),
        children.build_status_service(job, uid),
        children.build_network_policy(job, uid, operator_namespace, monitoring_namespace),
    ]
    if job.spec.run_policy.learner_disruption_budget:
        manifests.append(children.build_learner_disruption_budget(job, uid))
    return manifests


def _changed(
    view: job_status.DeploymentView, replicas: int, request: str, manifest: Manifest
) -> bool:
    """Whether a live Deployment differs from what the tick wants: its replicas, its request
    marker, or its spec (the hash it was applied with; one without a hash is left as it is)."""
    wanted = manifest["metadata"]["annotations"][job_status.SPEC_HASH_ANNOTATION]
    return (
        view.replicas != replicas
        or view.requested != request
        or view.spec_hash not in (None, wanted)
    )


def durability_warning(job: ImpalaJob) -> Event | None:
    """A Warning when nothing keeps the run's results past the learner pod."""
    checkpoint = job.spec.checkpoint
    if checkpoint.volume_claim or checkpoint.storage_uri:
        return None
    return Event(
        "Warning",
        "ResultsNotDurable",
        "spec.checkpoint has neither volumeClaim nor storageUri: the run directory "
        "(checkpoints, summary.json, history.jsonl) is an emptyDir and goes with the learner pod",
    )


def removed_children(job: ImpalaJob) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of children the spec no longer wants (a budget switched off)."""
    if job.spec.run_policy.learner_disruption_budget:
        return []
    return [("policy/v1", "PodDisruptionBudget", names.child_name(job.name, "learner"))]


def _rollouts(
    job: ImpalaJob,
    view: job_status.DeploymentView | None,
    state: run_policy.JobState,
    samples: Sequence[autoscaler.MetricSample],
    last_scale_time: float | None,
    now: float,
    settings: Settings,
    cap: int | None = None,
) -> autoscaler.ScaleDecision:
    group = job.spec.rollouts
    hi = group.max_replicas if cap is None else min(group.max_replicas, cap)
    lo = min(group.min_replicas, hi)
    wanted = requested(job, "rollout")
    if view is not None and group.replicas is not None and view.requested not in (None, wanted):
        target = autoscaler.clamp(group.replicas, lo, hi)
        msg = (
            f"spec.rollouts.replicas set to {group.replicas}; rollouts {view.replicas} -> {target}"
        )
        return autoscaler.ScaleDecision(target, "ManualScale", msg, changed=True)
    fresh = state.phase in (None, "Suspended") or _was_held(state)
    if view is None or fresh or view.requested is None:
        # a fresh start (or a resume, or a readmission) begins from the request
        current = autoscaler.clamp(group.initial_replicas, lo, hi)
    else:
        current = view.replicas
    return autoscaler.decide_rollouts(
        samples,
        group.autoscaling,
        current=current,
        min_replicas=lo,
        max_replicas=hi,
        last_scale_time=last_scale_time,
        now=now,
        idle_threshold=settings.learner_idle_threshold,
    )


def _was_held(state: run_policy.JobState) -> bool:
    """The previous reconcile held the job in its queue (its Admitted condition is False)."""
    cond = next((c for c in state.conditions if c.get("type") == admission.ADMITTED_CONDITION), {})
    return cond.get("status") == "False"


def _queue(
    job: ImpalaJob, status: Mapping[str, Any], queueing: Queueing | None
) -> tuple[Admission | None, run_policy.Hold | None]:
    """Kueue's decision for a queued job (None for one without a queue) and, while it may not
    run, the hold it puts on the run policy."""
    queue = kueue_workload.queue_name(job)
    if queue is None:
        return None, None
    if queueing is None:  # the Workload was not read this tick: keep what status recorded
        admitted = Admission.from_status(queue, status.get("admission"))
        decided = admitted or admission.read(None, queue)
    elif queueing.problem and queueing.workload is None:
        decided = Admission("queued", queue, reason="Queued", message=queueing.problem)
    else:
        decided = admission.read(queueing.workload, queue, queueing.flavors)
    hold = (
        None if decided.runs
        else run_policy.Hold(decided.reason, decided.message, fails=decided.never_runs)
    )  # fmt: skip
    return decided, hold


def _workload_write(
    job: ImpalaJob,
    uid: str,
    queueing: Queueing | None,
    decided: Admission | None,
    outcome: run_policy.Outcome,
    pods: Sequence[LearnerPod],
    deployments: Mapping[str, job_status.DeploymentView | None],
    settings: Settings,
    now: float,
) -> WorkloadWrite | None:
    """The Workload write this tick: create it, replace it when the job's pod sets changed,
    hand its quota back once an evicted job's pods are gone, mark it Finished at the end."""
    if queueing is None or decided is None:
        return None
    workload, per_aggregator = queueing.workload, settings.rollout_workers_per_aggregator
    state = outcome.state
    if state.terminal:
        if workload is None or decided.state == "finished":
            return None
        body = admission.finished(workload, state.phase == "Succeeded", state.message, now)
        return WorkloadWrite("status", body)
    if workload is None and queueing.problem:
        return None
    if workload is None:
        made = kueue_workload.build_workload(
            job, uid, queueing.priority, workers_per_aggregator=per_aggregator
        )
        return WorkloadWrite("create", made)
    if kueue_workload.stale(workload, job, uid, workers_per_aggregator=per_aggregator):
        return WorkloadWrite("delete", dict(workload))
    gone = admission.pods_gone(
        [p.phase for p in pods],
        [v.observed + v.terminating for v in deployments.values() if v is not None],
    )
    if decided.state == "evicted" and decided.reserved and gone:
        return WorkloadWrite("status", admission.released(workload, now))
    return None


def _admission_status(
    state: run_policy.JobState, decided: Admission | None, now: float, events: list[Event]
) -> run_policy.JobState:
    """The job's `Admitted` condition (queued jobs only), an Event when it changes, and an
    admitted job's message while it waits for its learner."""
    if decided is None:
        return state
    was = next((c for c in state.conditions if c.get("type") == admission.ADMITTED_CONDITION), {})
    flipped = was.get("status") != ("True" if decided.runs else "False")
    if flipped or was.get("reason") != decided.reason:
        kind: Literal["Normal", "Warning"] = "Warning" if decided.never_runs else "Normal"
        events.append(Event(kind, decided.reason, decided.message))
    conditions = set_condition(
        state.conditions,
        admission.ADMITTED_CONDITION,
        decided.runs,
        decided.reason,
        decided.message,
        now,
    )
    state = replace(state, conditions=conditions)
    if decided.runs and flipped and state.phase == "Pending":
        state = replace(state, reason=decided.reason, message=decided.message)
    return state


def _workers(
    plan: TickPlan,
    job: ImpalaJob,
    state: run_policy.JobState,
    deployments: Mapping[str, job_status.DeploymentView | None],
    samples: Sequence[autoscaler.MetricSample],
    last_scale: float | None,
    now: float,
    settings: Settings,
    decided: Admission | None,
) -> tuple[int, int, float | None]:
    """Rollout and aggregator replicas of a job whose workers run (autoscaled within what
    Kueue admitted), recording the decision and its Events in `plan`; and the last scale time."""
    cap = decided.cap(kueue_workload.ROLLOUT) if decided is not None else None
    view = deployments.get("rollout")
    decision = _rollouts(job, view, state, samples, last_scale, now, settings, cap)
    plan.scale = decision
    rollouts = decision.replicas
    if decision.changed:
        last_scale = now
        plan.events.append(Event("Normal", decision.reason, decision.message))
    aggregators = autoscaler.aggregator_replicas(
        job.spec.aggregators,
        rollout_replicas=rollouts,
        workers_per_pod=job.spec.rollouts.workers_per_pod,
        workers_per_aggregator=settings.rollout_workers_per_aggregator,
    )
    if decided is not None:
        aggregators = min(aggregators, decided.cap(kueue_workload.AGGREGATOR) or 0)
    aggregator_view = deployments.get("aggregator")
    if (
        aggregator_view is not None
        and aggregator_view.replicas != aggregators
        and (state.phase not in (None, "Suspended"))
    ):
        msg = f"aggregators {aggregator_view.replicas} -> {aggregators} for {rollouts} rollouts"
        plan.events.append(Event("Normal", "AggregatorsScaled", msg))
    return rollouts, aggregators, last_scale


def _learner(
    plan: TickPlan,
    job: ImpalaJob,
    uid: str,
    attempt: int,
    pods: Sequence[LearnerPod],
    decided: Admission | None,
) -> None:
    """The learner pods of the attempt in force, one per rank (`spec.learner.replicas`, started
    together): created if absent, recreated if their spec changed."""
    wanted: dict[int, Manifest] = {}
    changed: list[LearnerPod] = []
    running: list[LearnerPod] = []
    for rank in range(job.spec.learner.replicas):
        pod = learner_pod(job, uid, attempt, decided, rank)
        current = next(
            (p for p in pods if p.attempt == attempt and p.rank == rank and not p.deleting), None
        )
        if current is None:
            wanted[rank] = pod
        elif not current.finished:
            running.append(current)
            wanted_hash = pod["metadata"]["annotations"][job_status.SPEC_HASH_ANNOTATION]
            if current.spec_hash not in (None, wanted_hash):
                changed.append(current)
    if changed:
        # Pods are immutable: new learner resources/image/placement mean new pods. The learner
        # checkpoints on SIGTERM and the same attempt resumes from it, once they are gone; a
        # group of learners goes together (one learner alone cannot leave it).
        for gone in running if len(running) > 1 else changed:
            plan.delete_pods.append(gone.name)
            msg = f"learner pod spec changed; recreating {gone.name} from the checkpoint"
            plan.events.append(Event("Normal", "LearnerSpecChanged", msg))
        return
    plan.create += wanted.values()


def plan_tick(
    job: ImpalaJob,
    uid: str,
    *,
    status: Mapping[str, Any],
    pods: Sequence[LearnerPod],
    deployments: Mapping[str, job_status.DeploymentView | None],
    samples: Sequence[autoscaler.MetricSample],
    snapshot: StatusSnapshot | None,
    now: float,
    settings: Settings,
    queueing: Queueing | None = None,
) -> TickPlan:
    """Decide one level-based reconcile; see the module docstring. `queueing` is what the
    runtime read of a queued job's Workload (`lifecycle.admission`)."""
    state = job_status.job_state(status)
    decided, hold = _queue(job, status, queueing)
    outcome = run_policy.step(
        job.spec.run_policy,
        pods,
        state,
        now,
        restart_backoff=settings.restart_backoff_seconds,
        hold=hold,
    )
    if job_status.learner_pod_is_refused(status):
        # No rollout or aggregator pods for a learner the API server will not take: they would
        # hold the cluster's resources for a job that cannot train (startupDeadlineSeconds
        # fails it unless the learner pod is made meanwhile).
        outcome = replace(outcome, run_workers=False)
    plan = TickPlan(status={}, events=list(outcome.events))
    outcome = replace(outcome, state=_admission_status(outcome.state, decided, now, plan.events))
    plan.workload = _workload_write(
        job, uid, queueing, decided, outcome, pods, deployments, settings, now
    )
    last_scale = parse_time(status.get("lastScaleTime"))
    rollout_view, aggregator_view = deployments.get("rollout"), deployments.get("aggregator")
    rollouts = aggregators = 0
    if outcome.run_workers:
        rollouts, aggregators, last_scale = _workers(
            plan, job, state, deployments, samples, last_scale, now, settings, decided
        )
    for role, replicas in zip(ROLES, (rollouts, aggregators), strict=True):
        view, wanted = deployments.get(role), requested(job, role)
        manifest = deployment(job, uid, role, replicas, wanted, decided)
        if view is None or _changed(view, replicas, wanted, manifest):
            plan.apply.append(manifest)
    if outcome.run_learner:
        _learner(plan, job, uid, outcome.state.restarts, pods, decided)
    plan.delete_pods += list(outcome.delete_pods)
    plan.delete_job = outcome.delete_job
    plan.status = job_status.compute_status(
        name=job.name,
        namespace=job.metadata.namespace or "",
        state=outcome.state,
        learner_pods=pods,
        rollouts=rollout_view,
        aggregators=aggregator_view,
        desired_rollouts=rollouts,
        desired_aggregators=aggregators,
        snapshot=snapshot,
        previous=status,
        last_scale_time=last_scale,
        replicas=job.spec.learner.replicas,
    )
    regressed = job_status.return_regressed(
        plan.status, snapshot, now, status.get("observedGeneration")
    )
    if regressed is not None:
        plan.events.append(regressed)
    if decided is not None:
        plan.status["admission"] = decided.to_status()
    return plan
