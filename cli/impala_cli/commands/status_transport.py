"""How `impalajob status` reaches a job's sidecar: straight to its URL; for an ImpalaJob name, its
`status.statusURL` (set by the operator) and its bearer token (from the auth Secret `<job>-auth`),
then in a pod the URL directly, from a kubeconfig a port-forward to the learner pod (the job's
NetworkPolicy admits only labelled pods to the status port; a forward enters the pod's own
network), else the API server's Service proxy when no learner pod is running. A finished job's
final status comes from its CR (`FinishedJob`). Reaching the cluster: `cluster.connect`.

The Kubernetes client is imported only where a name is looked up, so URL targets start fast.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import httpx

from impala_api.roles import STATUS_PORT
from impala_api.spec import API_GROUP, API_VERSION, PLURAL
from impala_cli.commands.cluster import NoClusterError, connect


class StatusCommandError(Exception):
    """A failure to report to the user as one message (exit status 1)."""


class FinishedJob(Exception):  # control flow, not an error
    """The job has Succeeded or Failed: `final` is its final status, read from the CR."""

    def __init__(self, final: dict[str, Any]) -> None:
        super().__init__(final.get("phase"))
        self.final = final


FINISHED = ("Succeeded", "Failed")


def final_status(obj: dict[str, Any]) -> dict[str, Any]:
    """A finished ImpalaJob's final status from its CR: phase, figures, where the results are."""
    status = obj.get("status") or {}
    checkpoint = (obj.get("spec") or {}).get("checkpoint") or {}
    results = {
        k: v
        for k, v in (
            ("volumeClaim", checkpoint.get("volumeClaim")),
            ("storageUri", checkpoint.get("storageUri")),
        )
        if v
    }
    return {
        "job": (obj.get("metadata") or {}).get("name", ""),
        "namespace": (obj.get("metadata") or {}).get("namespace"),
        "phase": status.get("phase"),
        "message": status.get("message"),
        "startTime": status.get("startTime"),
        "completionTime": status.get("completionTime"),
        "progress": status.get("progress") or {},
        "learner": status.get("learner") or {},
        "results": results,
    }


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def base_url(url: str) -> str:
    """The sidecar's base URL, whether given as the base or as its /status endpoint."""
    url = url.rstrip("/")
    return url.removesuffix("/status")


def fetch_job_status(
    name: str, namespace: str | None, token: str | None, timeout: float
) -> dict[str, Any]:
    """/status of ImpalaJob `name`: the token from the job's auth Secret unless one was given;
    in a pod straight from `status.statusURL`; from a kubeconfig through a port-forward to the
    learner pod (what `kubectl port-forward` does: the job's NetworkPolicy admits only labelled
    pods, and a forward enters the pod's own network), else the API server's Service proxy."""
    url, in_cluster, namespace = status_url_from_cluster(name, namespace)
    secret_note = ""
    if token is None:
        token, secret_note = job_token(name, namespace)
    try:
        if in_cluster or not is_service_url(url):
            return fetch_status(url, token, timeout)
        pod = learner_pod(name, namespace)
        if pod is not None:
            return fetch_status_via_port_forward(namespace, pod, token, timeout)
        return fetch_status_via_api_server(url, token, timeout)
    except StatusCommandError as err:
        raise StatusCommandError(f"{err}{secret_note}") from None


def job_token(name: str, namespace: str) -> tuple[str | None, str]:
    """The job's status token from its auth Secret (`<job>-auth`, made by the operator), and a
    note for a 401 when it could not be read."""
    import base64

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from impala_api import names

    secret_name = names.child_name(name, "auth")
    try:
        secret = client.CoreV1Api().read_namespaced_secret(secret_name, namespace)
        value = (secret.data or {}).get(names.STATUS_TOKEN_KEY)
        return (base64.b64decode(value).decode() if value else None), ""
    except ApiException as err:
        note = (
            f"\n  the status token is in Secret {namespace}/{secret_name}, which could not be "
            f"read ({err.status} {err.reason}): pass --token-file, or ask for get on that "
            "Secret"
        )
        return None, note
    except Exception as err:  # urllib3 connection errors and the like
        return None, f"\n  reading Secret {namespace}/{secret_name} failed: {err}"


