"""schemathesis against the live sidecar's /openapi.json: no server errors, responses conform.

Runs the schemathesis CLI (all checks, a bounded number of examples, fixed seed) against a real
uvicorn, for a healthy run directory, an empty one (every snapshot endpoint 503s) and a
token-protected one (schemathesis also checks that requests without the token are refused).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.sample_run import write_sample_run
from impala_api.snapshot import STATUS_FILE
from impala_trainer.sidecar.settings import Settings
from tests.support.sidecar import serve_in_thread

pytestmark = pytest.mark.slow


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path, Settings], str]]:
    for key in list(os.environ):
        if key.startswith("IMPALA_STATUS_"):
            monkeypatch.delenv(key)
    stops: list[Callable[[], None]] = []

    def start(run_dir: Path, settings: Settings) -> str:
        url, stop = serve_in_thread(run_dir, "127.0.0.1", 0, settings=settings)
        stops.append(stop)
        return url

    yield start
    for stop in stops:
        stop()


# For a broken run directory the API must answer 503 by design, which schemathesis's own
# not_a_server_error counts as a failure; this check (loaded as a schemathesis hook) still fails
# any other 5xx, and any 503 that is not a documented snapshot error.
HOOKS = """
import os

import schemathesis

SNAPSHOT_ERRORS = {"missing", "partial", "corrupt", "invalid", "unreadable", "stale"}


@schemathesis.check
def only_snapshot_503s(ctx, response, case):
    if response.status_code < 500:
        return None
    with open(os.environ["SIDECAR_ST_SEEN"], "a") as f:  # proves the check ran
        f.write(f"{response.status_code}\\n")
    body = response.json()
    if response.status_code != 503 or body.get("error") not in SNAPSHOT_ERRORS:
        raise AssertionError(f"server error {response.status_code}: {response.text[:200]}")
    return None
"""


def _schemathesis(url: str, tmp_path: Path, *extra: str, degraded: bool = False) -> None:
    env = dict(os.environ)
    if degraded:
        (tmp_path / "sidecar_st_hooks.py").write_text(HOOKS)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
        env["SCHEMATHESIS_HOOKS"] = "sidecar_st_hooks"
        env["SIDECAR_ST_SEEN"] = str(tmp_path / "seen.txt")
        extra = (*extra, "--exclude-checks", "not_a_server_error")
    cmd = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        "25",
        "--seed",
        "1",
        "--generation-database",
        "none",
        "--workers",
        "1",
        "--no-color",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path / "schemathesis"),
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
    if degraded:
        seen = (tmp_path / "seen.txt").read_text().split()
        assert seen and set(seen) == {"503"}


@pytest.mark.parametrize("state", ["healthy", "corrupt", "empty"])
def test_schemathesis_finds_no_errors(
    serve: Callable[[Path, Settings], str], tmp_path: Path, state: str
) -> None:
    run_dir = tmp_path / "run"
    if state != "empty":
        write_sample_run(run_dir, points=50)
    if state == "corrupt":
        (run_dir / STATUS_FILE).write_text('{"job": "cartpole", "phase": ')
    url = serve(run_dir, Settings(run_dir=run_dir))
    _schemathesis(url, tmp_path, degraded=state != "healthy")


def test_schemathesis_with_a_token(serve: Callable[[Path, Settings], str], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_sample_run(run_dir, points=50)
    url = serve(run_dir, Settings(run_dir=run_dir, token="fuzz-token"))
    _schemathesis(url, tmp_path, "--header", "Authorization: Bearer fuzz-token")
