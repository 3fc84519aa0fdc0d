"""A real S3-compatible server for the storage tests: versitygw's posix backend over a directory
(built from its Go module by build-s3.sh), not a mock library.

    with S3Server(tmp_dir) as s3:          # s3.endpoint, s3.access_key, s3.secret_key
        ...

Object metadata goes to a sidecar directory, so the data directory's filesystem needs no
extended attributes. `host` is where it listens: 127.0.0.1 for tests on this machine, the host
end of the real node's link (node.HOST_IP) for pods.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

HERE = Path(__file__).resolve().parent
HEALTH_PATH = "/health"


def versitygw_binary() -> Path:
    """The versitygw binary, built and cached by build-s3.sh on first use."""
    proc = subprocess.run(
        ["bash", str(HERE / "build-s3.sh")], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"build-s3.sh failed (Go from the module proxy is needed):\n{proc.stderr}"
        )
    return Path(proc.stdout.strip().splitlines()[-1]) / "versitygw"


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class S3Server:
    """versitygw serving `workdir/data` on `host`, root credentials random per server."""

    def __init__(self, workdir: Path, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.host = host
        self.port = port or _free_port(host)
        self.access_key = f"impala{secrets.token_hex(4)}"
        self.secret_key = secrets.token_urlsafe(24)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        data, meta = self.workdir / "data", self.workdir / "meta"
        data.mkdir(parents=True, exist_ok=True)
        meta.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "versitygw.log", "ab")  # noqa: SIM115 (the process owns it)
        self._proc = subprocess.Popen(
            [
                str(versitygw_binary()),
                "--port", f"{self.host}:{self.port}",
                "--access", self.access_key,
                "--secret", self.secret_key,
                "--health", HEALTH_PATH,
                "--quiet",
                "posix", "--sidecar", str(meta), str(data),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"versitygw exited {self._proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.endpoint + HEALTH_PATH, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"versitygw did not answer on {self.endpoint}: {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        path = self.workdir / "versitygw.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
