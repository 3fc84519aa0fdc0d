"""The kopf handlers, called as kopf calls them (keyword arguments, a memo, the indexes), against
an in-memory Api that records every write: what a job's create/update and its timer ticks write."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterable
from typing import Any

import kopf
import pytest

from impala_api import names
from impala_api.manifest import ManifestError
from impala_api.snapshot import Counters, LearnerQueue, StatusSnapshot, Throughput
from impala_operator.build.tokens import job_tokens
from impala_operator.lifecycle import job_status, plan
from impala_operator.lifecycle.conditions import rfc3339
from impala_operator.lifecycle.run_policy import Event, LearnerPod
from impala_operator.runtime import handlers, metrics
from impala_operator.runtime.kube import ApiError
from impala_operator.scale.autoscaler import MetricSample
from impala_operator.settings import Settings
from tests.support.plans import SETTINGS, SPEC, UID

SIDECAR = "http://127.0.0.1:18080/status"
RUNNING = LearnerPod(name="cp-learner-0", attempt=0, phase="Running", ready=True)


class FakeApi:
    """`kube.Api` in memory: records each write as ("verb", "Kind/name" or event reason)."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.written: dict[str, dict[str, Any]] = {}
        self.events: list[Event] = []
        self.fail_on = fail_on

    def _record(self, verb: str, what: str) -> None:
        if verb == self.fail_on:
            raise ApiError(500, "InternalError", f"{verb} {what} failed")
        self.calls.append((verb, what))

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        key = f"{manifest['kind']}/{manifest['metadata']['name']}"
        self._record("apply", key)
        self.written[key] = manifest
        return manifest

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        key = f"{manifest['kind']}/{manifest['metadata']['name']}"
        self._record("create", key)
        self.written[key] = manifest
        return manifest

    async def annotate(
        self, api_version: str, kind: str, namespace: str, name: str, annotations: dict[str, str]
    ) -> bool:
        assert namespace == "ns"
        self._record("annotate", f"{kind}/{name}")
        return True

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        assert namespace == "ns"
        self._record("delete", f"{kind}/{name}")
        return True

    async def post_event(self, job: dict[str, Any], event: Event, now: float) -> None:
        assert job["metadata"]["uid"] == UID
        self._record("event", event.reason)
        self.events.append(event)


class FakeSidecar:
    """`SidecarClient` returning a fixed snapshot; remembers the URLs it was asked for."""

    def __init__(self, snapshot: StatusSnapshot | None = None) -> None:
        self.snapshot = snapshot
        self.urls: list[str] = []
        self.tokens: list[str | None] = []

    async def fetch_status(self, url: str, token: str | None = None) -> StatusSnapshot | None:
        self.urls.append(url)
        self.tokens.append(token)
        return self.snapshot


KEY = b"operator-key"


def _memo(api: FakeApi, sidecar: FakeSidecar | None = None, **extra: Any) -> kopf.Memo:
    return kopf.Memo(
        settings=SETTINGS,
        api=api,
        sidecar=sidecar or FakeSidecar(),
        token_key=KEY,
        operator_namespace="impala-system",
        **extra,
    )


def _body(spec: dict[str, Any] | None = None, **status: Any) -> kopf.Body:
    return kopf.Body(
        {
            "apiVersion": "impala.dev/v1alpha1",
            "kind": "ImpalaJob",
            "metadata": {
                "name": "cp",
                "namespace": "ns",
                "uid": UID,
                "generation": 3,
                "annotations": {names.STATUS_URL_ANNOTATION: SIDECAR},
            },
            "spec": SPEC if spec is None else spec,
            "status": status,
        }
    )


def _view(replicas: int, requested: str = "") -> job_status.DeploymentView:
    return job_status.DeploymentView("x", replicas, replicas, requested)


def _tick(
    body: kopf.Body,
    memo: kopf.Memo,
    pods: Iterable[LearnerPod] = (),
    deployments: Iterable[tuple[str, job_status.DeploymentView]] = (),
    patch: kopf.Patch | None = None,
    workloads: Iterable[dict[str, Any]] = (),
) -> dict[str, Any]:
    """Run one timer tick; the status patch it leaves for kopf to write (in `patch` if given)."""
    patch = kopf.Patch() if patch is None else patch
    asyncio.run(
        handlers.tick(
            body=body,
            uid=UID,
            meta=body.meta,
            status=body.status,
            patch=patch,
            memo=memo,
            learner_pods={UID: list(pods)},
            node_deployments={UID: list(deployments)},
            workloads={UID: list(workloads)},
        )
    )
    return dict(patch.get("status", {}))


