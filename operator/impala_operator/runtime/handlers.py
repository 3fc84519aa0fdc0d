"""kopf handlers: thin glue between kopf's events, the pure planners in `plan` and `kube.Api`.

Every handler is a module-level function of kopf's keyword arguments; what the process provides
comes from `memo`: `runner.serve` puts the `Settings` in `memo.settings` and a `kube.Api` in
`memo.api`, `startup` adds the `SidecarClient` as `memo.sidecar`. kopf gives every ImpalaJob its
own shallow copy of that memo, so `tick` keeps the job's metric history in it (`memo.samples`).
`register` attaches the handlers to a registry.

- `apply_children` (create/update/resume, edge-triggered): validate the spec, apply the children
  that follow it alone (the Secret, config, Services, NetworkPolicy, disruption budget).
- `tick` (a timer every `reconcile_interval` seconds, level-based): read the sidecar, plan the
  lifecycle, autoscaling and status from what exists now, `execute` the plan (the learner pods
  and the rollout and aggregator Deployments: their one writer), patch the status.
  A restarted operator converges from whatever state it finds, with no duplicates (fixed names,
  server-side apply).
- two indexes (`index_learner_pod`, `index_node_deployment`) keep the learner pods and node
  Deployments of every job in memory from kopf's watches, so a timer tick costs no list calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import kopf

from impala_api import names
from impala_api.manifest import ManifestError, parse_manifest
from impala_api.spec import API_GROUP, API_VERSION, KIND, PLURAL, ImpalaJob
from impala_operator.build import children, kueue_workload
from impala_operator.build.tokens import job_tokens
from impala_operator.lifecycle import admission, job_status, plan
from impala_operator.lifecycle.run_policy import Event
from impala_operator.runtime import kube, metrics
from impala_operator.runtime.sidecar_client import SidecarClient
from impala_operator.scale.autoscaler import MetricSample
from impala_operator.settings import Settings

RESOURCE = (API_GROUP, API_VERSION, PLURAL)
OURS = {names.MANAGED_BY_KEY: names.MANAGED_BY}
TERMINAL = ("Succeeded", "Failed")
log = logging.getLogger(__name__)


def parse_job(body: Mapping[str, Any]) -> ImpalaJob:
    """The ImpalaJob model of a live object; ManifestError names every bad field."""
    meta = body["metadata"]
    return parse_manifest(
        {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "labels": dict(meta.get("labels") or {}),
                "annotations": dict(meta.get("annotations") or {}),
            },
            "spec": dict(body.get("spec") or {}),
        },
        source=f"ImpalaJob {meta['namespace']}/{meta['name']}",
    )


def _owner(meta: Mapping[str, Any]) -> str | None:
    refs = meta.get("ownerReferences") or []
    return next((r["uid"] for r in refs if r.get("controller") and r.get("kind") == KIND), None)


def _deployment_views(
    index: Mapping[str, Any], uid: str
) -> dict[str, job_status.DeploymentView | None]:
    views: dict[str, job_status.DeploymentView | None] = {"rollout": None, "aggregator": None}
    for role, view in index.get(uid, []):
        views[role] = view
    return views


def _refused(exc: kube.ApiError) -> bool:
    """An answer that says the object itself cannot be made as it is (403 Forbidden: a missing
    ServiceAccount, a quota, a policy; 422 Invalid; 400), which retrying alone never fixes:
    not a conflict (409), throttling (429), or a transport or server error."""
    return 400 <= exc.status < 500 and exc.status not in (409, 429)


async def execute(
    api: kube.Api, body: Mapping[str, Any], tick_plan: plan.TickPlan, now: float
) -> list[tuple[str, str]]:
    """Perform a plan's writes; the pods the API server refused, (name, its answer). Every step
    is idempotent, so a crash halfway is repaired by the next tick: applies converge, creates of
    existing pods are no-ops, deletes of gone ones too."""
    meta = body["metadata"]
    namespace = meta["namespace"]
    refused: list[tuple[str, str]] = []
    # The learner pods first: the rollout and aggregator pods join the learner's Ray head.
    for manifest in tick_plan.create:
        try:
            await api.create(manifest)
        except kube.ApiError as exc:
            if not _refused(exc):
                raise
            refused.append((manifest["metadata"]["name"], str(exc)))
    for manifest in tick_plan.apply:
        await api.apply(manifest)
    for name in tick_plan.delete_pods:
        # Marked first, so that the run policy tells the operator's deletes from anyone else's.
        if await api.annotate("v1", "Pod", namespace, name, {job_status.RETIRED_ANNOTATION: "1"}):
            await api.delete("v1", "Pod", namespace, name)
    await _write_workload(api, tick_plan.workload)
    for event in tick_plan.events:
        await api.post_event(body, event, now)
    if tick_plan.delete_job:
        await api.delete(kube.JOB_API_VERSION, KIND, namespace, meta["name"])
    return refused


async def _write_workload(api: kube.Api, write: plan.WorkloadWrite | None) -> None:
    if write is None:
        return
    meta = write.body["metadata"]
    if write.action == "create":
        await api.create(write.body)
    elif write.action == "delete":
        await api.delete(
            kueue_workload.WORKLOAD_API_VERSION, "Workload", meta["namespace"], meta["name"]
        )
    else:
        await api.replace_status(write.body)


async def _priority(api: kube.Api, job: ImpalaJob) -> kueue_workload.Priority | str:
    """The priority a new Workload gets, or what stops it from being made."""
    wanted = kueue_workload.priority_class(job)
    if wanted is None:
        return ""
    name, kind = wanted
    workload_class = kind == "WorkloadPriorityClass"
    api_version = kueue_workload.WORKLOAD_API_VERSION if workload_class else "scheduling.k8s.io/v1"
    found = await api.get(kube.cluster_object_path(api_version, kind, name))
    if found is None:
        source = (
            f"label {kueue_workload.PRIORITY_LABEL}"
            if workload_class
            else "spec.learner.pod.priorityClassName"
        )
        return f"{kind} {name!r} (from {source}) does not exist: create it or change the {source}"
    return kueue_workload.Priority(name, int(found.get("value", 0)), kind)


async def _flavors(
    api: kube.Api, memo: kopf.Memo, workload: Mapping[str, Any]
) -> dict[str, Mapping[str, Any]]:
    """The ResourceFlavors an admission names, read once per admission (kept in the memo)."""
    wanted = admission.flavor_names(workload)
    cached: dict[str, Mapping[str, Any]] = getattr(memo, "flavors", {})
    if set(cached) != wanted:
        cached = {}
        for name in sorted(wanted):
            found = await api.get(
                kube.cluster_object_path(
                    kueue_workload.WORKLOAD_API_VERSION, "ResourceFlavor", name
                )
            )
            cached[name] = found or {}
        memo.flavors = cached
    return cached


async def read_queueing(
    api: kube.Api,
    memo: kopf.Memo,
    job: ImpalaJob,
    terminal: bool,
    indexed: Iterable[Mapping[str, Any]] = (),
) -> plan.Queueing:
    """What the tick needs of a queued job's Workload (`plan.Queueing`).

    The Workload comes from the `workloads` index (a watch, as jobframework's informer) when it
    is there, else from one GET: a Workload made moments ago may not have reached the index,
    and a namespaced operator started before Kueue was installed never watches them. A stale
    copy is safe: its status writes carry its resourceVersion, and a conflict waits a tick.
    """
    namespace = job.metadata.namespace or ""
    name = kueue_workload.workload_name(job.name)
    workload = next((w for w in indexed if w["metadata"]["name"] == name), None)
    if workload is None:
        path = kube.object_path(kueue_workload.WORKLOAD_API_VERSION, "Workload", namespace, name)
        workload = await api.get(path)
    if workload is not None:
        return plan.Queueing(workload, await _flavors(api, memo, workload))
    if terminal:
        return plan.Queueing(None)
    if await api.get(f"/apis/{kueue_workload.WORKLOAD_API_VERSION}") is None:
        problem = (
            f"label {kueue_workload.QUEUE_LABEL} asks for Kueue, but this cluster serves no "
            f"{kueue_workload.WORKLOAD_API_VERSION} Workloads: install Kueue or remove the label"
        )
        return plan.Queueing(None, problem=problem)
    priority = await _priority(api, job)
    if isinstance(priority, str):
        return plan.Queueing(None, problem=priority) if priority else plan.Queueing(None)
    return plan.Queueing(None, priority=priority)


def _remember(memo: kopf.Memo, sample: MetricSample, job: ImpalaJob) -> list[MetricSample]:
    """Add `sample` to the job's metric history in `memo`, dropping what no window needs."""
    settings: Settings = memo.settings
    window = job.spec.rollouts.autoscaling.stabilization_window_seconds
    keep = max(settings.metrics_history_seconds, window + 4 * settings.reconcile_interval)
    samples: list[MetricSample] = [*getattr(memo, "samples", []), sample]
    kept = [s for s in samples if s.time >= sample.time - keep]
    memo.samples = kept
    return kept


def _record(job: ImpalaJob, tick_plan: plan.TickPlan) -> None:
    """Count and log what a tick decided."""
    for event in tick_plan.events:
        metrics.TRANSITIONS.labels(event.reason).inc()
        log.info("%s/%s %s: %s", job.metadata.namespace, job.name, event.reason, event.message)
    if tick_plan.scale is not None and tick_plan.scale.changed:
        metrics.SCALE_DECISIONS.labels("rollout", tick_plan.scale.reason).inc()


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # A private registry lacks kopf's default login handlers: use the kubernetes client's
    # config loading ($KUBECONFIG, else in-cluster), the same identity `kube.Api` uses.
    return kopf.login_via_client(**kwargs)


async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """kopf's own settings, the sidecar client and the executor the API calls run in."""
    # Bookkeeping under the project's own annotation prefix, not in the status schema.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    # The indexes' watches ask the API server for our objects only: on a shared cluster the
    # operator is not sent every pod, Deployment and Workload (kopf filters handlers' labels on
    # its side, after the whole stream has been sent).
    for index in INDEXES:
        settings.watching.label_selectors[index.resource] = index.selector()
    # Watching listed namespaces: serve exactly those, without listing all namespaces (which
    # a namespaced Role cannot, and kopf retries ~1 min before it gives up and falls back).
    settings.scanning.disabled = not memo.settings.all_namespaces
    # A timer that deletes its own job (TTL) is still running when the deletion arrives; kopf
    # then re-checks whether it exited only after this many seconds (default 60) before it
    # lifts its finalizer. The tick finishes within moments, so check again soon.
    settings.background.cancellation_polling = min(5.0, memo.settings.reconcile_interval)
    memo.sidecar = SidecarClient(memo.settings.sidecar_timeout)
    # kube.Api runs the blocking kubernetes client in the default executor: size it for
    # the API's latency (the stock one has cpu+4 threads, which 100 starting jobs queue on).
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(memo.settings.api_concurrency, thread_name_prefix="k8s-api")
    )


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.sidecar.aclose()
    memo.api.close()