def learner_pod(name: str, namespace: str) -> str | None:
    """The running learner pod of the job's current attempt, or None (none running, or the
    pods cannot be listed)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from impala_api import names

    try:
        pods = client.CoreV1Api().list_namespaced_pod(
            namespace, label_selector=names.selector_string(name, "learner")
        )
    except (ApiException, ValueError):
        return None
    running = [
        p
        for p in pods.items
        if p.status is not None
        and p.status.phase == "Running"
        and p.metadata.deletion_timestamp is None
    ]
    if not running:
        return None

    def attempt(pod: Any) -> int:
        value = (pod.metadata.labels or {}).get(names.RESTART_KEY, "0")
        return int(value) if value.isdigit() else 0

    return str(max(running, key=attempt).metadata.name)


def fetch_status_via_port_forward(
    namespace: str, pod: str, token: str | None, timeout: float
) -> dict[str, Any]:
    """GET /status of the sidecar in `pod` through a port-forward (the pods/portforward
    subresource, over a websocket), with the bearer token."""
    import http.client

    from kubernetes import client
    from kubernetes.stream import portforward

    where = f"pod {namespace}/{pod} port {STATUS_PORT} (port-forward)"
    try:
        forward = portforward(
            client.CoreV1Api().connect_get_namespaced_pod_portforward,
            pod,
            namespace,
            ports=str(STATUS_PORT),
        )
    except Exception as err:
        raise StatusCommandError(f"cannot port-forward to {where}: {err}") from err
    try:
        conn = http.client.HTTPConnection("localhost", STATUS_PORT, timeout=timeout)
        sock = forward.socket(STATUS_PORT)
        sock.settimeout(timeout)
        conn.sock = sock
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request("GET", "/status", headers=headers)
        resp = conn.getresponse()
        body = resp.read()
    except (OSError, http.client.HTTPException) as err:
        raise StatusCommandError(f"{where} did not answer: {err}") from err
    finally:
        forward.close()
    if resp.status != 200:
        try:
            why = _why(json.loads(body), "")
        except ValueError:
            why = body[:200].decode(errors="replace")
        raise StatusCommandError(f"{where} answered {resp.status}: {why}")
    try:
        data = json.loads(body)
    except ValueError as err:
        raise StatusCommandError(f"{where} did not answer JSON: {err}") from err
    if not isinstance(data, dict):
        raise StatusCommandError(f"{where} answered {data!r}")
    return data


def status_url_from_cluster(name: str, namespace: str | None) -> tuple[str, bool, str]:
    """Read `status.statusURL` of ImpalaJob `name` through the Kubernetes API; also whether the
    configuration is the in-cluster one (the URL is then directly reachable), and the
    namespace."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        cluster = connect(namespace)
    except NoClusterError as err:
        raise StatusCommandError(
            f"{name!r} is not a URL, and there is no kubeconfig or in-cluster config to "
            f"look the job up with ({err})"
        ) from err
    namespace, in_cluster = cluster.namespace, cluster.in_cluster
    try:
        obj: dict[str, Any] = client.CustomObjectsApi().get_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, PLURAL, name
        )
    except ApiException as err:
        if err.status == 404:
            raise StatusCommandError(f"ImpalaJob {namespace}/{name} not found") from err
        raise StatusCommandError(
            f"cannot read ImpalaJob {namespace}/{name}: {err.status} {err.reason}"
        ) from err
    except Exception as err:  # urllib3 connection errors and the like
        raise StatusCommandError(f"cannot reach the Kubernetes API: {err}") from err
    if (obj.get("status") or {}).get("phase") in FINISHED:
        raise FinishedJob(final_status(obj))
    url = (obj.get("status") or {}).get("statusURL")
    if not url:
        raise StatusCommandError(
            f"ImpalaJob {namespace}/{name} has no status.statusURL yet (is the operator running, "
            "and the learner pod scheduled?)"
        )
    # The operator may publish the base URL or its /status endpoint: accept both.
    return base_url(str(url)), in_cluster, namespace