def _apply_children(
    body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch | None = None
) -> dict[str, Any]:
    """Run the create/update handler; the status patch it leaves for kopf to write (in `patch`
    if given)."""
    patch = kopf.Patch() if patch is None else patch
    asyncio.run(
        handlers.apply_children(
            body=body,
            uid=UID,
            meta=body.meta,
            patch=patch,
            memo=memo,
        )
    )
    return dict(patch.get("status", {}))


def _snapshot(fill: float, idle: float) -> StatusSnapshot:
    return StatusSnapshot(
        job="cp",
        phase="Running",
        updated_at=time.time(),
        counters=Counters(num_env_steps_sampled=12_000, episodes=300, policy_version=24),
        episode_return_mean=87.5,
        throughput=Throughput(env_steps_per_s=650.0),
        learner_queue=LearnerQueue(capacity=16, fill=fill, learner_idle_fraction=idle),
    )


def _errors(kind: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "impala_operator_reconcile_errors_total", {"kind": kind}
    )
    return value or 0.0


# --- apply_children (create/update/resume) ---


def test_apply_children_applies_the_spec_children_of_a_new_job() -> None:
    api = FakeApi()
    assert _apply_children(_body(), _memo(api)) == {"observedGeneration": 3}
    # The auth Secret first: the pods mount it.
    assert api.calls[0] == ("apply", "Secret/cp-auth")
    assert sorted(api.calls) == [
        ("apply", "ConfigMap/cp-config"),
        ("apply", "NetworkPolicy/cp-network"),
        ("apply", "PodDisruptionBudget/cp-learner"),
        ("apply", "Secret/cp-auth"),
        ("apply", "Service/cp-learner"),
        ("apply", "Service/cp-status"),
        ("event", "ResultsNotDurable"),  # no claim, no storageUri
    ]  # no learner pod and no Deployment: the timer makes them
    secret = api.written["Secret/cp-auth"]["data"]
    assert base64.b64decode(secret["status-token"]).decode() == job_tokens(KEY, UID).status
    for manifest in api.written.values():
        assert manifest["metadata"]["ownerReferences"][0]["uid"] == UID


def test_the_timer_creates_the_deployments_of_a_new_job() -> None:
    api = FakeApi()
    _tick(_body(), _memo(api))
    assert api.written["Deployment/cp-rollout"]["spec"]["replicas"] == 1  # minReplicas
    # One for the rollout pod's 2 workers (rollout_workers_per_aggregator 2), from the start.
    assert api.written["Deployment/cp-aggregator"]["spec"]["replicas"] == 1
    assert api.written["Deployment/cp-rollout"]["metadata"]["ownerReferences"][0]["uid"] == UID


def test_apply_children_rejects_an_invalid_spec_with_an_event() -> None:
    api = FakeApi()
    bad = {"rollouts": {"minReplicas": 5, "maxReplicas": 2}}
    with pytest.raises(kopf.PermanentError, match="invalid spec"):
        _apply_children(_body(bad), _memo(api))
    assert api.calls == [("event", "InvalidSpec")]  # and nothing applied
    assert api.events[0].type == "Warning" and "minReplicas" in api.events[0].message


def test_apply_children_retries_when_the_api_fails() -> None:
    before = _errors("children")
    body, patch = _body(), kopf.Patch()
    with pytest.raises(kopf.TemporaryError, match="applying children"):
        _apply_children(body, _memo(FakeApi(fail_on="apply")), patch=patch)
    assert _errors("children") == before + 1
    # A generation whose children could not be applied is not reported as observed.
    assert "observedGeneration" not in patch.get("status", {})


# --- tick (the timer) ---