def index_learner_pod(body: kopf.Body, meta: kopf.Meta, **_: Any) -> dict[str, Any] | None:
    """Index `learner_pods`: job uid -> the views of its learner pods."""
    owner = _owner(meta)
    return {owner: job_status.learner_pod_view(body)} if owner else None


def index_node_deployment(body: kopf.Body, meta: kopf.Meta, **_: Any) -> dict[str, Any] | None:
    """Index `node_deployments`: job uid -> (role, view) of its rollout/aggregator Deployments."""
    owner, role = _owner(meta), meta.get("labels", {}).get(names.COMPONENT)
    if not owner or role not in plan.ROLES:
        return None
    return {owner: (role, job_status.deployment_view(body))}


def index_workload(body: kopf.Body, meta: kopf.Meta, **_: Any) -> dict[str, Any] | None:
    """Index `workloads`: job uid -> its Kueue Workload (the whole object, status included)."""
    owner = _owner(meta)
    return {owner: dict(body)} if owner else None


class Index(NamedTuple):
    """A kopf index: the resource it watches, its id (the handlers' kwarg), its handler, and the
    labels that are both the handler's filter and its watch's server-side labelSelector (one
    component, or any of `components`)."""

    resource: tuple[str, ...]
    id: str
    handler: Callable[..., Any]
    labels: dict[str, str]
    components: tuple[str, ...] = ()

    def kopf_labels(self) -> dict[str, Any]:
        if not self.components:
            return self.labels
        wanted = self.components
        return {**self.labels, names.COMPONENT: lambda value, **_: value in wanted}

    def selector(self) -> str:
        plain = names.label_selector(self.labels)
        if not self.components:
            return plain
        return f"{plain},{names.COMPONENT} in ({','.join(self.components)})"


