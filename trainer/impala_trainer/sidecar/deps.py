"""FastAPI dependencies (`Annotated` aliases the routers use) and the per-app sidecar state.

Dependencies are `async def` on purpose: FastAPI runs plain `def` dependencies in a thread pool,
and that hop would cost more than everything the sidecar does per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated
from urllib.parse import unquote

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry

from impala_trainer.rundir.reader import RunDirReader
from impala_trainer.sidecar.auth import TOKEN_COOKIE, TokenSource
from impala_trainer.sidecar.collector import SnapshotCollector
from impala_trainer.sidecar.settings import Settings


@dataclass
class Sidecar:
    """Everything one app instance holds: settings, the run-directory reader, auth, metrics."""

    settings: Settings
    reader: RunDirReader
    tokens: TokenSource
    registry: CollectorRegistry
    status_body: tuple[object, bytes] | None = field(default=None)
    """(snapshot identity, serialised /status body without age_seconds): see routers/status.py."""
    metrics_body: tuple[object, bytes] | None = field(default=None)
    """(status.json identity, rendered exposition): see routers/metrics.py."""

    @classmethod
    def build(cls, settings: Settings) -> Sidecar:
        reader = RunDirReader(settings.run_dir, settings.history_max_points)
        # A registry per app (not prometheus_client's global one): several apps can coexist in
        # one process (tests, `train --dashboard`) without duplicate-metric errors.
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(reader, settings.job_name))
        return cls(settings, reader, TokenSource(settings), registry)


async def get_sidecar(request: Request) -> Sidecar:
    """The app's sidecar state (built by `main.create_app`)."""
    sidecar: Sidecar = request.app.state.sidecar
    return sidecar


SidecarDep = Annotated[Sidecar, Depends(get_sidecar)]


async def get_app_settings(sidecar: SidecarDep) -> Settings:
    """The settings the app was built with (override this in tests)."""
    return sidecar.settings


async def get_reader(sidecar: SidecarDep) -> RunDirReader:
    """The run-directory reader."""
    return sidecar.reader


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
ReaderDep = Annotated[RunDirReader, Depends(get_reader)]

bearer_scheme = HTTPBearer(
    auto_error=False,
    description="The sidecar's token (IMPALA_STATUS_TOKEN or IMPALA_STATUS_TOKEN_FILE).",
)


async def require_token(
    request: Request,
    sidecar: SidecarDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> None:
    """Reject the request (401) unless it carries the token, as a bearer header or the cookie."""
    presented = credentials.credentials if credentials is not None else None
    if presented is None and TOKEN_COOKIE in request.cookies:
        presented = unquote(request.cookies[TOKEN_COOKIE])
    sidecar.tokens.check(presented)
