"""The optional bearer token: env var, mounted file (and its rotation), cookie for the dashboard."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from harness.net import free_port
from harness.sample_run import write_sample_run
from impala_api.roles import LOCAL_EXECUTABLE, status_command
from impala_trainer.sidecar.settings import Settings
from tests.support.sidecar import serve_in_thread

GUARDED = (
    "/status",
    "/history",
    "/metrics",
    "/",
    "/openapi.json",
    "/static/dashboard.js",
)
Serve = Callable[[Settings], httpx.Client]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    write_sample_run(tmp_path / "run", points=10)
    return tmp_path / "run"


@pytest.fixture
def serve(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Serve]:
    for key in list(os.environ):
        if key.startswith("IMPALA_STATUS_"):
            monkeypatch.delenv(key)
    stops: list[Callable[[], None]] = []

    def start(settings: Settings) -> httpx.Client:
        url, stop = serve_in_thread(run_dir, "127.0.0.1", 0, settings=settings)
        stops.append(stop)
        return httpx.Client(base_url=url, timeout=10)

    yield start
    for stop in stops:
        stop()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _assert_guarded(client: httpx.Client, token: str) -> None:
    assert client.get("/healthz").status_code == 200
    for path in GUARDED:
        r = client.get(path)
        assert r.status_code == 401, path
        assert r.headers["www-authenticate"] == 'Bearer realm="impala-status"', path
        assert r.json()["error"] == "unauthorized", path

        r = client.get(path, headers=_bearer(token + "x"))
        assert r.status_code == 401, path
        assert 'error="invalid_token"' in r.headers["www-authenticate"]
        assert r.json()["error"] == "invalid_token"

        r = client.get(path, headers={"Authorization": f"Basic {token}"})
        assert r.status_code == 401, path

        assert client.get(path, headers=_bearer(token)).status_code == 200, path


@pytest.fixture
def cli_server(run_dir: Path) -> Iterator[Callable[..., str]]:
    """`impalajob status-server` as a subprocess, as the sidecar container runs it."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*flags: str, env: dict[str, str]) -> str:
        port = free_port()
        clean = {k: v for k, v in os.environ.items() if not k.startswith("IMPALA_STATUS_")}
        proc = subprocess.Popen(
            [
                *status_command(
                    str(run_dir), status_port=port, host="127.0.0.1", executable=LOCAL_EXECUTABLE
                ),
                *flags,
            ],
            env={**clean, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0].decode()
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    return url
            except httpx.TransportError:
                time.sleep(0.1)
        raise AssertionError("status-server did not come up")

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def test_token_from_env_var_via_the_cli(cli_server: Callable[..., str]) -> None:
    url = cli_server(env={"IMPALA_STATUS_TOKEN": "s3cret-env"})
    with httpx.Client(base_url=url, timeout=10) as client:
        _assert_guarded(client, "s3cret-env")


def test_token_file_flag_via_the_cli(cli_server: Callable[..., str], tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")  # Secrets often end with a newline
    url = cli_server("--token-file", str(token_file), env={})
    with httpx.Client(base_url=url, timeout=10) as client:
        _assert_guarded(client, "from-a-file")


def test_token_file_from_env_and_rotation(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "secret" / "token"
    token_file.parent.mkdir()
    token_file.write_text("first")
    monkeypatch.setenv("IMPALA_STATUS_TOKEN_FILE", str(token_file))
    client = serve(Settings())
    _assert_guarded(client, "first")

    # Kubernetes rotates a mounted Secret by swapping the file: the new token applies at once.
    tmp = token_file.with_name("new")
    tmp.write_text("second-token")
    os.replace(tmp, token_file)
    assert client.get("/status", headers=_bearer("first")).status_code == 401
    assert client.get("/status", headers=_bearer("second-token")).status_code == 200


def test_unreadable_token_file_fails_closed(serve: Serve, tmp_path: Path) -> None:
    client = serve(Settings(token_file=tmp_path / "absent"))
    assert client.get("/healthz").status_code == 200
    r = client.get("/status", headers=_bearer("anything"))
    assert r.status_code == 503 and r.json()["error"] == "auth_unavailable"
    (tmp_path / "absent").write_text("")
    r = client.get("/status", headers=_bearer("anything"))
    assert r.status_code == 503 and "empty" in r.json()["detail"]


def test_openapi_advertises_the_bearer_scheme(serve: Serve) -> None:
    client = serve(Settings(token="t0k"))
    spec = client.get("/openapi.json", headers=_bearer("t0k")).json()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert spec["paths"]["/status"]["get"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in spec["paths"]["/healthz"]["get"]
    assert "security" not in spec["paths"]["/readyz"]["get"]  # the kubelet's probe


def test_dashboard_login_cookie(serve: Serve) -> None:
    client = serve(Settings(token="tok/with+odd chars"))
    browser = {"Accept": "text/html,application/xhtml+xml"}
    r = client.get("/", headers=browser)
    assert r.status_code == 401 and r.headers["content-type"].startswith("text/html")
    assert 'type="password"' in r.text and "impala_status_token" in r.text

    # What the login form stores: the URI-encoded token, sent back as a cookie.
    client.cookies.set("impala_status_token", "tok%2Fwith%2Bodd%20chars")
    assert client.get("/", headers=browser).status_code == 200
    assert client.get("/status").status_code == 200
    assert client.get("/static/dashboard.js").status_code == 200
    client.cookies.set("impala_status_token", "wrong")
    assert client.get("/status").status_code == 401


def test_no_token_configured_means_open(serve: Serve) -> None:
    client = serve(Settings(token=""))  # an empty env var / Secret key is "no token"
    for path in GUARDED:
        assert client.get(path).status_code == 200, path


def test_the_metrics_port_serves_metrics_alone_and_without_the_token(
    cli_server: Callable[..., str],
) -> None:
    """The sidecar as its container runs it: the token guards everything on the status port,
    /metrics included; the metrics port (what Prometheus scrapes, which holds no job's token)
    serves /metrics and the probes without it, and nothing else."""
    metrics_port = free_port()
    url = cli_server(f"--metrics-port={metrics_port}", env={"IMPALA_STATUS_TOKEN": "s3cret"})
    status = httpx.Client(base_url=url, timeout=10)
    _assert_guarded(status, "s3cret")
    metrics = httpx.Client(base_url=f"http://127.0.0.1:{metrics_port}", timeout=10)
    scraped = metrics.get("/metrics")
    assert scraped.status_code == 200 and "impala_env_steps_per_second{" in scraped.text
    assert scraped.text == status.get("/metrics", headers=_bearer("s3cret")).text
    assert metrics.get("/healthz").status_code == 200
    for path in ("/status", "/history", "/", "/openapi.json", "/static/dashboard.js"):
        assert metrics.get(path).status_code == 404, path