def test_first_tick_creates_the_learner_and_reports_pending() -> None:
    api, sidecar = FakeApi(), FakeSidecar()
    memo = _memo(api, sidecar)
    status = _tick(_body(), memo)
    # First sight: the tick creates the learner pod, then the Deployments.
    assert api.calls == [
        ("create", "Pod/cp-learner-0"),
        ("apply", "Deployment/cp-rollout"),
        ("apply", "Deployment/cp-aggregator"),
        ("event", "Created"),
    ]
    pod = api.written["Pod/cp-learner-0"]
    assert job_status.SPEC_HASH_ANNOTATION in pod["metadata"]["annotations"]
    # observedGeneration means "applied": only the handler that applied the children writes it.
    assert status["phase"] == "Pending" and "observedGeneration" not in status
    assert sidecar.urls == [SIDECAR]  # the status-url annotation overrides the Service
    assert sidecar.tokens == [job_tokens(KEY, UID).status]  # the job's token, derived
    assert [s.available for s in memo.samples] == [False]  # no snapshot: metrics unavailable


def test_tick_with_converged_children_writes_nothing() -> None:
    api = FakeApi()
    memo = _memo(api)
    first = _tick(_body(), memo, deployments=[("rollout", _view(1)), ("aggregator", _view(1))])
    api.calls.clear()
    status = _tick(
        _body(**first),
        memo,
        pods=[RUNNING],
        deployments=[("rollout", _view(1)), ("aggregator", _view(1))],
    )
    assert api.calls == [("event", "Running")]
    assert status["phase"] == "Running" and "rollouts" not in status  # the patch: changes only
    assert first["rollouts"]["summary"] == "1/1"
    api.calls.clear()
    again = _tick(
        _body(**{**first, **status}),
        memo,
        pods=[RUNNING],
        deployments=[("rollout", _view(1)), ("aggregator", _view(1))],
    )
    assert api.calls == [] and again == {}  # nothing changed: no writes, an empty patch


def test_starved_learner_over_the_window_scales_up() -> None:
    api, now = FakeApi(), time.time()
    history = [
        MetricSample(time=now - 20_000, available=False),  # beyond any window: dropped
        *(
            MetricSample(time=now - age, available=True, queue_fill=0.0, idle_fraction=0.9)
            for age in (15, 10, 5)
        ),
    ]
    sidecar = FakeSidecar(_snapshot(fill=0.0, idle=0.9))
    memo = _memo(api, sidecar, samples=history)
    status = _tick(
        _body(phase="Running", startTime=rfc3339(now - 60)),
        memo,
        pods=[RUNNING],
        deployments=[("rollout", _view(1)), ("aggregator", _view(1))],
    )
    assert api.calls == [
        ("apply", "Deployment/cp-rollout"),
        ("apply", "Deployment/cp-aggregator"),
        ("event", "LearnerStarved"),
        ("event", "AggregatorsScaled"),
    ]
    assert api.written["Deployment/cp-rollout"]["spec"]["replicas"] == 2
    assert api.written["Deployment/cp-aggregator"]["spec"]["replicas"] == 2  # 2 pods x 2 / 2
    assert status["rollouts"]["desired"] == 2 and status["lastScaleTime"]
    assert status["progress"]["timesteps"] == 12_000
    assert len(memo.samples) == 4 and all(s.available for s in memo.samples)


def test_finished_job_is_deleted_after_its_ttl_without_reading_the_sidecar() -> None:
    api, sidecar = FakeApi(), FakeSidecar()
    spec = {**SPEC, "runPolicy": {"ttlSecondsAfterFinished": 5}}
    done = rfc3339(time.time() - 60)
    body = _body(spec, phase="Succeeded", startTime=done, completionTime=done)
    _tick(body, _memo(api, sidecar), deployments=[("rollout", _view(0)), ("aggregator", _view(0))])
    assert api.calls == [("event", "TTLExpired"), ("delete", "ImpalaJob/cp")]
    assert sidecar.urls == []  # a finished job has no metrics to read


def test_tick_marks_an_invalid_spec_failed_without_writing_children() -> None:
    api, sidecar = FakeApi(), FakeSidecar()
    status = _tick(_body({"rollouts": {"minReplicas": 5, "maxReplicas": 2}}), _memo(api, sidecar))
    assert api.calls == [] and sidecar.urls == []
    assert status["phase"] == "Failed" and "minReplicas" in status["message"]
    assert status["conditions"][0]["reason"] == "InvalidSpec"


def test_tick_failing_api_is_retried_and_patches_no_status() -> None:
    before = _errors("tick")
    patch = kopf.Patch()
    with pytest.raises(kopf.TemporaryError) as err:
        _tick(_body(), _memo(FakeApi(fail_on="create")), patch=patch)
    assert err.value.delay == SETTINGS.reconcile_interval
    assert "status" not in patch and _errors("tick") == before + 1


