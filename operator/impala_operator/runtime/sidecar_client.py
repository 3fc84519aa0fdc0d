"""Reads a job's status sidecar (`GET /status`): a short timeout, and None instead of errors.

The sidecar is optional to the operator: a learner that is starting, restarting or gone simply
has no metrics, and the autoscaler holds. So every failure (connection, timeout, HTTP error,
a body that is not a StatusSnapshot) comes back as None, logged at debug level only.
"""

from __future__ import annotations

import logging

import httpx
from pydantic import ValidationError

from impala_api.snapshot import StatusSnapshot

log = logging.getLogger(__name__)


class SidecarClient:
    """One pooled HTTP client for every job's sidecar (create once per operator process)."""

    def __init__(self, timeout: float, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(timeout),
            # Sidecars are many small servers polled every few seconds: keep few idle sockets.
            limits=httpx.Limits(max_keepalive_connections=32, keepalive_expiry=30.0),
            follow_redirects=False,
        )

    async def fetch_status(self, url: str, token: str | None = None) -> StatusSnapshot | None:
        """The sidecar's latest snapshot at `url`, or None if it cannot be had right now."""
        headers = {"Authorization": f"Bearer {token}"} if token else None
        try:
            response = await self._client.get(url, headers=headers)
            response.raise_for_status()
            return StatusSnapshot.model_validate_json(response.content)
        except (httpx.HTTPError, ValidationError) as exc:
            log.debug("sidecar %s: %s", url, exc)
            return None

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._client.aclose()
