"""One reconcile of a job, planned purely; `handlers.execute` performs the plan through `kube.Api`.

`plan_tick` is the level-based step the timer runs: from the job, its current status, the observed
children (learner pods, Deployments) and the sidecar's metric history it decides the lifecycle
transition, the rollout/aggregator replicas, the API writes and the Events, and computes the new
status. `plan_children` is the edge-triggered part (create/update/resume): the children that follow
the spec directly. Both are pure: nothing here talks to the API server.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from impala_api import names
from impala_api.snapshot import StatusSnapshot
from impala_api.spec import ImpalaJob
from impala_operator.build import children
from impala_operator.build.children import Manifest
from impala_operator.build.tokens import JobTokens
from impala_operator.lifecycle import job_status, run_policy
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
    """Children to server-side apply (Deployments whose replicas or request changed)."""
    create: list[Manifest] = field(default_factory=list)
    """Children to create if absent (the learner pod of the current attempt)."""
    delete_pods: list[str] = field(default_factory=list)
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    scale: autoscaler.ScaleDecision | None = None


def requested(job: ImpalaJob, role: NodeRole) -> str:
    """The group's `replicas` request as the Deployment annotation stores it ("" for none)."""
    group = job.spec.rollouts if role == "rollout" else job.spec.aggregators
    return "" if group.replicas is None else str(group.replicas)


def deployment(job: ImpalaJob, uid: str, role: NodeRole, replicas: int, request: str) -> Manifest:
    """The builder's Deployment plus the operator's request bookkeeping annotation."""
    manifest = children.build_node_deployment(job, uid, role, replicas)
    annotations = manifest["metadata"].setdefault("annotations", {})
    annotations[job_status.REQUESTED_ANNOTATION] = request
    return manifest


def learner_pod(job: ImpalaJob, uid: str, attempt: int) -> Manifest:
    """The builder's learner pod, annotated with the hash of its spec."""
    pod = children.build_learner_pod(job, uid, restart_count=attempt)
    digest = hashlib.sha256(json.dumps(pod["spec"], sort_keys=True).encode()).hexdigest()[:16]
    pod["metadata"].setdefault("annotations", {})[job_status.SPEC_HASH_ANNOTATION] = digest
    return pod


def plan_children(
    job: ImpalaJob,
    uid: str,
    deployments: Mapping[str, job_status.DeploymentView | None],
    *,
    tokens: JobTokens,
    operator_namespace: str,
) -> list[Manifest]:
    """Children that follow the spec (auth Secret, config, Services, NetworkPolicy,
    Deployments), for the create/update/resume handlers; the Secret first, as the pods mount it.
    Existing Deployments keep their replicas and request marker: replica decisions are the
    timer's, which sees the request change and acts on it."""
    suspended = job.spec.run_policy.suspend
    manifests = [
        children.build_auth_secret(job, uid, tokens),
        children.build_config_map(job, uid),
        children.build_learner_service(job, uid),
        children.build_status_service(job, uid),
        children.build_network_policy(job, uid, operator_namespace),
    ]
    if job.spec.run_policy.learner_disruption_budget:
        manifests.append(children.build_learner_disruption_budget(job, uid))
    for role in ROLES:
        view = deployments.get(role)
        if view is not None and view.requested is not None:
            manifests.append(deployment(job, uid, role, view.replicas, view.requested))
        else:
            group = job.spec.rollouts if role == "rollout" else job.spec.aggregators
            start = 0 if suspended else group.initial_replicas
            manifests.append(deployment(job, uid, role, start, requested(job, role)))
    return manifests


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
    previous_phase: str | None,
    samples: Sequence[autoscaler.MetricSample],
    last_scale_time: float | None,
    now: float,
    settings: Settings,
) -> autoscaler.ScaleDecision:
    group = job.spec.rollouts
    lo, hi = group.min_replicas, group.max_replicas
    wanted = requested(job, "rollout")
    if view is not None and group.replicas is not None and view.requested not in (None, wanted):
        target = autoscaler.clamp(group.replicas, lo, hi)
        msg = (
            f"spec.rollouts.replicas set to {group.replicas}; rollouts {view.replicas} -> {target}"
        )
        return autoscaler.ScaleDecision(target, "ManualScale", msg, changed=True)
    if view is None or previous_phase in (None, "Suspended") or view.requested is None:
        current = group.initial_replicas  # a fresh start (or resume) begins from the request
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
) -> TickPlan:
    """Decide one level-based reconcile; see the module docstring."""
    state = job_status.job_state(status)
    outcome = run_policy.step(
        job.spec.run_policy, pods, state, now, restart_backoff=settings.restart_backoff_seconds
    )
    plan = TickPlan(status={}, events=list(outcome.events))
    last_scale = run_policy.parse_time(status.get("lastScaleTime"))
    rollout_view, aggregator_view = deployments.get("rollout"), deployments.get("aggregator")

    rollouts = aggregators = 0
    if outcome.run_workers:
        decision = _rollouts(job, rollout_view, state.phase, samples, last_scale, now, settings)
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
        if (
            aggregator_view is not None
            and aggregator_view.replicas != aggregators
            and (state.phase not in (None, "Suspended"))
        ):
            msg = f"aggregators {aggregator_view.replicas} -> {aggregators} for {rollouts} rollouts"
            plan.events.append(Event("Normal", "AggregatorsScaled", msg))

    for role, replicas in zip(ROLES, (rollouts, aggregators), strict=True):
        view, wanted = deployments.get(role), requested(job, role)
        if view is None and state.phase is None:
            continue  # first sight of the job: the create handler is applying it right now
        if view is None or view.replicas != replicas or view.requested != wanted:
            plan.apply.append(deployment(job, uid, role, replicas, wanted))

    restarts = outcome.state.restarts
    current = next((p for p in pods if p.attempt == restarts and not p.deleting), None)
    if outcome.run_learner:
        pod = learner_pod(job, uid, restarts)
        wanted_hash = pod["metadata"]["annotations"][job_status.SPEC_HASH_ANNOTATION]
        if current is None:
            plan.create.append(pod)
        elif current.spec_hash not in (None, wanted_hash) and not current.finished:
            # Pods are immutable: new learner resources/image/placement mean a new pod. The
            # learner checkpoints on SIGTERM and the same attempt resumes from it.
            plan.delete_pods.append(current.name)
            msg = f"learner pod spec changed; recreating {current.name} from the checkpoint"
            plan.events.append(Event("Normal", "LearnerSpecChanged", msg))
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
    )
    return plan
