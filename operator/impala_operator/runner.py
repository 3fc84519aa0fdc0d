"""Running the operator process: kopf standalone (no peering objects), metrics and liveness.

`impalajob operator` (commands/operator.py) parses the flags into `Settings` and calls `serve`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import kopf

from impala_operator import handlers, kube, metrics
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


def serve(config: Settings, *, verbose: bool = False) -> None:
    """Run the operator until SIGINT/SIGTERM."""
    kopf.configure(verbose=verbose)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("impala_operator").setLevel(logging.INFO)
    if not verbose:
        # kopf logs every handler run at INFO ("Handler ... succeeded"): per job per tick.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if config.kubeconfig:
        # kopf's own login (kubernetes-client based) reads $KUBECONFIG: one identity for both.
        os.environ["KUBECONFIG"] = config.kubeconfig
    namespaces = [] if config.all_namespaces else config.namespaces
    if not config.all_namespaces and not namespaces:
        namespaces = [current_namespace(config.kubeconfig)]

    registry = kopf.OperatorRegistry()
    handlers.register(registry, config)
    api_client = kube.load_api_client(config.kubeconfig, pool_size=config.api_concurrency)
    memo = kopf.Memo(settings=config, api=kube.Api(api_client))
    metrics.serve(config.metrics_port)
    liveness = f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None
    log.info("watching %s", "all namespaces" if config.all_namespaces else ", ".join(namespaces))
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
