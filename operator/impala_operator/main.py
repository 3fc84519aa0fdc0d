"""`impalajob operator`: run the ImpalaJob operator (kopf, standalone: no peering objects).

    impalajob operator --namespace team-a [--namespace team-b] [--kubeconfig PATH]
    impalajob operator --all-namespaces --metrics-port 9090 --health-port 8081

Flags override the IMPALA_OPERATOR_* environment (see settings.py). Without --namespace and
--all-namespaces it watches the kubeconfig context's namespace (in a pod: its own namespace).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path

import kopf

from impala_operator import apply, handlers, metrics
from impala_operator.settings import Settings

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def register(parser: argparse.ArgumentParser) -> None:
    """Add the operator's flags."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="namespace to watch (repeatable)",
    )
    where.add_argument(
        "--all-namespaces",
        "-A",
        action="store_true",
        default=None,
        help="watch every namespace (needs cluster-wide RBAC)",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, in-cluster)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus /metrics port (0: off)")
    parser.add_argument("--health-port", type=int, help="liveness /healthz port (0: off)")
    parser.add_argument(
        "--reconcile-interval", type=float, help="seconds between level-based reconciles"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")


def _current_namespace(kubeconfig: str | None) -> str:
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


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Environment settings with the given flags laid over them."""
    overrides = {
        key: value
        for key, value in {
            "namespaces": args.namespaces,
            "all_namespaces": args.all_namespaces,
            "kubeconfig": args.kubeconfig,
            "metrics_port": args.metrics_port,
            "health_port": args.health_port,
            "reconcile_interval": args.reconcile_interval,
        }.items()
        if value is not None
    }
    return Settings(**overrides)


def run(args: argparse.Namespace) -> int:
    """Run the operator until SIGINT/SIGTERM."""
    config = settings_from_args(args)
    kopf.configure(verbose=args.verbose)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("impala_operator").setLevel(logging.INFO)
    if not args.verbose:
        # kopf logs every handler run at INFO ("Handler ... succeeded"): per job per tick.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if config.kubeconfig:
        # kopf's own login (kubernetes-client based) reads $KUBECONFIG: one identity for both.
        os.environ["KUBECONFIG"] = config.kubeconfig
    namespaces = [] if config.all_namespaces else config.namespaces
    if not config.all_namespaces and not namespaces:
        namespaces = [_current_namespace(config.kubeconfig)]

    registry = kopf.OperatorRegistry()
    handlers.register(registry, config)
    api_client = apply.load_api_client(config.kubeconfig, pool_size=config.api_concurrency)
    memo = kopf.Memo(settings=config, api=apply.Api(api_client))
    metrics.serve(config.metrics_port)
    liveness = f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None
    logging.getLogger(__name__).info(
        "watching %s", "all namespaces" if config.all_namespaces else ", ".join(namespaces)
    )
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
    return 0
