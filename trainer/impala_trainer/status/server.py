"""`impalajob status-server`: serve a run directory over REST; and `serve_in_thread` for
`impalajob train --dashboard`, which runs the same app next to a local training run."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import uvicorn

from impala_trainer.status.main import create_app
from impala_trainer.status.settings import Settings

log = logging.getLogger(__name__)


def register(parser: argparse.ArgumentParser) -> None:
    """Flags of `impalajob status-server`; anything unset falls back to IMPALA_STATUS_*."""
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="run directory to serve (default: $IMPALA_STATUS_RUN_DIR or .)",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    parser.add_argument(
        "--job",
        dest="job_name",
        default=None,
        help="job name for the metrics label (default: from the snapshot)",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help="require the bearer token in this file (or set IMPALA_STATUS_TOKEN)",
    )
    parser.add_argument(
        "--ready-max-age",
        dest="ready_max_age_seconds",
        type=float,
        default=None,
        help="seconds before /readyz calls a running job stale",
    )
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="log every request (off by default: probes would flood the log)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from the environment with the flags that were given on top."""
    keys = ("run_dir", "job_name", "token_file", "ready_max_age_seconds")
    given = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    return Settings(**given)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT."""
    settings = settings_from_args(args)
    if not settings.run_dir.is_dir():
        # Not fatal: the learner container may create it after the sidecar starts.
        print(f"warning: run directory {settings.run_dir} does not exist yet", file=sys.stderr)
    if settings.token_file is not None and not settings.token_file.is_file():
        # Requests will get 503 (fail closed) until the file appears; say so now.
        print(f"warning: token file {settings.token_file} is missing", file=sys.stderr)
    app = create_app(settings)
    auth = "token required" if settings.auth_enabled else "no token"
    print(f"serving {settings.run_dir} on http://{args.host}:{args.port} ({auth})", flush=True)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        server_header=False,
        proxy_headers=False,
    )
    return 0


def _display_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def serve_in_thread(
    run_dir: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    settings: Settings | None = None,
    startup_timeout: float = 10.0,
) -> tuple[str, Callable[[], None]]:
    """Start the sidecar on a daemon thread; returns (base URL, stop function).

    `port=0` picks a free port. The socket is bound here, before the thread starts, so a busy
    port fails in the caller with OSError and the returned URL is already connectable.
    `settings` (optional) supplies the other knobs; `run_dir` always wins.
    """
    base = settings if settings is not None else Settings()
    settings = base.model_copy(update={"run_dir": Path(run_dir)})
    app = create_app(settings)

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    bound_port = sock.getsockname()[1]

    # log_config=None: do not let uvicorn reconfigure the logging of the process hosting us.
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        server_header=False,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="impala-status-server", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"status server did not start on {host}:{bound_port}")
        time.sleep(0.01)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()

    return f"http://{_display_host(host)}:{bound_port}", stop
