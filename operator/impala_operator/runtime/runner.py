"""Running the operator process: leader election (optional), kopf standalone (no peering
objects: the Lease decides who reconciles), metrics and liveness.

`impalajob operator` (commands/operator.py) parses the flags into `Settings` and calls `serve`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kopf

from impala_operator.runtime import handlers, kube, metrics, token_key
from impala_operator.runtime.leader import LeaderElection
from impala_operator.settings import Settings

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
log = logging.getLogger(__name__)


def current_namespace(kubeconfig: str | None) -> str:
    """The kubeconfig context's namespace, else the pod's own, else "default"."""
    from kubernetes import config

    try:
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        namespace = active.get("context", {}).get("namespace")
        if namespace:
            return str(namespace)
    except (config.ConfigException, OSError, TypeError):
        pass
    if SA_NAMESPACE_FILE.exists():
        return SA_NAMESPACE_FILE.read_text().strip()
    return "default"


def _stop_on_sigterm(signum: int, frame: object) -> None:
    # A standby (or a leader still starting) asked to stop has nothing to hand over: exit 0,
    # as the kubelet expects of a pod it deletes, rather than die of the signal (exit 143).
    raise SystemExit(0)


def _lead(config: Settings, api_client: object) -> tuple[LeaderElection, threading.Event]:
    """Block until this replica holds the lease; exit the process if it ever loses it. Returns
    the election and the event that stops renewing (for the release at shutdown)."""
    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    election = LeaderElection(
        api_client,
        current_namespace(config.kubeconfig),
        config.lease_name,
        identity,
        duration=config.lease_duration,
        renew_every=max(1.0, config.lease_duration / 3),
        retry_every=max(1.0, config.lease_duration / 7),
    )
    # kopf's liveness endpoint starts only with kopf: answer the kubelet's probes meanwhile, or a
    # standby would be restarted over and over for failing them.
    standby = _standby_health(config.health_port) if config.health_port else None
    try:
        election.acquire()
    finally:
        if standby is not None:
            standby.shutdown()
            standby.server_close()

    def lost() -> None:
        # client-go's convention: a replica that may no longer lead stops at once; the kubelet
        # restarts it as a standby. Exiting beats racing the new leader on the same jobs.
        log.error("leadership lost; exiting so a standby leads")
        logging.shutdown()
        os._exit(1)

    stop = threading.Event()
    election.keep(lost, stop)
    return election, stop


def _standby_health(port: int) -> ThreadingHTTPServer:
    """A /healthz answering 200 while this replica stands by for the lease."""

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path.startswith("/healthz") else 404)
            self.end_headers()
            self.wfile.write(b"standing by for the lease\n")

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer(("0.0.0.0", port), Health)
    threading.Thread(target=server.serve_forever, name="standby-health", daemon=True).start()
    return server


LOG_LEVELS = {
    "critical": logging.CRITICAL,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
}
"""`--log-level`'s choices (the CLI's LOG_LEVELS) and the logging levels they set."""


def configure_logging(log_level: str = "info") -> None:
    """Logging for `impalajob operator --log-level LEVEL` (critical, error, warning, info, debug).

    `debug` is kopf's verbose mode (its own and the Kubernetes client's lines) with every handler
    run logged; `info` and above keep kopf's per-handler lines ("Handler ... succeeded", per job
    per tick) out; the operator's own lines show at `info` and at `debug` alike.
    """
    if log_level not in LOG_LEVELS:
        raise ValueError(f"unknown log level {log_level!r}")
    level = LOG_LEVELS[log_level]
    debug = level <= logging.DEBUG
    kopf.configure(verbose=debug)
    logging.getLogger().setLevel(level)
    logging.getLogger("httpx").setLevel(max(level, logging.WARNING))
    logging.getLogger("impala_operator").setLevel(max(level, logging.INFO))
    kopf_objects = logging.getLogger("kopf.objects")
    kopf_objects.setLevel(logging.NOTSET if debug else max(level, logging.WARNING))


def serve(config: Settings, *, log_level: str = "info") -> None:
    """Run the operator until SIGINT/SIGTERM."""
    configure_logging(log_level)
    if config.kubeconfig:
        # kopf's own login (kubernetes-client based) reads $KUBECONFIG: one identity for both.
        os.environ["KUBECONFIG"] = config.kubeconfig
    namespaces = [] if config.all_namespaces else config.namespaces
    if not config.all_namespaces and not namespaces:
        namespaces = [current_namespace(config.kubeconfig)]

    registry = kopf.OperatorRegistry()
    handlers.register(registry, config)
    api_client = kube.load_api_client(config.kubeconfig, pool_size=config.api_concurrency)
    metrics.serve(config.metrics_port)
    # kopf installs its own SIGTERM handling once it runs; until then a SIGTERM exits cleanly.
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    election = None
    if config.leader_elect:
        election = _lead(config, api_client)
    metrics.LEADER.set(1)  # a standby's scrapes read 0 until here
    own_namespace = current_namespace(config.kubeconfig)
    memo = kopf.Memo(
        settings=config,
        api=kube.Api(api_client),
        token_key=token_key.operator_key(api_client, own_namespace, config.token_key_secret),
        operator_namespace=own_namespace,
    )
    liveness = f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None
    log.info("watching %s", "all namespaces" if config.all_namespaces else ", ".join(namespaces))
    try:
        asyncio.run(
            kopf.operator(
                registry=registry,
                standalone=True,
                clusterwide=config.all_namespaces,
                namespaces=namespaces,
                liveness_endpoint=liveness,
                memo=memo,
            )
        )
    finally:
        if election is not None:
            # kopf has stopped every handler: hand the Lease over so a standby leads at once.
            leader, renewing = election
            renewing.set()
            leader.release()
