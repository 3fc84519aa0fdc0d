"""`create_app(settings)`: the sidecar's FastAPI application, built from its routers."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from impala_trainer.rundir.reader import SnapshotError
from impala_trainer.sidecar.auth import AuthUnavailable, Unauthorized
from impala_trainer.sidecar.deps import Sidecar, require_token
from impala_trainer.sidecar.models import ErrorResponse
from impala_trainer.sidecar.routers import dashboard, health, history, metrics, status, videos
from impala_trainer.sidecar.settings import Settings, get_settings

log = logging.getLogger(__name__)

DESCRIPTION = """Read-only status of one ImpalaJob run, served from its run directory.

Every error is `{"error": ..., "detail": ...}`. A missing, partial or corrupt snapshot gives 503
(the sidecar keeps serving and recovers when the trainer writes a good one).
"""


def _error(
    status: int,
    error: str,
    detail: str,
    file: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=error, detail=detail, file=file).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=status, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    async def snapshot_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, SnapshotError)
        # The trainer rewrites its snapshot every few seconds: worth retrying soon.
        return _error(503, exc.kind, exc.detail, exc.file, headers={"Retry-After": "5"})

    async def unauthorized(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Unauthorized)
        challenge = 'Bearer realm="impala-status"'
        if exc.error == "invalid_token":
            challenge += ', error="invalid_token"'
        headers = {"WWW-Authenticate": challenge}
        if request.url.path == "/" and "text/html" in request.headers.get("accept", ""):
            return HTMLResponse(dashboard.LOGIN_HTML, status_code=401, headers=headers)
        return _error(401, exc.error, exc.detail, headers=headers)

    async def auth_unavailable(request: Request, exc: Exception) -> Response:
        log.error("refusing requests: %s", exc)
        return _error(503, "auth_unavailable", str(exc))

    async def invalid_request(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return _error(422, "invalid_request", problems or "invalid request")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        slug = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers) if exc.headers else None
        return _error(exc.status_code, slug, str(exc.detail), headers=headers)

    app.add_exception_handler(SnapshotError, snapshot_error)
    app.add_exception_handler(Unauthorized, unauthorized)
    app.add_exception_handler(AuthUnavailable, auth_unavailable)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(StarletteHTTPException, http_error)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app for one run directory (settings default to the IMPALA_STATUS_* env)."""
    settings = settings or get_settings()
    # /docs is left out: Swagger UI loads from a CDN, and the sidecar must work offline.
    app = FastAPI(
        title="ImpalaJob status",
        version="v1alpha1",
        description=DESCRIPTION,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.sidecar = Sidecar.build(settings)
    # The guard is attached only when a token is configured, so an open sidecar's schema does
    # not advertise a security scheme it does not enforce.
    guard = [Depends(require_token)] if settings.auth_enabled else []

    app.include_router(health.open_router)
    for module in (status, history, metrics, videos, dashboard):
        app.include_router(module.router, dependencies=guard)

    @app.get("/openapi.json", include_in_schema=False, dependencies=guard)
    async def openapi() -> dict[str, Any]:
        return app.openapi()

    _install_error_handlers(app)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET"],
            allow_headers=["Authorization"],
        )
    return app


ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


def create_metrics_app(status_app: FastAPI) -> FastAPI:
    """The metrics port's app: /metrics and the probes of `status_app`'s run directory, with no
    token. Prometheus scrapes every job's sidecar with one configuration, which can hold no
    job's Secret; the job's NetworkPolicy admits only the monitoring namespace to this port, and
    /status, /history and the dashboard stay behind the token on the status port."""
    app = FastAPI(
        title="ImpalaJob metrics", openapi_url=None, docs_url=None, redoc_url=None
    )  # fmt: skip
    app.state.sidecar = status_app.state.sidecar  # one reader: the same cached snapshot
    app.include_router(health.open_router)
    app.include_router(metrics.router)
    _install_error_handlers(app)
    return app


def by_port(status_app: ASGIApp, metrics_app: ASGIApp, metrics_port: int) -> ASGIApp:
    """One ASGI app for a server listening on both ports: a connection to `metrics_port` (the
    socket's own address, `scope["server"]`) reaches `metrics_app`, any other `status_app`."""

    async def app(
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        server = scope.get("server")
        if scope["type"] == "http" and server is not None and server[1] == metrics_port:
            await metrics_app(scope, receive, send)
        else:
            await status_app(scope, receive, send)

    return app
