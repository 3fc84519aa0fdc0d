"""kopf handlers: thin glue between kopf's events and the pure planners in `reconcile`.

- create/update/resume (edge-triggered): validate the spec, apply the children that follow it.
- a timer every `reconcile_interval` seconds (level-based): read the sidecar, plan the lifecycle,
  autoscaling and status from what exists now, execute, patch the status. A restarted operator
  converges from whatever state it finds, with no duplicates (fixed names, server-side apply).
- two indexes keep the learner pods and node Deployments of every job in memory from kopf's
  watches, so a timer tick costs no list calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from impala_operator import job_status as st
from impala_operator import metrics
from impala_operator import names as L
from impala_operator import plan as reconcile
from impala_operator.autoscaler import MetricSample
from impala_operator.kube import Api, ApiError
from impala_operator.run_policy import Event
from impala_operator.settings import Settings
from impala_operator.sidecar_client import SidecarClient
from impala_trainer.job.manifest import ManifestError, parse_manifest
from impala_trainer.job.spec import API_GROUP, API_VERSION, PLURAL, ImpalaJob

RESOURCE = (API_GROUP, API_VERSION, PLURAL)
OURS = {L.MANAGED_BY_KEY: L.MANAGED_BY}
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
    return next(
        (r["uid"] for r in refs if r.get("controller") and r.get("kind") == "ImpalaJob"), None
    )


def _deployment_views(index: kopf.Index, uid: str) -> dict[str, st.DeploymentView | None]:
    views: dict[str, st.DeploymentView | None] = {"rollout": None, "aggregator": None}
    for role, view in index.get(uid, []):
        views[role] = view
    return views


def register(registry: kopf.OperatorRegistry, config: Settings) -> None:
    """Register every handler on `registry` (the timer's interval comes from `config`)."""

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A private registry lacks kopf's default login handlers: use the kubernetes client's
        # config loading ($KUBECONFIG, else in-cluster), the same identity `apply.Api` uses.
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(id="startup", registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        # Bookkeeping under the project's own annotation prefix, not in the status schema.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=API_GROUP, key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        # Watching listed namespaces: serve exactly those, without listing all namespaces (which
        # a namespaced Role cannot, and kopf retries ~1 min before it gives up and falls back).
        settings.scanning.disabled = not memo.settings.all_namespaces
        # A timer that deletes its own job (TTL) is still running when the deletion arrives; kopf
        # then re-checks whether it exited only after this many seconds (default 60) before it
        # lifts its finalizer. The tick finishes within moments, so check again soon.
        settings.background.cancellation_polling = min(5.0, memo.settings.reconcile_interval)
        memo.sidecar = SidecarClient(memo.settings.sidecar_timeout)
        # apply.Api runs the blocking kubernetes client in the default executor: size it for
        # the API's latency (the stock one has cpu+4 threads, which 100 starting jobs queue on).
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(memo.settings.api_concurrency, thread_name_prefix="k8s-api")
        )

    @kopf.on.cleanup(id="cleanup", registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        await memo.sidecar.aclose()
        memo.api.close()

    @kopf.index(
        "pods", id="learner_pods", labels={**OURS, L.COMPONENT: "learner"}, registry=registry
    )
    def learner_pods(body: kopf.Body, meta: kopf.Meta, **_: Any) -> dict[str, Any] | None:
        owner = _owner(meta)
        return {owner: st.learner_pod_view(body)} if owner else None

    @kopf.index("apps", "v1", "deployments", id="node_deployments", labels=OURS, registry=registry)
    def node_deployments(body: kopf.Body, meta: kopf.Meta, **_: Any) -> dict[str, Any] | None:
        owner, role = _owner(meta), meta.get("labels", {}).get(L.COMPONENT)
        if not owner or role not in reconcile.ROLES:
            return None
        return {owner: (role, st.deployment_view(body))}

    @kopf.on.event(*RESOURCE, id="phase", registry=registry)
    def track_phase(event: kopf.RawEvent, uid: str, status: kopf.Status, **_: Any) -> None:
        if event["type"] == "DELETED":
            metrics.JOBS.forget(uid)
        else:
            metrics.JOBS.record(uid, status.get("phase"))

    @kopf.on.resume(*RESOURCE, id="children", backoff=5, registry=registry)
    @kopf.on.create(*RESOURCE, id="children", backoff=5, registry=registry)
    @kopf.on.update(*RESOURCE, id="children", backoff=5, registry=registry)
    async def apply_children(
        body: kopf.Body,
        uid: str,
        memo: kopf.Memo,
        node_deployments: kopf.Index,
        **_: Any,
    ) -> None:
        """Edge-triggered: the spec is new or changed (or the operator restarted)."""
        api: Api = memo.api
        metrics.RECONCILES.labels("children").inc()
        try:
            job = parse_job(body)
        except ManifestError as exc:
            message = "; ".join(exc.problems)
            await api.post_event(body, Event("Warning", "InvalidSpec", message), time.time())
            raise kopf.PermanentError(f"invalid spec: {message}") from exc
        views = _deployment_views(node_deployments, uid)
        try:
            await asyncio.gather(*(api.apply(m) for m in reconcile.plan_children(job, uid, views)))
        except ApiError as exc:
            metrics.ERRORS.labels("children").inc()
            raise kopf.TemporaryError(f"applying children: {exc}", delay=5) from exc
        log.info("%s/%s children applied", job.metadata.namespace, job.name)

    @kopf.timer(
        *RESOURCE,
        id="tick",
        interval=config.reconcile_interval,
        backoff=config.reconcile_interval,
        registry=registry,
    )
    async def tick(
        body: kopf.Body,
        uid: str,
        meta: kopf.Meta,
        status: kopf.Status,
        patch: kopf.Patch,
        memo: kopf.Memo,
        learner_pods: kopf.Index,
        node_deployments: kopf.Index,
        **_: Any,
    ) -> None:
        """Level-based: recompute everything from the children and the sidecar."""
        started, now = time.monotonic(), time.time()
        cfg: Settings = memo.settings
        metrics.RECONCILES.labels("tick").inc()
        try:
            job = parse_job(body)
        except ManifestError as exc:
            new = st.invalid_spec_status("; ".join(exc.problems), meta.get("generation"), now)
            patch.status.update(st.status_patch(dict(status), new))
            return
        snapshot = None
        if status.get("phase") not in (*TERMINAL, "Suspended"):
            url = st.sidecar_url(job.name, job.metadata.namespace or "", job.metadata.annotations)
            snapshot = await memo.sidecar.fetch_status(url)
        samples: list[MetricSample] = getattr(memo, "samples", [])
        samples.append(st.metric_sample(snapshot, now, cfg.metrics_stale_after))
        window = job.spec.rollouts.autoscaling.stabilization_window_seconds
        keep = max(cfg.metrics_history_seconds, window + 4 * cfg.reconcile_interval)
        memo.samples = [s for s in samples if s.time >= now - keep]
        plan = reconcile.plan_tick(
            job,
            uid,
            generation=meta.get("generation"),
            status=status,
            pods=list(learner_pods.get(uid, [])),
            deployments=_deployment_views(node_deployments, uid),
            samples=memo.samples,
            snapshot=snapshot,
            now=now,
            settings=cfg,
        )
        try:
            await reconcile.execute(memo.api, body, plan, now)
        except ApiError as exc:
            metrics.ERRORS.labels("tick").inc()
            raise kopf.TemporaryError(f"reconcile: {exc}", delay=cfg.reconcile_interval) from exc
        patch.status.update(st.status_patch(dict(status), plan.status))
        for event in plan.events:
            metrics.TRANSITIONS.labels(event.reason).inc()
            log.info("%s/%s %s: %s", job.metadata.namespace, job.name, event.reason, event.message)
        if plan.scale is not None and plan.scale.changed:
            metrics.SCALE_DECISIONS.labels("rollout", plan.scale.reason).inc()
        metrics.TICK_SECONDS.observe(time.monotonic() - started)
