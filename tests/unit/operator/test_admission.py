"""Kueue admission, planned: the Workload a queued job owns, what its status means, and what one
tick writes while the job waits, runs, is evicted, resumes and ends (the e2e test
tests/e2e/test_kueue.py runs the same against a real Kueue)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from impala_api.spec import ImpalaJob
from impala_operator.build import kueue_workload
from impala_operator.lifecycle import admission, job_status
from impala_operator.lifecycle.plan import Queueing, TickPlan
from impala_operator.lifecycle.plan import deployment as plan_deployment
from impala_operator.lifecycle.run_policy import LearnerPod
from tests.support.plans import SETTINGS, SPEC, T0, UID, tick

QUEUE = "team-a"


def _job(labels: dict[str, str] | None = None, **spec: Any) -> ImpalaJob:
    meta = {
        "name": "cp",
        "namespace": "ns",
        "labels": {kueue_workload.QUEUE_LABEL: QUEUE} if labels is None else labels,
    }
    return ImpalaJob.model_validate({"metadata": meta, "spec": {**SPEC, **spec}})


def _cond(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def _workload(job: ImpalaJob, *conditions: dict[str, str], **status: Any) -> dict[str, Any]:
    per_aggregator = SETTINGS.rollout_workers_per_aggregator
    made = kueue_workload.build_workload(job, UID, None, workers_per_aggregator=per_aggregator)
    made["metadata"]["generation"] = 1
    made["status"] = {"conditions": list(conditions), **status}
    return made


ADMISSION = {
    "clusterQueue": "cq",
    "podSetAssignments": [
        {"name": "learner", "count": 1, "flavors": {"cpu": "spot", "memory": "spot"}},
        {"name": "rollout", "count": 2, "flavors": {"cpu": "spot"}},
    ],
}
SPOT = {
    "spec": {
        "nodeLabels": {"pool": "spot"},
        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
    }
}


def _admitted(job: ImpalaJob) -> dict[str, Any]:
    return _workload(
        job,
        _cond("QuotaReserved", "True", "QuotaReserved"),
        _cond("Admitted", "True", "Admitted"),
        admission=ADMISSION,
    )


def _evicted(job: ImpalaJob, reason: str = "Preempted") -> dict[str, Any]:
    return _workload(
        job,
        _cond("QuotaReserved", "True", "QuotaReserved"),
        _cond("Admitted", "True", "Admitted"),
        _cond("Evicted", "True", reason, "Preempted to accommodate a workload"),
        admission=ADMISSION,
    )


def _plan(job: ImpalaJob, queueing: Queueing | None, **kw: Any) -> TickPlan:
    plan: TickPlan = tick(job, queueing=queueing, **kw)
    return plan


def _held_status() -> dict[str, Any]:
    return {
        "phase": "Pending",
        "conditions": [
            {**_cond("Created", "True", "Created"), "lastTransitionTime": "2023-11-14T22:13:20Z"},
            {**_cond("Admitted", "False", "Queued"), "lastTransitionTime": "2023-11-14T22:13:20Z"},
        ],
    }


# --- the Workload ------------------------------------------------------------------------


def test_the_workload_names_the_queue_owner_pod_sets_and_priority() -> None:
    job = _job(rollouts={"minReplicas": 1, "maxReplicas": 3}, aggregators={"maxReplicas": 0})
    made = kueue_workload.build_workload(
        job, UID, kueue_workload.Priority("high", 1000), workers_per_aggregator=4
    )
    assert made["metadata"]["name"] == "impalajob-cp"
    assert made["metadata"]["ownerReferences"][0]["uid"] == UID
    assert made["metadata"]["ownerReferences"][0]["controller"] is True
    assert made["spec"]["queueName"] == QUEUE
    assert made["spec"]["priority"] == 1000
    assert made["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }
    sets = {s["name"]: s for s in made["spec"]["podSets"]}
    assert sets["learner"]["count"] == 1
    assert (sets["rollout"]["count"], sets["rollout"]["minCount"]) == (3, 1)
    assert "aggregator" not in sets
    # Only the pods' spec and labels: a Workload's template allows no other metadata.
    assert set(sets["learner"]["template"]["metadata"]) == {"labels"}
    assert sets["rollout"]["template"]["spec"]["containers"][0]["name"] == "rollout"


def test_aggregators_get_their_pod_set_and_fixed_rollouts_no_min_count() -> None:
    job = _job(
        rollouts={"minReplicas": 2, "maxReplicas": 2, "workersPerPod": 4},
        aggregators={"minReplicas": 1, "maxReplicas": 4},
    )
    sets = {s["name"]: s for s in kueue_workload.pod_sets(job, UID, workers_per_aggregator=4)}
    assert sets["aggregator"]["count"] == 2  # 8 workers at the maximum, 4 per aggregator
    assert "minCount" not in sets["rollout"]  # nothing to shrink: Kueue admits all or none


def test_a_group_of_learners_is_one_pod_set_admitted_whole() -> None:
    job = _job(learner={"replicas": 4, "resources": {"requests": {"cpu": "2"}}})
    sets = {s["name"]: s for s in kueue_workload.pod_sets(job, UID, workers_per_aggregator=4)}
    assert sets["learner"]["count"] == 4 and "minCount" not in sets["learner"]
    single = {s["name"]: s for s in kueue_workload.pod_sets(_job(), UID, workers_per_aggregator=4)}
    assert single["learner"]["count"] == 1


def test_priority_comes_from_the_label_else_the_learner_pod() -> None:
    assert kueue_workload.priority_class(_job()) is None
    labelled = _job({kueue_workload.QUEUE_LABEL: QUEUE, kueue_workload.PRIORITY_LABEL: "urgent"})
    assert kueue_workload.priority_class(labelled) == ("urgent", "WorkloadPriorityClass")
    pod = _job(learner={"pod": {"priorityClassName": "batch-high"}})
    assert kueue_workload.priority_class(pod) == ("batch-high", "PriorityClass")
    assert kueue_workload.Priority("batch-high", 5, "PriorityClass").ref()["group"] == (
        "scheduling.k8s.io"
    )


def test_the_pod_sets_hash_follows_the_pods_not_the_training() -> None:
    job = _job()
    made = kueue_workload.build_workload(job, UID, None, workers_per_aggregator=4)
    longer = _job(stop={"timesteps": 999_999})
    assert not kueue_workload.stale(made, longer, UID, workers_per_aggregator=4)
    bigger = _job(learner={"resources": {"requests": {"cpu": "3"}}})
    assert kueue_workload.stale(made, bigger, UID, workers_per_aggregator=4)


# --- what a Workload's status means ------------------------------------------------------


def test_pending_carries_kueues_reason_and_the_queue() -> None:
    job = _job()
    wl = _workload(job, _cond("QuotaReserved", "False", "Pending", "insufficient quota for cpu"))
    got = admission.read(wl, QUEUE)
    assert (got.state, got.runs, got.reserved) == ("queued", False, False)
    assert "LocalQueue team-a" in got.message and "insufficient quota for cpu" in got.message
    assert admission.read(None, QUEUE).state == "queued"


NEVER = (
    "couldn't assign flavors to pod set learner: insufficient quota for cpu in flavor default, "
    "previously considered podsets requests (0) + current podset request (4) > maximum "
    "capacity (2)"
)
"""Kueue 0.17's message for a learner pod set no quota of the ClusterQueue could hold."""


