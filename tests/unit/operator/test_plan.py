"""The planned reconcile: what one timer tick writes, for the situations a job goes through."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from impala_api.spec import ImpalaJob
from impala_operator.build.children import LEARNER_COMPONENTS
from impala_operator.lifecycle import job_status
from impala_operator.lifecycle.plan import (
    TickPlan,
    durability_warning,
    learner_pod,
    plan_children,
    removed_children,
)
from impala_operator.lifecycle.run_policy import LearnerPod
from impala_operator.scale.autoscaler import MetricSample
from tests.support.jobs import operator_access
from tests.support.plans import SPEC, T0, UID, tick


def _job(**spec: Any) -> ImpalaJob:
    base = {**SPEC, **spec}
    return ImpalaJob.model_validate({"metadata": {"name": "cp", "namespace": "ns"}, "spec": base})


def _dep(replicas: int, requested: str = "", ready: int | None = None) -> job_status.DeploymentView:
    return job_status.DeploymentView("x", replicas, replicas if ready is None else ready, requested)


def _plan(job: ImpalaJob, **kw: Any) -> TickPlan:
    plan: TickPlan = tick(job, **kw)
    return plan


def _replicas(plan: TickPlan) -> dict[str, int]:
    return {m["metadata"]["name"]: m["spec"]["replicas"] for m in plan.apply}


def _running(attempt: int = 0) -> LearnerPod:
    return LearnerPod(name=f"cp-learner-{attempt}", attempt=attempt, phase="Running", ready=True)


def _converge(job: ImpalaJob, plan: TickPlan, now: float, **kw: Any) -> TickPlan:
    """The next tick after `plan` was executed and the cluster caught up."""
    views = {
        m["metadata"]["labels"]["app.kubernetes.io/component"]: job_status.deployment_view(
            {**m, "status": {"readyReplicas": m["spec"]["replicas"]}}
        )
        for m in plan.apply
    }
    deployments = {**kw.pop("deployments", {}), **views}
    return _plan(job, status=plan.status, deployments=deployments, now=now, **kw)


def test_first_tick_creates_everything_then_converges() -> None:
    job = _job()
    first = _plan(job)  # first sight: the learner pod and the Deployments
    assert [m["metadata"]["name"] for m in first.create] == ["cp-learner-0"]
    assert _replicas(first) == {"cp-rollout": 1, "cp-aggregator": 1}  # ceil(1 pod * 2 / 2)
    assert first.status["phase"] == "Pending" and [e.reason for e in first.events] == ["Created"]
    # Had their writes failed, the next tick makes them again.
    plan = _plan(job, status={"phase": "Pending"})
    assert _replicas(plan) == _replicas(first)
    assert [m["metadata"]["name"] for m in plan.create] == ["cp-learner-0"]
    annotations = plan.apply[0]["metadata"]["annotations"]
    assert annotations[job_status.REQUESTED_ANNOTATION] == ""
    assert plan.apply[0]["metadata"]["ownerReferences"][0]["uid"] == UID

    # The learner runs, Deployments exist as applied: nothing more to write (no duplicates).
    again = _converge(job, plan, T0 + 5, pods=[_running()])
    assert again.apply == [] and again.create == [] and again.delete_pods == []
    assert again.status["phase"] == "Running" and again.status["rollouts"]["summary"] == "1/1"
    steady = _plan(
        job,
        status=again.status,
        pods=[_running()],
        now=T0 + 10,
        deployments={"rollout": _dep(1), "aggregator": _dep(1)},
    )
    assert steady.apply == [] and steady.create == [] and steady.events == []
    assert job_status.status_patch(again.status, steady.status) == {}


def test_starved_learner_scales_rollouts_and_aggregators_up() -> None:
    job = _job()
    deps = {"rollout": _dep(1), "aggregator": _dep(1)}
    status = _plan(job, pods=[_running()], deployments=deps).status
    samples = [
        MetricSample(time=T0 + t, available=True, queue_fill=0.0, idle_fraction=0.9)
        for t in range(0, 21, 5)
    ]
    plan = _plan(
        job, status=status, pods=[_running()], deployments=deps, samples=samples, now=T0 + 20
    )
    assert _replicas(plan) == {"cp-rollout": 2, "cp-aggregator": 2}
    assert [e.reason for e in plan.events] == ["LearnerStarved", "AggregatorsScaled"]
    assert plan.status["lastScaleTime"] == "2023-11-14T22:13:40Z"
    assert plan.status["rollouts"]["desired"] == 2 and plan.scale is not None


def test_kubectl_scale_request_is_honoured_once() -> None:
    job = _job(rollouts={"minReplicas": 1, "maxReplicas": 5, "replicas": 4})
    deps = {"rollout": _dep(2, requested=""), "aggregator": _dep(0)}
    plan = _plan(job, status={"phase": "Running"}, pods=[_running()], deployments=deps)
    assert _replicas(plan) == {"cp-rollout": 4, "cp-aggregator": 2}  # 4 workers / 2
    assert plan.events[0].reason == "ManualScale"
    assert plan.apply[0]["metadata"]["annotations"][job_status.REQUESTED_ANNOTATION] == "4"
    # Once recorded, the autoscaler owns the count again (here: holds, no metrics).
    later = _plan(
        job,
        status=plan.status,
        pods=[_running()],
        now=T0 + 60,
        deployments={"rollout": _dep(4, "4"), "aggregator": _dep(2)},
    )
    assert later.apply == [] and later.events == []


def test_suspend_scales_to_zero_and_resume_restores() -> None:
    job = _job(runPolicy={"suspend": True})
    deps = {"rollout": _dep(3), "aggregator": _dep(2)}
    plan = _plan(job, status={"phase": "Running"}, pods=[_running()], deployments=deps)
    assert _replicas(plan) == {"cp-rollout": 0, "cp-aggregator": 0}
    assert plan.delete_pods == ["cp-learner-0"] and plan.create == []
    assert plan.status["phase"] == "Suspended" and plan.status["rollouts"]["desired"] == 0

    resumed = _plan(
        _job(),
        status=plan.status,
        now=T0 + 100,
        deployments={"rollout": _dep(0), "aggregator": _dep(0)},
    )
    assert _replicas(resumed) == {"cp-rollout": 1, "cp-aggregator": 1}
    assert [m["metadata"]["name"] for m in resumed.create] == ["cp-learner-0"]
    assert resumed.status["phase"] == "Pending"


def test_the_timer_is_the_deployments_one_writer() -> None:
    """The edge handlers apply no Deployment (one re-applying the count it last saw would race
    the timer's scaling, as a suspend's did): the timer creates them, scales them and re-applies
    one whose spec changed, and leaves one that is as it wants it."""
    job = _job()
    kinds = {m["kind"] for m in plan_children(job, UID, **operator_access(UID))}
    assert "Deployment" not in kinds and "Pod" not in kinds
    first = _plan(job)  # the first sight of the job
    assert _replicas(first) == {"cp-rollout": 1, "cp-aggregator": 1}
    made = {m["metadata"]["name"]: m for m in first.apply}
    hashes = {
        name.rsplit("-", 1)[1]: m["metadata"]["annotations"][job_status.SPEC_HASH_ANNOTATION]
        for name, m in made.items()
    }
    live = {role: replace(_dep(m["spec"]["replicas"]), spec_hash=hashes[role])
            for role, m in zip(("rollout", "aggregator"), made.values(), strict=True)}  # fmt: skip
    assert _plan(job, status=first.status, deployments=live).apply == []
    bigger = _job(rollouts={**SPEC["rollouts"], "resources": {"limits": {"memory": "3Gi"}}})
    changed = _plan(bigger, status=first.status, deployments=live)
    assert _replicas(changed) == {"cp-rollout": 1}  # its replicas kept, its template new
    pod = changed.apply[0]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["memory"] == "3Gi"


def test_learner_failure_creates_the_next_attempt() -> None:
    job = _job()
    deps = {"rollout": _dep(1), "aggregator": _dep(1)}
    failed = LearnerPod("cp-learner-0", 0, phase="Failed", exit_code=1, finished_at=T0)
    plan = _plan(job, status={"phase": "Running"}, pods=[failed], deployments=deps)
    assert [m["metadata"]["name"] for m in plan.create] == ["cp-learner-1"]
    assert plan.create[0]["metadata"]["labels"]["impala.dev/restart"] == "1"
    assert plan.status["learner"]["restarts"] == 1 and plan.delete_pods == []


def test_success_cleans_up_and_ttl_deletes() -> None:
    job = _job(runPolicy={"ttlSecondsAfterFinished": 5})
    deps = {"rollout": _dep(2), "aggregator": _dep(1)}
    done = LearnerPod("cp-learner-0", 0, phase="Succeeded", exit_code=0)
    plan = _plan(job, status={"phase": "Running"}, pods=[done], deployments=deps)
    # cleanPodPolicy Running (the default): the finished learner pod stays, with its logs
    assert plan.status["phase"] == "Succeeded" and plan.delete_pods == []
    assert _replicas(plan) == {"cp-rollout": 0, "cp-aggregator": 0} and not plan.delete_job
    everything = _job(runPolicy={"ttlSecondsAfterFinished": 5, "cleanPodPolicy": "All"})
    plan = _plan(everything, status={"phase": "Running"}, pods=[done], deployments=deps)
    assert plan.status["phase"] == "Succeeded" and plan.delete_pods == ["cp-learner-0"]
    gone = _plan(
        job, status=plan.status, now=T0 + 6, deployments={"rollout": _dep(0), "aggregator": _dep(0)}
    )
    assert gone.delete_job and gone.apply == []


def test_plan_children_are_what_follows_the_spec_alone() -> None:
    job = _job()
    fresh = {
        m["kind"] + "/" + m["metadata"]["name"]
        for m in plan_children(job, UID, **operator_access(UID))
    }
    assert fresh == {
        "Secret/cp-auth",
        "ConfigMap/cp-config",
        "Service/cp-learner",
        "Service/cp-status",
        "NetworkPolicy/cp-network",
        "PodDisruptionBudget/cp-learner",
    }
    suspended = _plan(_job(runPolicy={"suspend": True}))
    assert _replicas(suspended) == {"cp-rollout": 0, "cp-aggregator": 0}


def test_changed_learner_spec_recreates_the_pod_without_counting_a_failure() -> None:
    deps = {"rollout": _dep(1), "aggregator": _dep(1)}
    first = _plan(_job(), pods=[], deployments=deps)
    created = first.create[0]["metadata"]["annotations"][job_status.SPEC_HASH_ANNOTATION]
    same = LearnerPod("cp-learner-0", 0, phase="Running", ready=True, spec_hash=created)
    assert _plan(_job(), status=first.status, pods=[same], deployments=deps).delete_pods == []

    bigger = _job(learner={"resources": {"limits": {"memory": "8Gi"}}})
    plan = _plan(bigger, status=first.status, pods=[same], deployments=deps)
    assert plan.delete_pods == ["cp-learner-0"] and plan.create == []
    assert "LearnerSpecChanged" in [e.reason for e in plan.events]
    assert plan.status["learner"]["restarts"] == 0
    unknown = LearnerPod("cp-learner-0", 0, phase="Running", ready=True, spec_hash=None)
    assert _plan(bigger, status=first.status, pods=[unknown], deployments=deps).delete_pods == []


def test_a_group_of_learners_is_created_together_and_recreated_together() -> None:
    """learner.replicas 3: one pod per rank in the same tick; the status counts the ready ones
    (`kubectl get ij` LEARNERS); a spec change takes the whole group (one learner alone cannot
    leave it), without counting a failure."""
    deps = {"rollout": _dep(1), "aggregator": _dep(1)}
    job = _job(learner={"replicas": 3})
    first = _plan(job, status={"phase": "Pending"}, deployments=deps)
    assert [m["metadata"]["name"] for m in first.create] == [
        "cp-learner-0", "cp-learner-0-1", "cp-learner-0-2"
    ]  # fmt: skip
    hashes = [m["metadata"]["annotations"][job_status.SPEC_HASH_ANNOTATION] for m in first.create]
    pods = [
        LearnerPod(m["metadata"]["name"], 0, phase="Running", ready=rank != 2, rank=rank,
                   spec_hash=hashes[rank])
        for rank, m in enumerate(first.create)
    ]  # fmt: skip
    running = _plan(job, status=first.status, pods=pods, deployments=deps)
    assert running.create == [] and running.delete_pods == []
    learner = running.status["learner"]
    assert (learner["summary"], learner["replicas"], learner["readyReplicas"]) == ("2/3", 3, 2)
    bigger = _job(learner={"replicas": 3, "resources": {"limits": {"memory": "8Gi"}}})
    changed = _plan(bigger, status=running.status, pods=pods, deployments=deps)
    assert changed.delete_pods == ["cp-learner-0", "cp-learner-0-1", "cp-learner-0-2"]
    assert changed.create == [] and changed.status["learner"]["restarts"] == 0


def test_learner_budget_and_grace_follow_the_spec() -> None:
    job = _job()
    (pdb,) = [
        m
        for m in plan_children(job, UID, **operator_access(UID))
        if m["kind"] == "PodDisruptionBudget"
    ]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchExpressions"] == [  # every learner pod
        {"key": "app.kubernetes.io/component", "operator": "In", "values": LEARNER_COMPONENTS}
    ]
    assert removed_children(job) == []
    assert learner_pod(job, UID, 0)["spec"]["terminationGracePeriodSeconds"] == 120
    off = _job(
        runPolicy={"learnerDisruptionBudget": False}, learner={"terminationGracePeriodSeconds": 900}
    )
    assert not [
        m
        for m in plan_children(off, UID, **operator_access(UID))
        if m["kind"] == "PodDisruptionBudget"
    ]
    # Switched off on a live job: the budget it had is deleted.
    assert removed_children(off) == [("policy/v1", "PodDisruptionBudget", "cp-learner")]
    assert learner_pod(off, UID, 0)["spec"]["terminationGracePeriodSeconds"] == 900


def test_a_job_whose_results_die_with_the_pod_is_warned_about() -> None:
    warning = durability_warning(_job())
    assert warning is not None and (warning.type, warning.reason) == (
        "Warning",
        "ResultsNotDurable",
    )
    assert "volumeClaim" in warning.message and "storageUri" in warning.message
    assert durability_warning(_job(checkpoint={"volumeClaim": "results"})) is None
    assert durability_warning(_job(checkpoint={"storageUri": "s3://results/cp"})) is None
