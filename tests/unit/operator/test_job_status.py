"""Status computation from child objects and the sidecar's snapshot; the sidecar client."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from impala_api.crd import build_crd, status_schema
from impala_api.snapshot import (
    STATUS_FILE,
    Counters,
    EvaluationInfo,
    LearnerQueue,
    PolicyStatus,
    ReturnTrend,
    StatusSnapshot,
    StopProgress,
    Throughput,
    write_json_atomic,
)
from impala_operator.lifecycle.conditions import rfc3339, set_condition, stamp_conditions
from impala_operator.lifecycle.job_status import (
    REQUESTED_ANNOTATION,
    RETIRED_ANNOTATION,
    compute_status,
    deployment_view,
    disruption,
    invalid_spec_status,
    job_state,
    learner_pod_view,
    metric_sample,
    return_regressed,
    sidecar_url,
    status_patch,
)
from impala_operator.lifecycle.run_policy import JobState
from impala_operator.runtime.sidecar_client import SidecarClient
from impala_operator.settings import Settings
from impala_trainer.sidecar.app import create_app
from impala_trainer.sidecar.settings import Settings as SidecarSettings

T0 = 1_700_000_000.0


def _pod(attempt: int, phase: str, *, ready: bool = False, exit_code: int | None = None) -> dict:
    state: dict[str, Any] = {"running": {"startedAt": rfc3339(T0)}}
    if exit_code is not None:
        state = {
            "terminated": {"exitCode": exit_code, "reason": "Error", "finishedAt": rfc3339(T0 + 5)}
        }
    return {
        "metadata": {
            "name": f"cp-learner-{attempt}",
            "labels": {"impala.dev/restart": str(attempt)},
        },
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {"name": "status", "state": {"running": {}}},
                {"name": "learner", "state": state, "restartCount": 0},
            ],
        },
    }


def _snapshot(**kw: Any) -> StatusSnapshot:
    base: dict[str, Any] = {
        "job": "cp",
        "phase": "Running",
        "updated_at": T0,
        "counters": Counters(num_env_steps_sampled=12_000, episodes=300, policy_version=24),
        "episode_return_mean": 87.5,
        "throughput": Throughput(env_steps_per_s=650.25),
        "learner_queue": LearnerQueue(capacity=16, fill=0.0625, learner_idle_fraction=0.8),
    }
    base.update(kw)
    return StatusSnapshot(**base)


def test_learner_pod_view_reads_the_learner_container() -> None:
    view = learner_pod_view(_pod(2, "Running", ready=True))
    assert (view.name, view.attempt, view.phase, view.ready) == ("cp-learner-2", 2, "Running", True)
    assert view.exit_code is None and not view.failed and not view.succeeded
    failed = learner_pod_view(_pod(0, "Failed", exit_code=137))
    assert failed.failed and failed.exit_code == 137 and failed.finished_at == T0 + 5
    assert learner_pod_view({"metadata": {"name": "x"}}).phase == "Pending"
    deleting = _pod(0, "Running")
    deleting["metadata"]["deletionTimestamp"] = rfc3339(T0)
    assert learner_pod_view(deleting).deleting and not learner_pod_view(deleting).retired
    deleting["metadata"]["annotations"] = {RETIRED_ANNOTATION: "1"}  # the operator's delete
    assert learner_pod_view(deleting).retired
    pending = _pod(0, "Pending")
    pending["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 Insufficient cpu."}
    ]  # fmt: skip
    assert learner_pod_view(pending).unschedulable == "0/1 nodes are available: 1 Insufficient cpu."
    assert learner_pod_view(_pod(0, "Running")).unschedulable == ""


def test_deployment_view() -> None:
    d = deployment_view(
        {
            "metadata": {"name": "cp-rollout", "annotations": {REQUESTED_ANNOTATION: "3"}},
            "spec": {"replicas": 3},
            "status": {"readyReplicas": 2, "replicas": 2, "terminatingReplicas": 1},
        }
    )
    assert (d.name, d.replicas, d.ready, d.requested) == ("cp-rollout", 3, 2, "3")
    assert (d.observed, d.terminating) == (2, 1)
    bare = deployment_view({"metadata": {"name": "n"}, "spec": {"replicas": 0}, "status": {}})
    assert (bare.replicas, bare.ready, bare.requested) == (0, 0, None)
    assert (bare.observed, bare.terminating) == (0, 0)  # a cluster before 1.35: no field


def test_sidecar_url_default_and_annotation() -> None:
    assert sidecar_url("cp", "ns", {}) == "http://cp-status.ns.svc:8080/status"
    url = "http://127.0.0.1:9/status"
    assert sidecar_url("cp", "ns", {"impala.dev/status-url": url}) == url


def test_metric_sample_availability() -> None:
    snap = _snapshot()
    s = metric_sample(snap, T0 + 5, stale_after=30)
    assert s.available and s.queue_fill == 0.0625 and s.idle_fraction == 0.8
    assert s.env_steps_per_s == 650.25 and s.time == T0 + 5
    assert not metric_sample(None, T0, 30).available
    assert not metric_sample(snap, T0 + 31, 30).available  # stale snapshot
    assert not metric_sample(_snapshot(phase="Starting"), T0, 30).available


def _compute(**kw: Any) -> dict:
    args: dict[str, Any] = {
        "name": "cp",
        "namespace": "ns",
        "state": JobState(
            phase="Running",
            restarts=1,
            start_time=T0,
            conditions=set_condition((), "Running", True, "Running", "learner running", T0),
        ),
        "learner_pods": [
            learner_pod_view(_pod(0, "Failed", exit_code=1)),
            learner_pod_view(_pod(1, "Running", ready=True)),
        ],
        "rollouts": deployment_view(
            {
                "metadata": {"name": "cp-rollout"},
                "spec": {"replicas": 3},
                "status": {"replicas": 3, "readyReplicas": 2},
            }
        ),
        "aggregators": None,
        "desired_rollouts": 3,
        "desired_aggregators": 0,
        "snapshot": _snapshot(),
        "previous": {"observedGeneration": 3},
        "last_scale_time": T0 + 60,
    }
    args.update(kw)
    return compute_status(**args)


def test_compute_status_fields() -> None:
    st = _compute()
    # observedGeneration is the apply handler's to write; each condition carries the applied
    # generation, in metav1.Condition's full shape.
    assert st["phase"] == "Running" and "observedGeneration" not in st
    assert st["conditions"] == [
        {
            "type": "Running",
            "status": "True",
            "reason": "Running",
            "message": "learner running",
            "lastTransitionTime": rfc3339(T0),
            "observedGeneration": 3,
        }
    ]
    assert st["learner"] == {
        "ready": True,
        "replicas": 1,
        "readyReplicas": 1,
        "summary": "1/1",
        "restarts": 1,
        "failures": 0,
        "disruptions": 0,
        "podName": "cp-learner-1",
        "lastExitCode": 1,
    }
    assert st["rollouts"] == {
        "desired": 3,
        "replicas": 3,
        "ready": 2,
        "selector": "app.kubernetes.io/component=rollout,app.kubernetes.io/instance=cp,"
        "app.kubernetes.io/name=impalajob",
        "summary": "2/3",
    }
    assert st["aggregators"]["summary"] == "0/0"
    assert st["progress"] == {
        "timesteps": 12_000,
        "episodes": 300,
        "episodeReturnMean": 87.5,
        "returnMean": 87.5,
        "returnSource": "training",
        "stopProgress": 0.0,
        "envStepsPerSecond": 650.25,
        "learnerQueueFill": 0.0625,
        "policyVersion": 24,
        "updatedAt": rfc3339(T0),
    }
    assert st["startTime"] == rfc3339(T0) and st["completionTime"] is None
    assert st["lastScaleTime"] == rfc3339(T0 + 60)
    assert st["statusURL"] == "http://cp-status.ns.svc:8080/status"


def test_status_fits_the_crd_schema() -> None:
    # The API server prunes unknown status fields: every key written must be in the schema.
    def check(value: Any, schema: dict, path: str) -> None:
        if isinstance(value, dict) and "properties" in schema:
            for k, v in value.items():
                assert k in schema["properties"], f"{path}.{k} is not in the CRD status schema"
                check(v, schema["properties"][k], f"{path}.{k}")
        elif isinstance(value, list) and "items" in schema:
            for item in value:
                check(item, schema["items"], path + "[]")

    conds = set_condition((), "Running", True, "Running", "ok", T0)
    st = _compute(state=JobState(phase="Running", start_time=T0, conditions=conds))
    check(st, status_schema(), "status")
    check(invalid_spec_status("spec.x: bad", 1, st, T0), status_schema(), "status")
    # Every condition written has metav1.Condition's required fields.
    required = status_schema()["properties"]["conditions"]["items"]["required"]
    for cond in [*st["conditions"], *invalid_spec_status("x", 1, st, T0)["conditions"]]:
        assert set(required) <= set(cond), cond
    assert st["phase"] in status_schema()["properties"]["phase"]["enum"]


def test_a_multi_agent_jobs_progress_is_per_policy_and_fits_the_schema() -> None:
    snap = _snapshot(
        policies={
            "main": PolicyStatus(episode_return_mean=0.4, episodes=900, self_play_score=0.7),
            "fixed": PolicyStatus(episode_return_mean=-0.4, episodes=900),
        },
        evaluation=EvaluationInfo(evaluations=1, episode_return_mean=0.9, opponent="random",
                                  policy="main", wins=95, draws=0, losses=5, win_rate=0.95),
        stop=StopProgress(criteria={"episodeReturnMean": 0.8}, progress=0.5, policy="main"),
    )  # fmt: skip
    progress = _compute(snapshot=snap)["progress"]
    assert progress["policies"] == {
        "main": {"episodeReturnMean": 0.4, "episodes": 900, "selfPlayScore": 0.7},
        "fixed": {"episodeReturnMean": -0.4, "episodes": 900},
    }
    assert progress["evaluationWinRate"] == 0.95 and progress["stopProgress"] == 0.5
    schema = status_schema()["properties"]["progress"]
    assert set(progress) <= set(schema["properties"])
    per_policy = schema["properties"]["policies"]["additionalProperties"]["properties"]
    assert set(progress["policies"]["main"]) <= set(per_policy)


def test_the_return_column_shows_what_the_trend_follows() -> None:
    """A self-play job's training return is a zero-sum game's (0.0 all run long): RETURN and
    status.progress.returnMean show its evaluation against the fixed opponent instead, and
    bestEpisodeReturnMean (the trend's best, then an evaluation's) is not claimed for it."""
    evaluation = EvaluationInfo(evaluations=3, episodes=100, episode_return_mean=0.86,
                                best_return_mean=0.9, opponent="random", win_rate=0.9)  # fmt: skip
    followed = ReturnTrend(source="evaluation", first_return_mean=0.5, best_return_mean=0.9)
    snap = _snapshot(episode_return_mean=0.0, evaluation=evaluation, return_trend=followed)
    progress = _compute(snapshot=snap)["progress"]
    assert (progress["returnMean"], progress["returnSource"]) == (0.86, "evaluation")
    assert progress["episodeReturnMean"] == 0.0 and "bestEpisodeReturnMean" not in progress
    assert progress["bestEvaluationReturnMean"] == 0.9
    before = _snapshot(episode_return_mean=0.0, return_trend=ReturnTrend(source="evaluation"))
    assert _compute(snapshot=before)["progress"]["returnMean"] is None
    trained = _compute(snapshot=_snapshot(return_trend=ReturnTrend(best_return_mean=90.0)))
    assert trained["progress"]["returnMean"] == 87.5
    assert trained["progress"]["bestEpisodeReturnMean"] == 90.0
    printed = build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    columns = {c["name"]: c["jsonPath"] for c in printed}
    assert columns["Return"] == ".status.progress.returnMean"


def test_percent_done_and_time_left_come_where_the_criteria_let_them_be_known() -> None:
    """As Kubeflow Trainer's TrainJob progress: percent and time left, in the status and the
    printer columns, for the steps and time criteria; nothing for a return criterion alone, and
    no time left once the run has ended."""
    stop = StopProgress(criteria={"timesteps": 40_000}, progress=0.3, foreseeable=0.3,
                        remaining_seconds=200.4)  # fmt: skip
    progress = _compute(snapshot=_snapshot(stop=stop))["progress"]
    assert (progress["percentComplete"], progress["remainingSeconds"]) == (30, 200)
    assert progress["eta"] == "3m20s"
    assert {"percentComplete", "remainingSeconds", "eta"} <= set(
        status_schema()["properties"]["progress"]["properties"]
    )
    ended = _compute(snapshot=_snapshot(phase="Succeeded", stop=stop))["progress"]
    assert ended["percentComplete"] == 30 and "eta" not in ended and "remainingSeconds" not in ended
    by_return = StopProgress(criteria={"episodeReturnMean": 450}, progress=0.5)
    alone = _compute(snapshot=_snapshot(stop=by_return))["progress"]
    assert not {"percentComplete", "remainingSeconds", "eta"} & set(alone)


def test_an_ended_job_has_no_time_left_in_its_status_or_its_patch() -> None:
    """A job that ends is no longer read from its sidecar (its pods go): the progress kept from
    the last Running tick loses its time left, and the merge patch deletes the keys the API
    server holds (a key left out of a merge patch's object would stay: `kubectl get ij`
    showed ETA 1s on a finished job)."""
    stop = StopProgress(criteria={"timesteps": 40_000}, progress=0.99, foreseeable=0.99,
                        remaining_seconds=1.2)  # fmt: skip
    running = _compute(snapshot=_snapshot(stop=stop))
    assert running["progress"]["eta"] == "1s"
    done = JobState(phase="Succeeded", restarts=1, start_time=T0, completion_time=T0 + 60)
    ended = _compute(state=done, snapshot=None, previous=running)
    assert ended["progress"]["percentComplete"] == 99
    assert not {"eta", "remainingSeconds"} & set(ended["progress"])
    patch = status_patch(running, ended)
    assert patch["progress"]["eta"] is None and patch["progress"]["remainingSeconds"] is None
    assert patch["progress"]["percentComplete"] == 99
    suspended = JobState(phase="Suspended", restarts=1, start_time=T0)
    assert "eta" not in _compute(state=suspended, snapshot=_snapshot(stop=stop))["progress"]


def test_progress_is_kept_while_the_sidecar_is_away() -> None:
    first = _compute()
    again = _compute(snapshot=None, previous=first)
    assert again["progress"] == first["progress"]
    assert "progress" not in _compute(snapshot=None, previous={})


def test_job_state_round_trip() -> None:
    conds = set_condition((), "Failed", True, "DeadlineExceeded", "too long", T0)
    state = JobState(
        phase="Failed",
        reason="DeadlineExceeded",
        message="too long",
        restarts=2,
        start_time=T0,
        completion_time=T0 + 9,
        conditions=conds,
    )
    st = _compute(state=state)
    back = job_state(st)
    # The conditions come back stamped with the applied generation (3 in _compute's status).
    assert back == replace(state, conditions=tuple(stamp_conditions(conds, 3)))
    assert job_state({}).phase is None and job_state({}).restarts == 0


def test_status_patch_has_only_changes() -> None:
    old = _compute()
    assert status_patch(old, _compute()) == {}
    new = _compute(desired_rollouts=4)
    assert status_patch(old, new) == {"rollouts": new["rollouts"]}
    assert status_patch({}, {"completionTime": None}) == {}


def test_settings_from_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv("IMPALA_OPERATOR_NAMESPACES", "a, b")
    monkeypatch.setenv("IMPALA_OPERATOR_RECONCILE_INTERVAL", "1.5")
    s = Settings()
    assert s.namespaces == ["a", "b"] and s.reconcile_interval == 1.5


def test_sidecar_client_reads_the_real_sidecar(tmp_path: Path) -> None:
    write_json_atomic(tmp_path / STATUS_FILE, _snapshot(updated_at=T0 + 1))
    app = create_app(SidecarSettings(run_dir=tmp_path))

    async def go() -> tuple[StatusSnapshot | None, StatusSnapshot | None]:
        client = SidecarClient(timeout=2.0, transport=httpx.ASGITransport(app=app))
        try:
            good = await client.fetch_status("http://sidecar/status")
            missing = await client.fetch_status("http://sidecar/nothing-here")
        finally:
            await client.aclose()
        return good, missing

    good, missing = asyncio.run(go())
    assert good is not None and good.counters.num_env_steps_sampled == 12_000
    assert good.learner_queue.learner_idle_fraction == 0.8 and missing is None


def test_sidecar_client_unreachable_is_none() -> None:
    async def go() -> StatusSnapshot | None:
        client = SidecarClient(timeout=0.5)
        try:
            return await client.fetch_status("http://127.0.0.1:9/status")
        finally:
            await client.aclose()

    assert asyncio.run(go()) is None


@pytest.mark.parametrize(
    ("pod_status", "exit_code", "expected"),
    [
        ({"conditions": [{"type": "DisruptionTarget", "status": "True",
                          "reason": "EvictionByEvictionAPI"}]}, 143,
         "DisruptionTarget: EvictionByEvictionAPI"),
        ({"conditions": [{"type": "DisruptionTarget", "status": "True",
                          "reason": "TerminationByKubelet"}], "reason": "Evicted"}, None,
         "DisruptionTarget: TerminationByKubelet"),
        ({"reason": "Shutdown", "phase": "Failed"}, None, "Shutdown"),
        ({}, 143, "exit code 143 after SIGTERM"),
        ({}, 130, "exit code 130 after SIGTERM"),
        ({}, 1, ""),  # a crash is a failure
        ({}, 137, ""),  # OOM: the container's own doing
        ({"conditions": [{"type": "DisruptionTarget", "status": "False"}]}, 2, ""),
    ],
)
def test_disruption_is_read_from_the_pod(
    pod_status: dict[str, Any], exit_code: int | None, expected: str
) -> None:
    assert disruption(pod_status, exit_code) == expected


def test_a_status_from_before_disruptions_counts_every_restart_as_a_failure() -> None:
    assert job_state({"phase": "Running", "learner": {"restarts": 2}}).failures == 2
    state = job_state({"learner": {"restarts": 3, "failures": 1, "disruptions": 2}})
    assert (state.restarts, state.failures, state.disruptions) == (3, 1, 2)


def test_a_return_fallen_from_its_best_is_a_condition_and_one_warning() -> None:
    fell = ReturnTrend(first_return_mean=-56.0, best_return_mean=-9.5, best_env_steps=76_000,
                       below_since_env_steps=100_000, below_since_episodes=2_000, regressed=True,
                       message="the training return -152 has given back ...")  # fmt: skip
    status: dict[str, Any] = {"conditions": []}
    assert return_regressed(status, None, 0.0, 3) is None and status["conditions"] == []
    event = return_regressed(status, _snapshot(return_trend=fell), 10.0, 3)
    assert event is not None and (event.type, event.reason) == ("Warning", "ReturnRegressed")
    (cond,) = status["conditions"]
    assert (cond["status"], cond["reason"], cond["observedGeneration"]) == (
        "True", "ReturnFellFromBest", 3
    )
    assert cond["message"] == fell.message
    assert return_regressed(status, _snapshot(return_trend=fell), 20.0) is None  # said once
    held = fell.model_copy(update={"regressed": False, "message": None})
    assert return_regressed(status, _snapshot(return_trend=held), 30.0) is None
    assert [(c["status"], c["reason"]) for c in status["conditions"]] == [("False", "ReturnHolds")]
    # Before a full window of episodes the trend has nothing to say.
    assert return_regressed(status, _snapshot(), 40.0) is None
    assert status["conditions"][0]["lastTransitionTime"] == rfc3339(30.0)
