"""The operator's token key: Secret `impala-operator-token-key` in its own namespace, made by the
first replica that finds none (the only Secret the operator may read, by name). The per-job
tokens derived from it are `build.tokens`."""

from __future__ import annotations

import base64
import logging
import secrets
from typing import Any

log = logging.getLogger(__name__)

KEY_BYTES = 32
KEY_FIELD = "key"


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
