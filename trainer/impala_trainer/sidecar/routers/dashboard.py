"""/ : the dashboard page, and /static/*: its script and stylesheet, shipped in the package.

No CDN and no JS libraries: the page draws its plots as SVG itself, so it works air-gapped and
behind `kubectl port-forward`. Asset URLs are relative, so it also works under a path prefix
(the API server's service proxy).
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import HTMLResponse, Response

_STATIC = files("impala_trainer.sidecar").joinpath("static")
_MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}


def _asset(name: str) -> bytes:
    return _STATIC.joinpath(name).read_bytes()


# Read once at import: the assets are a few kilobytes and never change while the server runs.
ASSETS: dict[str, tuple[bytes, str]] = {
    name: (_asset(name), _MEDIA_TYPES["." + name.rsplit(".", 1)[1]])
    for name in ("dashboard.js", "dashboard.css")
}
INDEX_HTML = _asset("index.html").decode()
LOGIN_HTML = _asset("login.html").decode()

router = APIRouter(tags=["dashboard"])


# A browser gets the login page with its 401, an API client the usual JSON error.
_LOGIN_401: dict[int | str, dict[str, Any]] = {
    401: {
        "description": "Missing or wrong token: a login page for browsers, JSON otherwise",
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}},
            "text/html": {"schema": {"type": "string"}},
        },
    }
}


@router.get("/", response_class=HTMLResponse, responses=_LOGIN_401)
async def dashboard() -> HTMLResponse:
    """The live dashboard (HTML; polls /status and /history)."""
    return HTMLResponse(INDEX_HTML)


@router.get("/static/{name}", include_in_schema=False)
async def static_asset(name: str) -> Response:
    # A fixed table, not a directory mount: no path can reach outside the shipped assets.
    if name not in ASSETS:
        raise HTTPException(status_code=404, detail=f"no asset named {name!r}")
    content, media_type = ASSETS[name]
    return Response(content, media_type=media_type, headers={"Cache-Control": "max-age=300"})
