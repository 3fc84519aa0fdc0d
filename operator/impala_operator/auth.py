"""Per-job credentials: the sidecar's bearer token and Ray's cluster token, in one Secret.

The tokens are derived, not stored: HMAC-SHA256 of the job's uid under the operator's key. So
the operator can always present a job's status token without reading any Secret (its RBAC
creates and applies Secrets but cannot get them), every replica and every restart derives the
same tokens, and a new job (a new uid) never shares a token with an earlier one of its name.

The key itself is a Secret in the operator's own namespace, made by the first replica that
finds none (the only Secret the operator may read, by name).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

KEY_BYTES = 32
KEY_FIELD = "key"


@dataclass(frozen=True)
class JobTokens:
    status: str
    """Bearer token of the status sidecar (`impalajob status`, the operator, dashboards)."""
    ray: str
    """RAY_AUTH_TOKEN of the job's Ray cluster: who holds it can run code on the learner."""


def job_tokens(key: bytes, uid: str) -> JobTokens:
    """The job's tokens: distinct per purpose, so handing out the status token grants no Ray."""

    def derive(purpose: str) -> str:
        return hmac.new(key, f"{uid}/{purpose}".encode(), hashlib.sha256).hexdigest()

    return JobTokens(status=derive("status"), ray=derive("ray"))


def operator_key(api_client: Any, namespace: str, name: str) -> bytes:
    """The operator's key from Secret `namespace/name`, created (random) when there is none.

    Two replicas starting together may both find none: the second create gets 409 and reads
    the winner's key, so all replicas agree."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)
    for _ in range(3):
        try:
            secret = core.read_namespaced_secret(name, namespace)
            return base64.b64decode(secret.data[KEY_FIELD])
        except ApiException as err:
            if err.status != 404:
                raise
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "impala-operator"},
            },
            "type": "Opaque",
            "data": {KEY_FIELD: base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()},
        }
        try:
            core.create_namespaced_secret(namespace, body)
            log.info("created the token key Secret %s/%s", namespace, name)
        except ApiException as err:
            if err.status != 409:  # 409: another replica made it first; read theirs
                raise
    raise RuntimeError(f"cannot read or create the token key Secret {namespace}/{name}")
