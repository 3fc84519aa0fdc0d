"""`impalajob status-server`: serve a run directory over REST (the learner pod's status sidecar,
and `impalajob train --dashboard`'s child process)."""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path
from typing import cast

import uvicorn

from impala_api.roles import STATUS_PORT
from impala_cli.commands import LOG_LEVELS
from impala_trainer.sidecar.app import ASGIApp, by_port, create_app, create_metrics_app
from impala_trainer.sidecar.settings import Settings


def register(parser: argparse.ArgumentParser) -> None:
    """Flags of `impalajob status-server`; anything unset falls back to IMPALA_STATUS_*."""
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="run directory to serve (default: $IMPALA_STATUS_RUN_DIR or .)",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument(
        "--status-port", type=int, default=STATUS_PORT, help=f"port (default {STATUS_PORT})"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="also serve /metrics and the probes on this port, without the token (what "
        "Prometheus scrapes; the job's NetworkPolicy admits only the monitoring namespace)",
    )
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
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)


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
    url = f"http://{args.host}:{args.status_port}"
    print(f"serving {settings.run_dir} on {url} ({auth})", flush=True)
    ports, served = [args.status_port], cast("ASGIApp", app)
    if args.metrics_port is not None:
        ports.append(args.metrics_port)
        served = by_port(app, create_metrics_app(app), args.metrics_port)
        print(f"serving /metrics on http://{args.host}:{args.metrics_port} (no token)", flush=True)
    config = uvicorn.Config(
        served,
        log_level=args.log_level,
        access_log=args.access_log,
        server_header=False,
        proxy_headers=False,
    )
    sockets = [_listen(args.host, port) for port in ports]
    uvicorn.Server(config).run(sockets=sockets)
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """A bound, listening socket: one server serves the status and metrics ports together."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