INDEXES = (
    # Every learner pod: rank 0 (`learner`) and ranks 1..N-1 of learner.replicas.
    Index(
        ("v1", "pods"),
        "learner_pods",
        index_learner_pod,
        OURS,
        components=tuple(children.LEARNER_COMPONENTS),
    ),
    Index(("apps", "v1", "deployments"), "node_deployments", index_node_deployment, OURS),
    # The app label, which every Workload the operator made carries (it has no managed-by).
    # Where Kueue is not installed kopf leaves this index empty and says so once.
    Index(
        (kueue_workload.GROUP, kueue_workload.WORKLOAD_API_VERSION.split("/")[1], "workloads"),
        "workloads",
        index_workload,
        {names.NAME: names.APP_NAME},
    ),
)


def track_phase(
    event: kopf.RawEvent, uid: str, status: kopf.Status, namespace: str = "", name: str = "",
    **_: Any,
) -> None:  # fmt: skip
    """Keep the jobs-per-phase gauges current."""
    if event["type"] == "DELETED":
        metrics.JOBS.forget(uid)
    else:
        metrics.JOBS.record(uid, status.get("phase"), namespace or "", name or "")


async def apply_children(
    body: kopf.Body,
    uid: str,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Edge-triggered: the spec is new or changed (or the operator restarted). Once the children
    that follow the spec alone are applied, the generation is recorded as
    `status.observedGeneration` (API conventions: the generation the controller acted on, never
    one whose apply failed); the pods and Deployments are the timer's (`plan.plan_tick`)."""
    api: kube.Api = memo.api
    metrics.RECONCILES.labels("children").inc()
    try:
        job = parse_job(body)
    except ManifestError as exc:
        message = "; ".join(exc.problems)
        await api.post_event(body, Event("Warning", "InvalidSpec", message), time.time())
        raise kopf.PermanentError(f"invalid spec: {message}") from exc
    manifests = plan.plan_children(
        job,
        uid,
        tokens=job_tokens(memo.token_key, uid),
        operator_namespace=memo.operator_namespace,
        monitoring_namespace=memo.settings.monitoring_namespace,
    )
    namespace = job.metadata.namespace or ""
    try:
        # The Secret before the pods that mount it (a pod whose Secret is missing waits).
        await api.apply(manifests[0])
        await asyncio.gather(*(api.apply(m) for m in manifests[1:]))
        for api_version, kind, name in plan.removed_children(job):
            await api.delete(api_version, kind, namespace, name)
    except kube.ApiError as exc:
        metrics.ERRORS.labels("children").inc()
        raise kopf.TemporaryError(f"applying children: {exc}", delay=5) from exc
    warning = plan.durability_warning(job)
    if warning is not None and body.get("status", {}).get("observedGeneration") != meta.get(
        "generation"
    ):
        await api.post_event(body, warning, time.time())
    patch.status["observedGeneration"] = meta.get("generation")
    log.info("%s/%s children applied", job.metadata.namespace, job.name)


async def tick(
    body: kopf.Body,
    uid: str,
    meta: kopf.Meta,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    learner_pods: kopf.Index,
    node_deployments: kopf.Index,
    workloads: kopf.Index,
    **_: Any,
) -> None:
    """Level-based: recompute everything from the children and the sidecar."""
    started, now = time.monotonic(), time.time()
    settings: Settings = memo.settings
    metrics.RECONCILES.labels("tick").inc()
    try:
        job = parse_job(body)
    except ManifestError as exc:
        problems = "; ".join(exc.problems)
        new = job_status.invalid_spec_status(problems, meta.get("generation"), status, now)
        patch.status.update(job_status.status_patch(dict(status), new))
        return
    snapshot = None
    if status.get("phase") not in (*TERMINAL, "Suspended"):
        namespace, annotations = job.metadata.namespace or "", job.metadata.annotations
        snapshot = await memo.sidecar.fetch_status(
            job_status.sidecar_url(job.name, namespace, annotations),
            token=job_tokens(memo.token_key, uid).status,
        )
    sample = job_status.metric_sample(snapshot, now, settings.metrics_stale_after)
    queueing = None
    if kueue_workload.queue_name(job) is not None:
        try:
            terminal = status.get("phase") in TERMINAL
            queueing = await read_queueing(memo.api, memo, job, terminal, workloads.get(uid, []))
        except kube.ApiError as exc:
            metrics.ERRORS.labels("tick").inc()
            raise kopf.TemporaryError(f"reading the Workload: {exc}", delay=5) from exc
    tick_plan = plan.plan_tick(
        job,
        uid,
        status=status,
        pods=list(learner_pods.get(uid, [])),
        deployments=_deployment_views(node_deployments, uid),
        samples=_remember(memo, sample, job),
        snapshot=snapshot,
        now=now,
        settings=settings,
        queueing=queueing,
    )
    try:
        refused = await execute(memo.api, body, tick_plan, now)
    except kube.ApiError as exc:
        metrics.ERRORS.labels("tick").inc()
        raise kopf.TemporaryError(f"reconcile: {exc}", delay=settings.reconcile_interval) from exc
    if refused:  # shown on the job, not only in this log: the status is still written
        metrics.ERRORS.labels("tick").inc()
        new_status, event = job_status.learner_pod_refused(tick_plan.status, *refused[0], now)
        if event is not None:
            await memo.api.post_event(body, event, now)
    else:
        new_status = job_status.learner_pod_accepted(tick_plan.status, now)
    patch.status.update(job_status.status_patch(dict(status), new_status))
    _record(job, tick_plan)
    metrics.TICK_SECONDS.observe(time.monotonic() - started)


def register(registry: kopf.OperatorRegistry, settings: Settings) -> None:
    """Attach every handler to `registry`; the timer's interval comes from `settings`."""
    kopf.on.login(id="login", registry=registry)(login)
    kopf.on.startup(id="startup", registry=registry)(startup)
    kopf.on.cleanup(id="cleanup", registry=registry)(cleanup)
    for index in INDEXES:
        kopf.index(*index.resource, id=index.id, labels=index.kopf_labels(), registry=registry)(
            index.handler
        )
    kopf.on.event(*RESOURCE, id="phase", registry=registry)(track_phase)
    kopf.on.update(*RESOURCE, id="children", backoff=5, registry=registry)(apply_children)
    kopf.on.create(*RESOURCE, id="children", backoff=5, registry=registry)(apply_children)
    kopf.on.resume(*RESOURCE, id="children", backoff=5, registry=registry)(apply_children)
    interval = settings.reconcile_interval
    kopf.timer(*RESOURCE, id="tick", interval=interval, backoff=interval, registry=registry)(tick)