class RefusingApi(FakeApi):
    """The API server refusing the learner pod, as it does a pod whose ServiceAccount is
    missing (403), until `refusing` is cleared."""

    refusing = True

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        if self.refusing and manifest["kind"] == "Pod":
            name = manifest["metadata"]["name"]
            why = 'error looking up service account ns/robot: serviceaccount "robot" not found'
            raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: {why}')
        return await super().create(manifest)


def test_a_refused_learner_pod_shows_on_the_job_and_fails_it_at_the_startup_deadline() -> None:
    api = RefusingApi()
    spec = {**SPEC, "runPolicy": {"startupDeadlineSeconds": 600}}
    first = _tick(_body(spec), _memo(api))  # no exception: the status is written
    created = next(c for c in first["conditions"] if c["type"] == "Created")
    assert (created["status"], created["reason"]) == ("False", "LearnerPodRefused")
    assert 'serviceaccount "robot" not found' in first["message"]
    assert "spec.learner.pod" in first["message"] and first["phase"] == "Pending"
    warnings = [e for e in api.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["LearnerPodRefused"]

    again = _tick(_body(spec, **first), _memo(api))  # asked again; announced once
    assert [e.reason for e in api.events if e.type == "Warning"] == ["LearnerPodRefused"]
    assert again.get("phase", first["phase"]) == "Pending"
    # No worker pods are held for a learner that cannot be made: both groups at 0.
    workers = {k: m["spec"]["replicas"] for k, m in api.written.items() if "Deployment/" in k}
    assert workers == {"Deployment/cp-rollout": 0, "Deployment/cp-aggregator": 0}, workers

    late = {**first, "startTime": "2020-01-01T00:00:00Z"}  # the deadline has passed
    failed = _tick(_body(spec, **late), _memo(api))
    assert failed["phase"] == "Failed" and "startupDeadlineSeconds" in failed["message"]

    api.refusing = False  # the ServiceAccount was made: the pod is created, Created again
    fixed = _tick(_body(spec, **first), _memo(api))
    created = next(c for c in fixed["conditions"] if c["type"] == "Created")
    assert (created["status"], created["reason"]) == ("True", "Created")
    assert ("create", "Pod/cp-learner-0") in api.calls


# --- execute, indexes, phase gauge, registration ---


def test_execute_writes_a_plan_in_order() -> None:
    api = FakeApi()
    tick_plan = plan.TickPlan(
        status={},
        apply=[{"kind": "Deployment", "metadata": {"name": "cp-rollout"}}],
        create=[{"kind": "Pod", "metadata": {"name": "cp-learner-1"}}],
        delete_pods=["cp-learner-0"],
        delete_job=True,
        events=[Event("Normal", "Restarting", "attempt 1")],
    )
    asyncio.run(handlers.execute(api, _body(), tick_plan, time.time()))
    assert api.calls == [
        ("create", "Pod/cp-learner-1"),  # the learner first: the others join its Ray head
        ("apply", "Deployment/cp-rollout"),
        ("annotate", "Pod/cp-learner-0"),  # marked as the operator's delete, then deleted
        ("delete", "Pod/cp-learner-0"),
        ("event", "Restarting"),
        ("delete", "ImpalaJob/cp"),
    ]


def _owned(kind: str = "ImpalaJob", controller: bool = True) -> list[dict[str, Any]]:
    return [{"kind": kind, "uid": UID, "controller": controller, "name": "cp"}]


def test_indexes_key_children_by_their_controlling_job() -> None:
    pod = kopf.Body(
        {
            "metadata": {
                "name": "cp-learner-1",
                "labels": {"impala.dev/restart": "1"},
                "ownerReferences": _owned(),
            },
            "status": {"phase": "Running"},
        }
    )
    (view,) = handlers.index_learner_pod(body=pod, meta=pod.meta).values()
    assert (view.name, view.attempt, view.phase) == ("cp-learner-1", 1, "Running")
    stray = kopf.Body({"metadata": {"name": "p", "ownerReferences": _owned(controller=False)}})
    assert handlers.index_learner_pod(body=stray, meta=stray.meta) is None

    def deployment(component: str, owners: list[dict[str, Any]]) -> kopf.Body:
        labels = {"app.kubernetes.io/component": component}
        meta = {"name": f"cp-{component}", "labels": labels, "ownerReferences": owners}
        return kopf.Body({"metadata": meta, "spec": {"replicas": 3}, "status": {}})

    rollout = deployment("rollout", _owned())
    assert handlers.index_node_deployment(body=rollout, meta=rollout.meta) == {
        UID: ("rollout", job_status.DeploymentView("cp-rollout", 3, 0, None))
    }
    for other in (deployment("learner", _owned()), deployment("rollout", _owned("ReplicaSet"))):
        assert handlers.index_node_deployment(body=other, meta=other.meta) is None


def test_track_phase_counts_jobs_until_deleted() -> None:
    status = {"phase": "Failed"}
    handlers.track_phase(
        event={"type": "MODIFIED"}, uid="job-x", status=status, namespace="team-a", name="cp"
    )
    assert metrics.JOBS.phases["job-x"] == "Failed"
    families = {f.name: f for f in metrics.JOBS.collect()}
    samples = {(s.labels["namespace"], s.labels["job"], s.labels["phase"]): s.value
               for s in families["impala_operator_job_phase"].samples}  # fmt: skip
    assert samples[("team-a", "cp", "Failed")] == 1.0
    assert samples[("team-a", "cp", "Running")] == 0.0
    handlers.track_phase(event={"type": "DELETED"}, uid="job-x", status=status)
    assert "job-x" not in metrics.JOBS.phases
    assert not list(metrics.JOBS.collect())[1].samples


def test_register_attaches_every_handler_with_the_timer_interval() -> None:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, Settings(reconcile_interval=7.0))
    (timer,) = registry._spawning.get_all_handlers()
    assert (timer.id, timer.fn, timer.interval) == ("tick", handlers.tick, 7.0)
    changing = registry._changing.get_all_handlers()
    assert {h.fn for h in changing} == {handlers.apply_children} and len(changing) == 3
    indexes = {h.id: h.fn for h in registry._indexing.get_all_handlers()}
    assert indexes == {
        "learner_pods": handlers.index_learner_pod,
        "node_deployments": handlers.index_node_deployment,
        "workloads": handlers.index_workload,
    }