def is_service_url(url: str) -> bool:
    """Whether `url` names a Service by its cluster DNS name (`svc.ns.svc[.cluster.local]`)."""
    labels = (urlsplit(url).hostname or "").split(".")
    return len(labels) >= 3 and labels[2] == "svc"


def service_of(url: str) -> tuple[str, str, int]:
    """(namespace, service, port) of a cluster-internal `http://svc.ns.svc[...]:port` URL."""
    parts = urlsplit(url)
    labels = (parts.hostname or "").split(".")
    if not is_service_url(url):
        raise StatusCommandError(
            f"{url} is not a Service address (svc.namespace.svc...): pass the sidecar's URL"
        )
    return labels[1], labels[0], parts.port or 80


def fetch_status_via_api_server(url: str, token: str | None, timeout: float) -> dict[str, Any]:
    """GET /status of the Service behind `url` through the API server's Service proxy
    (`/api/v1/namespaces/NS/services/SVC:PORT/proxy/status`), with the kubeconfig's identity.

    The API server consumes the `Authorization` header itself, so the token goes as the
    sidecar's cookie (which the proxy passes on); the port-forward path is the one the job's
    NetworkPolicy admits, this one serves where no learner pod can be forwarded to."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from impala_trainer.sidecar.auth import TOKEN_COOKIE

    namespace, service, port = service_of(url)
    try:
        # Raw bytes (`_preload_content=False`): the generated client would hand back the
        # JSON body as a Python repr string.
        resp = client.CoreV1Api().connect_get_namespaced_service_proxy_with_path(
            f"{service}:{port}",
            namespace,
            "status",
            _preload_content=False,
            _request_timeout=timeout,
            _headers={"Cookie": f"{TOKEN_COOKIE}={token}"} if token else None,
        )
        body = json.loads(resp.data)
    except ApiException as err:
        try:
            why = _why(json.loads(err.body), "")
        except (TypeError, ValueError):
            why = f"{err.reason} {str(err.body or '')[:200]}".strip()
        hint = ""
        if err.status in (401, 503):
            hint = (
                f"\n  or reach the sidecar yourself: `kubectl port-forward -n {namespace} "
                f"svc/{service} {port}` and `impalajob status http://localhost:{port} "
                "--token-file ...`"
            )
        raise StatusCommandError(
            f"{url}/status (through the API server's Service proxy) answered {err.status}: "
            f"{why}{hint}"
        ) from err
    except ValueError as err:
        raise StatusCommandError(f"{url}/status did not answer JSON: {err}") from err
    except Exception as err:  # urllib3 connection errors and the like
        raise StatusCommandError(f"cannot reach the Kubernetes API: {err}") from err
    if not isinstance(body, dict):
        raise StatusCommandError(f"{url}/status answered {body!r}")
    return body


def _why(body: object, text: str) -> str:
    """An error body in one line: the sidecar's `{error, detail}`, the API server's Status
    `message`, else `text`."""
    if isinstance(body, dict):
        if "error" in body:
            return f"{body.get('error')}: {body.get('detail')}"
        if "message" in body:
            return str(body["message"])
    return text or str(body)


def fetch_status(url: str, token: str | None, timeout: float) -> dict[str, Any]:
    """GET {url}/status; errors become one readable message."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(f"{url}/status", headers=headers, timeout=timeout)
    except httpx.HTTPError as err:
        raise StatusCommandError(f"cannot reach {url}: {err}") from err
    try:
        body = r.json()
    except ValueError:
        body = None
    if r.status_code != 200 or not isinstance(body, dict):
        raise StatusCommandError(f"{url}/status answered {r.status_code}: {_why(body, r.text)}")
    return body