def test_a_request_over_the_queues_maximum_capacity_can_never_be_admitted() -> None:
    job = _job(learner={"replicas": 2})
    got = admission.read(_workload(job, _cond("QuotaReserved", "False", "Pending", NEVER)), QUEUE)
    assert (got.state, got.reason, got.runs) == ("inadmissible", "ExceedsQuota", False)
    assert "lower spec.learner.replicas or spec.learner.resources" in got.message
    assert "> maximum capacity (2)" in got.message
    # Another flavor that would fit once quota is free, or a pod set that only waits: queued.
    waits = NEVER + ", insufficient unused quota for cpu in flavor spot, 2 more needed"
    assert admission.never_fits(waits) == []
    both = "; ".join([NEVER, NEVER.replace("pod set learner", "pod set rollout")])
    assert admission.never_fits(both) == ["learner", "rollout"]
    assert admission.never_fits("insufficient unused quota for cpu in flavor x, 1 more") == []


def test_a_job_no_quota_could_hold_fails_naming_the_field_and_finishes_its_workload() -> None:
    job = _job(learner={"replicas": 2})
    wl = _workload(job, _cond("QuotaReserved", "False", "Pending", NEVER))
    plan = _plan(job, Queueing(wl), status=_held_status())
    assert plan.status["phase"] == "Failed"
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "ExceedsQuota")
    assert "spec.learner.replicas" in plan.status["message"]
    assert plan.create == [] and all(m["spec"]["replicas"] == 0 for m in plan.apply)
    warnings = [e for e in plan.events if e.type == "Warning"]
    assert {e.reason for e in warnings} == {"ExceedsQuota"}
    assert plan.workload is not None and plan.workload.action == "status"  # Finished: released