def test_parse_job_names_the_bad_field() -> None:
    body = {
        "apiVersion": "impala.dev/v1alpha1",
        "kind": "ImpalaJob",
        "metadata": {"name": "cp", "namespace": "ns", "uid": "u", "resourceVersion": "7"},
        "spec": {"rollouts": {"minReplicas": 5, "maxReplicas": 2}},
        "status": {"phase": "Running"},
    }
    with pytest.raises(ManifestError) as err:
        handlers.parse_job(body)
    assert any("spec.rollouts" in p and "minReplicas" in p for p in err.value.problems)
    body["spec"] = {"rollouts": {"minReplicas": 1, "maxReplicas": 2}, "stop": {"timesteps": 10}}
    assert handlers.parse_job(body).spec.rollouts.max_replicas == 2


class QueueApi(FakeApi):
    """FakeApi plus the reads a queued job's tick makes (`kube.Api.get`, `replace_status`)."""

    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self.objects = objects
        self.reads: list[str] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        self.reads.append(path)
        return self.objects.get(path)

    async def replace_status(self, manifest: dict[str, Any]) -> bool:
        self._record("status", f"{manifest['kind']}/{manifest['metadata']['name']}")
        return True


QUEUED = {"labels": {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "hi"}}
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
WORKLOAD_PATH = f"{KUEUE}/namespaces/ns/workloads/impalajob-cp"


def _queued_body(**status: Any) -> kopf.Body:
    body = _body(**status)
    body["metadata"].update(QUEUED)  # type: ignore[index]
    return body


def test_a_queued_job_on_a_cluster_without_kueue_waits_and_says_why() -> None:
    api = QueueApi({})
    status = _tick(_queued_body(phase="Pending"), _memo(api))
    assert [c for c in api.calls if c[0] == "create"] == []  # no Workload, no learner pod
    cond = next(c for c in status["conditions"] if c["type"] == "Admitted")
    assert (
        "serves no kueue.x-k8s.io/v1beta2 Workloads: install Kueue or remove the label"
        in (cond["message"])
    )
    assert not any(w.startswith("Pod/") for w in api.written)


