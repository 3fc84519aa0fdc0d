"""The one module that talks to the Kubernetes API (besides kopf's own watching and patching).

Children are written with server-side apply under one field manager: applying the same manifest
twice is a no-op, an operator restarted halfway through converges instead of duplicating, and
fields other managers own (a user's `kubectl scale` of a Deployment, the HPA...) are taken back
explicitly (`force`). Pods are the exception: their spec is immutable, so the learner pod is
created (POST) and an existing one counts as success.

The kubernetes client is synchronous; every call runs in a worker thread so kopf's event loop
never blocks. Objects travel as plain JSON dicts (camelCase, as the API and the builders speak),
through one generic path-based request function rather than the typed per-kind methods.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes import client, config

from impala_api.spec import API_GROUP, API_VERSION, KIND, PLURAL
from impala_operator.lifecycle.conditions import rfc3339
from impala_operator.lifecycle.run_policy import Event
from impala_operator.settings import FIELD_MANAGER

Manifest = dict[str, Any]

# kind -> plural, for the kinds the operator reads or writes.
PLURALS = {
    "Secret": "secrets",
    "ConfigMap": "configmaps",
    "Service": "services",
    "Pod": "pods",
    "Deployment": "deployments",
    "NetworkPolicy": "networkpolicies",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "Event": "events",
    "Workload": "workloads",
    KIND: PLURAL,
}
CLUSTER_PLURALS = {
    "ResourceFlavor": "resourceflavors",
    "WorkloadPriorityClass": "workloadpriorityclasses",
    "PriorityClass": "priorityclasses",
}
JOB_API_VERSION = f"{API_GROUP}/{API_VERSION}"
MAX_EVENT_MESSAGE = 1024  # the API server rejects longer Event messages
REQUEST_TIMEOUT = (5.0, 30.0)
"""(connect, read) seconds: a hung request must not hold a worker thread (and a job) forever."""


class ApiError(RuntimeError):
    """A non-2xx answer: `status` (0 for transport errors), `reason` and the Status message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(f"{status} {reason}: {message}")


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """The REST path of a namespaced object (or of its collection when `name` is None)."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}"
    return f"{path}/{name}" if name else path


def cluster_object_path(api_version: str, kind: str, name: str) -> str:
    """The REST path of a cluster-scoped object."""
    return f"/apis/{api_version}/{CLUSTER_PLURALS[kind]}/{name}"


def load_api_client(kubeconfig: str | None = None, *, pool_size: int = 32) -> client.ApiClient:
    """An ApiClient from `kubeconfig`, else $KUBECONFIG / ~/.kube/config, else in-cluster, with
    `pool_size` pooled connections (one per concurrent call)."""
    configuration = client.Configuration()
    configuration.connection_pool_maxsize = pool_size
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            config.load_kube_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)


class Api:
    """Async JSON access to the objects an ImpalaJob owns, plus Events and job deletion."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._client = api_client
        self._instance = socket.gethostname()

    def _request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, body, _ = self._client.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._client.call_api(
                method, url, header_params=headers, body=body, _request_timeout=REQUEST_TIMEOUT
            )
            data = response.read()
        except client.ApiException as exc:
            raise ApiError(exc.status or 0, str(exc.reason), str(exc.body or "")) from exc
        except urllib3.exceptions.HTTPError as exc:  # connection refused, timeouts, TLS...
            raise ApiError(0, type(exc).__name__, str(exc)) from exc
        payload = json.loads(data) if data else {}
        if not 200 <= response.status < 300:
            message = payload.get("message", "") if isinstance(payload, dict) else str(payload)
            raise ApiError(response.status, str(payload.get("reason", "")), message)
        return payload

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._request, method, path, **kwargs)

    async def apply(self, manifest: Mapping[str, Any]) -> Manifest:
        """Server-side apply `manifest` (create or patch to match it); returns the live object."""
        meta = manifest["metadata"]
        path = object_path(
            manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"]
        )
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        result: Manifest = await self._call(
            "PATCH",
            path,
            query=query,
            body=dict(manifest),
            content_type="application/apply-patch+yaml",
        )
        return result

    async def get(self, path: str) -> Manifest | None:
        """The object at `path` (`object_path`, `cluster_object_path`), None if there is none."""
        try:
            result: Manifest = await self._call("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def replace_status(self, manifest: Mapping[str, Any]) -> bool:
        """Write `manifest`'s status (PUT .../status, guarded by its resourceVersion); False if
        the object changed meanwhile (the next reconcile decides again) or is gone."""
        meta = manifest["metadata"]
        path = object_path(
            manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"]
        )
        try:
            await self._call(
                "PUT",
                f"{path}/status",
                query=[("fieldManager", FIELD_MANAGER)],
                body=dict(manifest),
            )
        except ApiError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def create(self, manifest: Mapping[str, Any]) -> Manifest | None:
        """Create `manifest`; None if an object of that name already exists."""
        meta = manifest["metadata"]
        path = object_path(manifest["apiVersion"], manifest["kind"], meta["namespace"])
        try:
            result: Manifest = await self._call(
                "POST", path, query=[("fieldManager", FIELD_MANAGER)], body=dict(manifest)
            )
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise
        return result

    async def annotate(
        self, api_version: str, kind: str, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> bool:
        """Merge `annotations` into one object's; False if it is gone."""
        body = {"metadata": {"annotations": dict(annotations)}}
        try:
            await self._call(
                "PATCH",
                object_path(api_version, kind, namespace, name),
                body=body,
                content_type="application/merge-patch+json",
            )
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete one object (children go by garbage collection); False if it was gone."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        try:
            await self._call("DELETE", object_path(api_version, kind, namespace, name), body=body)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def post_event(self, job: Mapping[str, Any], event: Event, now: float) -> None:
        """Record `event` on the ImpalaJob (`kubectl describe ij NAME` shows it)."""
        meta = job["metadata"]
        stamp = rfc3339(now)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": JOB_API_VERSION,
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:MAX_EVENT_MESSAGE],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await self._call("POST", object_path("v1", "Event", meta["namespace"]), body=body)

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()