def test_admission_places_pods_by_flavor_and_admission_check_updates() -> None:
    job = _job()
    wl = _admitted(job)
    wl["status"]["admissionChecks"] = [
        {
            "name": "prov",
            "state": "Ready",
            "podSetUpdates": [{"name": "learner", "labels": {"prov": "yes"}}],
        }
    ]
    assert admission.flavor_names(wl) == {"spot"}
    got = admission.read(wl, QUEUE, {"spot": SPOT})
    assert got.runs and got.cluster_queue == "cq"
    assert got.cap("rollout") == 2 and got.cap("aggregator") is None
    learner = got.placement["learner"]
    assert learner.node_selector == {"pool": "spot"} and learner.labels == {"prov": "yes"}
    assert learner.tolerations[0]["key"] == "spot"
    # What status records is what every handler builds the pods from.
    assert admission.Admission.from_status(QUEUE, got.to_status()) == got


def test_eviction_and_finish_read_as_such() -> None:
    job = _job()
    got = admission.read(_evicted(job), QUEUE)
    assert (got.state, got.reason, got.reserved) == ("evicted", "EvictedPreempted", True)
    assert "checkpoint is kept" in got.message
    done = _workload(job, _cond("Finished", "True", "Succeeded"))
    assert admission.read(done, QUEUE).state == "finished"


@pytest.mark.parametrize(("reason", "requeued"), [("Preempted", "True"), ("Deactivated", "False")])
def test_releasing_clears_the_admission_as_jobframework_does(reason: str, requeued: str) -> None:
    job = _job()
    wl = _evicted(job, reason)
    before = copy.deepcopy(wl)
    body = admission.released(wl, T0)
    assert wl == before  # pure
    conds = {c["type"]: c for c in body["status"]["conditions"]}
    assert "admission" not in body["status"]
    assert conds["QuotaReserved"]["status"] == "False"
    assert conds["Admitted"]["status"] == "False"
    assert conds["Requeued"]["status"] == requeued
    assert conds["Evicted"]["status"] == "True"  # Kueue's own, left for Kueue to clear


def test_finishing_marks_the_workload() -> None:
    body = admission.finished(_admitted(_job()), False, "backoffLimit reached", T0)
    finished = next(c for c in body["status"]["conditions"] if c["type"] == "Finished")
    assert (finished["status"], finished["reason"]) == ("True", "Failed")
    assert finished["observedGeneration"] == 1


# --- one tick of a queued job ------------------------------------------------------------


def test_a_new_queued_job_creates_its_workload_and_runs_nothing() -> None:
    job = _job()
    plan = _plan(job, Queueing(None), status={"phase": "Pending", "conditions": []})
    assert plan.workload is not None and plan.workload.action == "create"
    assert plan.create == []
    assert all(m["spec"]["replicas"] == 0 for m in plan.apply)
    assert plan.status["phase"] == "Pending"
    cond = next(c for c in plan.status["conditions"] if c["type"] == "Admitted")
    assert cond["status"] == "False" and "LocalQueue team-a" in cond["message"]
    assert plan.status["admission"] is None


def test_a_problem_is_the_message_and_no_workload_is_made() -> None:
    job = _job()
    plan = _plan(job, Queueing(None, problem="WorkloadPriorityClass 'x' does not exist"))
    assert plan.workload is None and plan.create == []
    cond = next(c for c in plan.status["conditions"] if c["type"] == "Admitted")
    assert "'x' does not exist" in cond["message"]


