"""`impalajob status TARGET` against a live sidecar, by URL and by job name.

For a job name the command reads the ImpalaJob's status.statusURL and the job's status token (its
auth Secret) through the Kubernetes client. Here a minimal HTTP server plays the API server's
GETs, reached through a real kubeconfig, so the kubeconfig/namespace resolution and the request
paths are exercised without a cluster.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote

import httpx
import pytest

from harness.sample_run import write_sample_run
from impala_api.names import STATUS_TOKEN_KEY
from impala_api.snapshot import SUMMARY_FILE, Summary, write_json_atomic
from impala_cli.main import main
from impala_trainer.sidecar.settings import Settings
from tests.support.jobs import job_manifest
from tests.support.sidecar import serve_in_thread

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    """The command in a subprocess, as a user runs it (fresh imports, its own KUBECONFIG)."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("IMPALA_STATUS_")}
        base.setdefault("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
        return subprocess.run(
            [sys.executable, "-m", "impala_cli.main", "status", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**base, **(env or {})},
        )

    return run


@pytest.fixture
def cli_inproc(capsys: pytest.CaptureFixture[str]) -> Cli:
    """The command in this process (fast): for URL targets, which need no environment."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        assert not env
        capsys.readouterr()
        rc = main(["status", *args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["impalajob", "status", *args], rc, out, err)

    return run


@pytest.fixture
def sidecar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    for key in list(os.environ):
        if key.startswith("IMPALA_STATUS_"):
            monkeypatch.delenv(key)
    stops: list[Callable[[], None]] = []

    def start(run_dir: Path, **settings: object) -> str:
        url, stop = serve_in_thread(run_dir, "127.0.0.1", 0, settings=Settings(**settings))
        stops.append(stop)
        return url

    yield start
    for stop in stops:
        stop()


def test_table_by_url(cli_inproc: Cli, sidecar: Callable[..., str], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    snap, _ = write_sample_run(run_dir, job="cartpole", points=40)
    write_json_atomic(
        run_dir / SUMMARY_FILE,
        Summary(job="cartpole", timesteps=20_000, wall_seconds=28.0, stopped_by="timesteps"),
    )
    url = sidecar(run_dir)
    proc = cli_inproc(url + "/status")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "ImpalaJob cartpole" in out
    assert "Running (training)" in out
    c = snap.counters
    assert f"{c.num_env_steps_sampled:,} / {c.num_env_steps_trained:,}" in out
    assert f"{snap.episode_return_mean:,.2f}" in out
    assert "4 rollouts on 2 nodes (busy 42%), 2 aggregators on 2 nodes" in out
    assert "checkpoints/000010" in out
    assert "stopped by timesteps" in out
    assert "vf_loss 0.84" in out


def test_json_by_url(cli_inproc: Cli, sidecar: Callable[..., str], tmp_path: Path) -> None:
    write_sample_run(tmp_path / "run", points=10)
    url = sidecar(tmp_path / "run")
    proc = cli_inproc(url, "--json")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    served = httpx.get(f"{url}/status").json()
    printed.pop("age_seconds"), served.pop("age_seconds")
    assert printed == served


def test_token_flag_and_env(
    cli: Cli, cli_inproc: Cli, sidecar: Callable[..., str], tmp_path: Path
) -> None:
    write_sample_run(tmp_path / "run", points=10)
    url = sidecar(tmp_path / "run", token="cli-token")
    refused = cli_inproc(url)
    assert refused.returncode == 1
    assert "answered 401: unauthorized" in refused.stderr
    assert cli(url, env={"IMPALA_STATUS_TOKEN": "cli-token"}).returncode == 0
    good, bad = tmp_path / "good-token", tmp_path / "bad-token"
    good.write_text("cli-token\n")  # as `kubectl get secret ... | base64 -d >FILE` leaves it
    bad.write_text("nope")
    assert cli_inproc(url, "--token-file", str(good)).returncode == 0
    assert "invalid_token" in cli_inproc(url, "--token-file", str(bad)).stderr
    # The file wins over the environment, as the flag did.
    assert cli(url, "--token-file", str(good), env={"IMPALA_STATUS_TOKEN": "nope"}).returncode == 0


def test_token_file_problems_are_usage_errors_and_a_token_on_argv_still_works(
    cli_inproc: Cli,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = cli_inproc("http://127.0.0.1:9", "--token-file", str(tmp_path / "absent"))
    assert missing.returncode == 2
    assert f"cannot read --token-file {tmp_path / 'absent'}: No such file" in missing.stderr
    (tmp_path / "empty").write_text("\n")
    empty = cli_inproc("http://127.0.0.1:9", "--token-file", str(tmp_path / "empty"))
    assert empty.returncode == 2 and "is empty" in empty.stderr
    # A token on argv is refused (`ps` would show it), and never read as a path through a
    # prefix of --token-file.
    for argv in (["--token", "secret"], ["--token=secret"], ["--token-f", "secret"]):
        with pytest.raises(SystemExit) as refused:
            main(["status", "http://127.0.0.1:9", *argv])
        assert refused.value.code == 2
        assert "unrecognized arguments: --token" in capsys.readouterr().err


def test_errors_are_one_line_messages(
    cli_inproc: Cli, sidecar: Callable[..., str], tmp_path: Path
) -> None:
    url = sidecar(tmp_path / "empty")
    proc = cli_inproc(url)
    assert proc.returncode == 1
    assert "answered 503: missing: run directory" in proc.stderr
    assert "Traceback" not in proc.stderr

    proc = cli_inproc("http://127.0.0.1:9", "--timeout", "2")  # discard port: nothing listens
    assert proc.returncode == 1 and "cannot reach http://127.0.0.1:9" in proc.stderr


def test_url_targets_import_neither_torch_nor_kubernetes(
    sidecar: Callable[..., str], tmp_path: Path
) -> None:
    write_sample_run(tmp_path / "run", points=3)
    url = sidecar(tmp_path / "run")
    code = (
        "import sys; from impala_cli.main import main; rc = main(['status', sys.argv[1], "
        "'--json']); print(sorted(m for m in ('torch', 'ray', 'kubernetes', 'fastapi') "
        "if m in sys.modules), file=sys.stderr); sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, url], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "[]"


class _FakeApiServer(BaseHTTPRequestHandler):
    """Answers GET .../namespaces/<ns>/impalajobs/<name> from `objects`; 404 otherwise."""

    objects: ClassVar[dict[str, dict]] = {}
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        # Clients may escape the `:` of `service:port` in proxy paths; the API server accepts both.
        path = unquote(self.path)
        self.seen.append((path, self.headers.get("Authorization")))
        obj = self.objects.get(path)
        body = json.dumps(
            obj
            or {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "NotFound",
                "code": 404,
                "message": "not found",
            }
        ).encode()
        self.send_response(200 if obj else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[tuple[Path, type[_FakeApiServer]]]:
    handler = type("Handler", (_FakeApiServer,), {"objects": {}, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
        ],
        "users": [{"name": "u", "user": {"token": "kube-token"}}],
        "contexts": [
            {"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}
        ],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))  # JSON is YAML
    yield path, handler
    server.shutdown()
    server.server_close()


def _job(namespace: str, name: str, status_url: str | None) -> tuple[str, dict]:
    path = f"/apis/impala.dev/v1alpha1/namespaces/{namespace}/impalajobs/{name}"
    obj = {
        **job_manifest(name, namespace=namespace),
        "status": {"phase": "Running", **({"statusURL": status_url} if status_url else {})},
    }
    return path, obj


def _secret(namespace: str, name: str, token: str) -> tuple[str, dict]:
    """The job's auth Secret as the operator makes it (`<job>-auth`)."""
    data = {STATUS_TOKEN_KEY: base64.b64encode(token.encode()).decode()}
    obj = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": data,
           "metadata": {"name": f"{name}-auth", "namespace": namespace}}  # fmt: skip
    return f"/api/v1/namespaces/{namespace}/secrets/{name}-auth", obj