def test_a_queued_job_gets_its_workload_with_the_classes_priority() -> None:
    api = QueueApi({KUEUE: {}, f"{KUEUE}/workloadpriorityclasses/hi": {"value": 1000}})
    _tick(_queued_body(phase="Pending"), _memo(api))
    workload = api.written["Workload/impalajob-cp"]
    assert workload["spec"]["priority"] == 1000
    assert workload["spec"]["queueName"] == "team-a"
    assert not any(w.startswith("Pod/") for w in api.written)  # nothing runs before admission


ADMITTED_WORKLOAD = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "Workload",
    "metadata": {"name": "impalajob-cp", "namespace": "ns"},
    "spec": {"podSets": [{"name": "learner", "count": 1}]},
    "status": {
        "conditions": [{"type": "Admitted", "status": "True"}],
        "admission": {
            "clusterQueue": "cq",
            "podSetAssignments": [{"name": "learner", "count": 1, "flavors": {"cpu": "a"}}],
        },
    },
}


def test_an_admitted_job_reads_its_flavors_once() -> None:
    flavor = {"spec": {"nodeLabels": {"pool": "a"}}}
    api = QueueApi({WORKLOAD_PATH: ADMITTED_WORKLOAD, f"{KUEUE}/resourceflavors/a": flavor})
    memo = _memo(api)
    _tick(_queued_body(phase="Pending"), memo)
    _tick(_queued_body(phase="Pending"), memo)
    assert api.reads.count(f"{KUEUE}/resourceflavors/a") == 1
    pod = api.written["Pod/cp-learner-0"]
    assert pod["spec"]["nodeSelector"]["pool"] == "a"


def test_an_indexed_workload_is_read_from_the_index_not_the_api() -> None:
    # The watch's copy serves every tick: no GET of the Workload (69 requests per job at 200
    # jobs were 37.5 such GETs). A Workload not yet in the index is read once from the API.
    flavor = {"spec": {"nodeLabels": {"pool": "a"}}}
    api = QueueApi({WORKLOAD_PATH: ADMITTED_WORKLOAD, f"{KUEUE}/resourceflavors/a": flavor})
    memo = _memo(api)
    _tick(_queued_body(phase="Pending"), memo)
    assert api.reads.count(WORKLOAD_PATH) == 1
    for _ in range(3):
        _tick(_queued_body(phase="Pending"), memo, workloads=[ADMITTED_WORKLOAD])
    assert api.reads.count(WORKLOAD_PATH) == 1
    assert api.written["Pod/cp-learner-0"]["spec"]["nodeSelector"]["pool"] == "a"
    # Another job's Workload under the same owner key (a name it no longer has) is not taken.
    other = {**ADMITTED_WORKLOAD, "metadata": {"name": "impalajob-old", "namespace": "ns"}}
    _tick(_queued_body(phase="Pending"), memo, workloads=[other])
    assert api.reads.count(WORKLOAD_PATH) == 2


def test_the_workload_index_keys_a_jobs_workload_by_its_uid() -> None:
    def workload(owners: list[dict[str, Any]]) -> kopf.Body:
        return kopf.Body(
            {**ADMITTED_WORKLOAD, "metadata": {"name": "w", "ownerReferences": owners}}
        )

    ours, foreign = workload(_owned()), workload(_owned("Job"))
    assert handlers.index_workload(body=ours, meta=ours.meta) == {UID: dict(ours)}
    assert handlers.index_workload(body=foreign, meta=foreign.meta) is None


def test_the_indexes_watch_only_our_objects_server_side() -> None:
    settings = kopf.OperatorSettings()
    memo = kopf.Memo(settings=Settings())

    async def start() -> None:
        await handlers.startup(settings=settings, memo=memo)
        await memo.sidecar.aclose()

    asyncio.run(start())
    selectors = settings.watching.label_selectors

    def of(group: str, version: str, plural: str) -> list[str]:
        return selectors.collect(kopf.Resource(group, version, plural, namespaced=True))

    managed = "app.kubernetes.io/managed-by=impala-operator"
    # Every learner pod: rank 0 and the ranks 1..N-1 of learner.replicas.
    learners = "app.kubernetes.io/component in (learner,learner-peer)"
    assert of("", "v1", "pods") == [f"{managed},{learners}"]
    assert of("apps", "v1", "deployments") == [managed]
    assert of("kueue.x-k8s.io", "v1beta2", "workloads") == ["app.kubernetes.io/name=impalajob"]
    assert of("impala.dev", "v1alpha1", "impalajobs") == []  # every user's job is ours
    assert of("metrics.k8s.io", "v1beta1", "pods") == []
