"""Ray's token auth as the operator turns it on: every pod of a job gets RAY_AUTH_TOKEN from the
job's auth Secret, and `node.ray_node.ray_env` switches Ray to token mode when it is set. A head
started that way refuses a client holding another token and admits one holding its own (the
multi-pod test proves rollout and aggregator nodes join and train with it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from harness.net import free_port
from impala_trainer.node.ray_node import NodeConfig, forget_stale_head, port_open, ray_env

pytestmark = [pytest.mark.slow]

TOKEN = "a1" * 32
CONNECT = (
    "import ray, sys\n"
    "try:\n"
    "    ray.init(address=sys.argv[1], logging_level='ERROR')\n"
    "except ConnectionError as err:\n"
    "    print('refused:', err); sys.exit(3)\n"
    "print('joined', len(ray.nodes()))\n"
)


def _env(token: str | None) -> dict[str, str]:
    saved = os.environ.get("RAY_AUTH_TOKEN")
    os.environ.pop("RAY_AUTH_TOKEN", None)
    if token:
        os.environ["RAY_AUTH_TOKEN"] = token
    try:
        return ray_env()
    finally:
        os.environ.pop("RAY_AUTH_TOKEN", None)
        if saved is not None:
            os.environ["RAY_AUTH_TOKEN"] = saved


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Ray head in token mode, `ray start --block` in a session of its own: stopping it kills
    only its processes (`ray stop` would take every Ray on the machine)."""
    port = free_port()
    env = _env(TOKEN)
    assert env["RAY_AUTH_MODE"] == "token"
    log = tmp_path_factory.mktemp("ray") / "head.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["ray", "start", "--head", "--block", f"--port={port}", "--num-cpus=0",
             "--include-dashboard=false"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not port_open("127.0.0.1", port):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            # Its graceful stop has taken the whole 30 s it was once given: a short grace, then
            # the session's processes are killed, which is all the teardown needs.
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # `ray start` left its address in Ray's temp dir: a later bare ray.init() would try to
        # join this stopped head.
        forget_stale_head(NodeConfig(head=True, gcs_port=port))


def _connect(address: str, token: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CONNECT, address],
        env=_env(token), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_client_with_another_token_is_refused(head: str) -> None:
    proc = _connect(head, "b2" * 32)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "InvalidAuthToken" in proc.stderr or "Unauthenticated" in proc.stderr


def test_a_client_with_the_jobs_token_joins(head: str) -> None:
    proc = _connect(head, TOKEN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("joined")