@pytest.mark.slow  # three CLI subprocesses, each importing the Kubernetes client
def test_job_name_resolves_through_status_url(
    cli: Cli, sidecar: Callable[..., str], kubeconfig: tuple, tmp_path: Path
) -> None:
    path, handler = kubeconfig
    write_sample_run(tmp_path / "run", job="pong", points=10)
    # Security on, as the operator sets it: the sidecar wants the job's token, which only the
    # job's auth Secret holds.
    url = sidecar(tmp_path / "run", token="job-token")
    # The operator may publish the base URL or its /status endpoint; both work.
    handler.objects.update([_job("team-a", "pong", url), _job("team-b", "pong", url + "/status")])
    handler.objects.update([_secret(ns, "pong", "job-token") for ns in ("team-a", "team-b")])
    env = {"KUBECONFIG": str(path)}

    proc = cli("pong", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "ImpalaJob pong" in proc.stdout
    # The job, then its Secret, read with the kubeconfig's credentials.
    assert handler.seen[-2:] == [
        ("/apis/impala.dev/v1alpha1/namespaces/team-a/impalajobs/pong", "Bearer kube-token"),
        ("/api/v1/namespaces/team-a/secrets/pong-auth", "Bearer kube-token"),
    ]

    proc = cli("pong", "-n", "team-b", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["job"] == "pong"

    proc = cli("missing-job", env=env)
    assert proc.returncode == 1
    assert "ImpalaJob team-a/missing-job not found" in proc.stderr


def test_job_name_with_token_file_skips_the_secret(
    cli: Cli, sidecar: Callable[..., str], kubeconfig: tuple, tmp_path: Path
) -> None:
    path, handler = kubeconfig
    write_sample_run(tmp_path / "run", job="pong", points=10)
    url = sidecar(tmp_path / "run", token="job-token")
    handler.objects.update([_job("team-a", "pong", url)])  # and no Secret to read
    token_file = tmp_path / "token"
    token_file.write_text("job-token")
    proc = cli("pong", "--json", "--token-file", str(token_file), env={"KUBECONFIG": str(path)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["job"] == "pong"
    assert [p for p, _ in handler.seen] == [
        "/apis/impala.dev/v1alpha1/namespaces/team-a/impalajobs/pong"
    ]


def test_job_name_without_status_url(cli: Cli, kubeconfig: tuple) -> None:
    path, handler = kubeconfig
    handler.objects.update([_job("team-a", "fresh", None)])
    proc = cli("fresh", env={"KUBECONFIG": str(path)})
    assert proc.returncode == 1
    assert "has no status.statusURL yet" in proc.stderr


def test_a_finished_job_still_answers_from_its_status(cli: Cli, kubeconfig: tuple) -> None:
    """Its pods, the sidecar among them, are gone: the final figures come from the CR."""
    path, handler = kubeconfig
    key, obj = _job("team-a", "done", "http://done-status.team-a.svc:8080")
    obj["spec"]["checkpoint"] = {"volumeClaim": "done-results"}
    obj["status"] |= {
        "phase": "Succeeded",
        "message": "stop criterion evaluationReturnMean met",
        "completionTime": "2026-11-25T12:00:00Z",
        "progress": {"timesteps": 223232, "episodes": 681, "episodeReturnMean": 480.8,
                     "evaluationReturnMean": 500.0, "evaluationTimesteps": 200000,
                     "bestEvaluationReturnMean": 500.0, "bestCheckpoint": "checkpoints/best"},
    }  # fmt: skip
    handler.objects[key] = obj
    proc = cli("done", env={"KUBECONFIG": str(path)})
    assert proc.returncode == 0, proc.stderr
    for text in ("Succeeded (stop criterion evaluationReturnMean met)", "223,232", "480.80",
                 "500.00 at 200,000 steps", "checkpoints/best", "volumeClaim done-results"):
        assert text in proc.stdout, text  # fmt: skip
    assert not any("proxy" in seen for seen, _ in handler.seen)  # no sidecar asked
    final = json.loads(cli("done", "--json", env={"KUBECONFIG": str(path)}).stdout)
    assert final["phase"] == "Succeeded" and final["results"] == {"volumeClaim": "done-results"}


def test_service_url_is_read_through_the_api_server_proxy(
    cli: Cli, sidecar: Callable[..., str], kubeconfig: tuple, tmp_path: Path
) -> None:
    # From a kubeconfig, a cluster-internal Service address is not reachable; the CLI asks the
    # API server's Service proxy instead, with the kubeconfig's credentials.
    path, handler = kubeconfig
    write_sample_run(tmp_path / "run", job="far", points=5)
    body = httpx.get(sidecar(tmp_path / "run") + "/status", timeout=10).json()
    handler.objects.update([_job("team-a", "far", "http://far-status.team-a.svc:8080/status")])
    proxy = "/api/v1/namespaces/team-a/services/far-status:8080/proxy/status"
    handler.objects[proxy] = body
    proc = cli("far", "--json", env={"KUBECONFIG": str(path)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["job"] == "far"
    assert handler.seen[-1] == (proxy, "Bearer kube-token")


def test_service_proxy_failure_names_the_service(cli: Cli, kubeconfig: tuple) -> None:
    path, handler = kubeconfig
    handler.objects.update([_job("team-a", "gone", "http://gone-status.team-a.svc:8080")])
    proc = cli("gone", "--timeout", "2", env={"KUBECONFIG": str(path)})
    assert proc.returncode == 1
    assert "gone-status.team-a.svc:8080/status (through the API server's Service proxy)" in (
        proc.stderr
    )
    assert "answered 404" in proc.stderr


def test_unreachable_status_url_is_named(cli: Cli, kubeconfig: tuple) -> None:
    # A URL that is not a Service address is fetched directly; failing, the CLI names it.
    path, handler = kubeconfig
    handler.objects.update([_job("team-a", "far", "http://127.0.0.1:9/far")])
    proc = cli("far", "--timeout", "2", env={"KUBECONFIG": str(path)})
    assert proc.returncode == 1
    assert "cannot reach http://127.0.0.1:9/far" in proc.stderr
