"""The status sidecar on a daemon thread of the test process: a real uvicorn on a free port."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import uvicorn

from impala_trainer.sidecar.app import create_app
from impala_trainer.sidecar.settings import Settings


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