def test_admitted_the_learner_and_rollouts_go_where_kueue_put_them() -> None:
    job = _job(rollouts={"minReplicas": 1, "maxReplicas": 4, "replicas": 4})
    plan = _plan(job, Queueing(_admitted(job), {"spot": SPOT}), status=_held_status())
    pod = plan.create[0]
    assert pod["spec"]["nodeSelector"]["pool"] == "spot"
    assert {"key": "spot", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]
    rollout = next(m for m in plan.apply if m["metadata"]["name"] == "cp-rollout")
    assert rollout["spec"]["replicas"] == 2  # 4 asked for, 2 admitted
    assert rollout["spec"]["template"]["spec"]["nodeSelector"]["pool"] == "spot"
    assert plan.status["admission"]["clusterQueue"] == "cq"
    assert [e.reason for e in plan.events].count("Admitted") == 1
    assert plan.workload is None


def test_evicted_the_pods_stop_and_the_quota_waits_for_them_to_go() -> None:
    job = _job()
    running = LearnerPod("cp-learner-0", 0, phase="Running", ready=True)
    status = {"phase": "Running", "conditions": [], "learner": {"restarts": 0, "failures": 0}}
    view = job_status.DeploymentView("cp-rollout", 1, 1, "", observed=1)
    plan = _plan(
        job,
        Queueing(_evicted(job)),
        status=status,
        pods=[running],
        deployments={"rollout": view, "aggregator": None},
    )
    assert plan.delete_pods == ["cp-learner-0"]
    assert all(m["spec"]["replicas"] == 0 for m in plan.apply)
    assert plan.workload is None  # pods still there: the quota is not handed back yet
    assert plan.status["phase"] == "Pending"
    assert plan.status["learner"]["failures"] == 0
    assert any(e.reason == "EvictedPreempted" for e in plan.events)
    # The rollout pod is being deleted (status.replicas 0) but still draining: not yet.
    draining = job_status.DeploymentView("cp-rollout", 0, 0, "", observed=0, terminating=1)
    drained = {"rollout": draining, "aggregator": None}
    assert (
        _plan(job, Queueing(_evicted(job)), status=plan.status, deployments=drained).workload
        is None
    )
    gone = _plan(job, Queueing(_evicted(job)), status=plan.status)
    assert gone.workload is not None and gone.workload.action == "status"
    assert "admission" not in gone.workload.body["status"]


def test_the_job_ending_finishes_its_workload_once() -> None:
    job = _job()
    done = LearnerPod("cp-learner-0", 0, phase="Succeeded", exit_code=0)
    status = {"phase": "Running", "conditions": [], "learner": {"restarts": 0}}
    plan = _plan(job, Queueing(_admitted(job), {"spot": SPOT}), status=status, pods=[done])
    assert plan.status["phase"] == "Succeeded"
    assert plan.workload is not None and plan.workload.action == "status"
    finished = _workload(job, _cond("Finished", "True", "Succeeded"))
    again = _plan(job, Queueing(finished), status=plan.status, pods=[done])
    assert again.workload is None
    cond = next(c for c in again.status["conditions"] if c["type"] == "Admitted")
    assert (cond["status"], cond["reason"]) == ("False", "Finished")
    assert "quota it held is released" in cond["message"]


def test_changed_pod_sets_replace_the_workload() -> None:
    made = _workload(_job(), _cond("QuotaReserved", "False", "Pending"))
    bigger = _job(learner={"resources": {"requests": {"cpu": "3"}}})
    plan = _plan(bigger, Queueing(made), status=_held_status())
    assert plan.workload is not None and plan.workload.action == "delete"


def test_a_job_without_the_label_is_not_queued() -> None:
    job = _job(labels={})
    plan = _plan(job, None, status={"phase": "Pending", "conditions": []})
    assert plan.workload is None and plan.create
    assert "admission" not in plan.status
    assert not any(c["type"] == "Admitted" for c in plan.status["conditions"])


def test_deployments_of_a_waiting_job_start_with_no_pods() -> None:
    job = _job()
    waiting = _plan(job, Queueing(None), status=_held_status())
    deployments = [m for m in waiting.apply if m["kind"] == "Deployment"]
    assert len(deployments) == 2 and all(m["spec"]["replicas"] == 0 for m in deployments)
    got = admission.read(_admitted(job), QUEUE, {"spot": SPOT})
    rollout = plan_deployment(job, UID, "rollout", 1, "", got)
    assert rollout["spec"]["template"]["spec"]["nodeSelector"]["pool"] == "spot"
