"""`impalajob operator`: run the ImpalaJob operator.

    impalajob operator --namespace team-a [--namespace team-b] [--kubeconfig PATH]
    impalajob operator --all-namespaces --metrics-port 9090 --health-port 8081
    impalajob operator --log-level debug          # kopf's and every handler run's lines too

Flags override the IMPALA_OPERATOR_* environment (impala_operator/settings.py). Without
--namespace and --all-namespaces it watches the kubeconfig context's namespace (in a pod: its own
namespace).
"""

from __future__ import annotations

import argparse

from impala_cli.commands import LOG_LEVELS
from impala_operator.settings import Settings


def register(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        default=None,
        help="reconcile only while holding the operator's Lease (for several replicas)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=LOG_LEVELS,
        help="how much to log (default info; debug: kopf's own lines and every handler run)",
    )


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
            "leader_elect": args.leader_elect,
        }.items()
        if value is not None
    }
    return Settings(**overrides)


def run(args: argparse.Namespace) -> int:
    from impala_operator.runtime.runner import serve

    serve(settings_from_args(args), log_level=args.log_level)
    return 0
