"""Response models of the sidecar API (what /openapi.json documents)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from impala_api.snapshot import HistoryPoint, RunPhase, StatusSnapshot, Summary


class ErrorResponse(BaseModel):
    """Every error the sidecar returns (401, 404, 405, 422, 503) has this shape."""

    error: str
    """Machine-readable kind: missing, partial, corrupt, invalid, unreadable, stale,
    unauthorized, invalid_token, auth_unavailable, invalid_request, not_found, ..."""
    detail: str
    """What is wrong, for a human."""
    file: str | None = None
    """The run-directory file concerned, for snapshot errors."""


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"
    """The process is alive (says nothing about the run)."""


class ReadyResponse(BaseModel):
    ready: Literal[True] = True
    phase: RunPhase
    """Run phase of the snapshot."""
    age_seconds: float
    """Seconds since the snapshot was written."""
    max_age_seconds: float
    """Configured freshness bound (not applied once the run has finished)."""


class StatusResponse(StatusSnapshot):
    """The latest status snapshot as the trainer wrote it, plus what the sidecar knows about it."""

    age_seconds: float = 0.0
    """Seconds since the snapshot was written (now - updated_at)."""
    summary: Summary | None = None
    """The end-of-run summary, once summary.json exists."""


class HistoryResponse(BaseModel):
    """Time series for plots."""

    job: str | None = None
    """Job name from the latest snapshot, when one is readable."""
    points: list[HistoryPoint] = Field(default_factory=list)
    """Points with env_steps > since, downsampled evenly to at most `limit`, oldest first."""
    matched: int = 0
    """Points held that matched `since`, before downsampling."""
    held: int = 0
    """Points held in memory (bounded; older points are thinned)."""
    lines_read: int = 0
    """Lines of history.jsonl read so far."""
    skipped_lines: int = 0
    """Lines that were not valid HistoryPoints (skipped)."""


# OpenAPI `responses=` entries shared by the routers.
ERRORS_401: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "Missing or wrong bearer token"},
}
ERRORS_422: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorResponse, "description": "Invalid query parameters"},
}
ERRORS_503: dict[int | str, dict[str, Any]] = {
    503: {"model": ErrorResponse, "description": "Snapshot missing, partial, corrupt or stale"},
}
