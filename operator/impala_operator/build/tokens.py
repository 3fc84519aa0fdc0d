"""Per-job credentials: the sidecar's bearer token and Ray's cluster token, in one Secret.

The tokens are derived, not stored: HMAC-SHA256 of the job's uid under the operator's key. So
the operator can always present a job's status token without reading any Secret (its RBAC
creates and applies Secrets but cannot get them), every replica and every restart derives the
same tokens, and a new job (a new uid) never shares a token with an earlier one of its name.

The key itself is read (or made) by `runtime.token_key`; this module is pure.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass


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
