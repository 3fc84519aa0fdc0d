"""Reaching the cluster from a command: the kubeconfig (its context's namespace), else the pod's
in-cluster identity (its ServiceAccount's namespace).

`--kubeconfig` and `--context` pick them as kubectl's flags of those names do (as `kubectl
impalajob ...` users type them); `-n/--namespace` is each command's own. A kubeconfig or context
named on the command line that cannot be loaded is an error, never a fall back to another.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class NoClusterError(Exception):
    """Neither a kubeconfig nor an in-cluster configuration is available."""


@dataclass(frozen=True)
class Cluster:
    namespace: str
    """The namespace to use: the one asked for, else the configuration's, else `default`."""
    in_cluster: bool
    """True when running in a pod (cluster-internal addresses are then reachable)."""


@dataclass(frozen=True)
class Target:
    """The kubeconfig file and context a command was pointed at (None: kubectl's defaults,
    $KUBECONFIG or ~/.kube/config and its current context)."""

    kubeconfig: str | None = None
    context: str | None = None


_target = Target()


def use(target: Target) -> None:
    """Point every later `connect` of this process at `target` (the command line's flags)."""
    global _target
    _target = target


def connect(namespace: str | None) -> Cluster:
    """Load the Kubernetes client's configuration and settle the namespace."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    in_cluster = False
    named = _target.kubeconfig is not None or _target.context is not None
    try:
        config.load_kube_config(config_file=_target.kubeconfig, context=_target.context)
        if namespace is None:
            contexts, active = config.list_kube_config_contexts(config_file=_target.kubeconfig)
            if _target.context is not None:
                active = next(c for c in contexts if c["name"] == _target.context)
            namespace = (active or {}).get("context", {}).get("namespace")
    except (ConfigException, OSError) as err:
        if named:
            raise NoClusterError(_named_failed(err)) from err
        try:
            config.load_incluster_config()
            in_cluster = True
        except ConfigException as err:
            raise NoClusterError(f"no kubeconfig or in-cluster configuration ({err})") from err
        if namespace is None and os.path.exists(_SA_NAMESPACE):
            with open(_SA_NAMESPACE) as f:
                namespace = f.read().strip()
    return Cluster(namespace or "default", in_cluster)


def _named_failed(err: Exception) -> str:
    flags = {"--kubeconfig": _target.kubeconfig, "--context": _target.context}
    named = " ".join(f"{flag} {value}" for flag, value in flags.items() if value is not None)
    return f"{named}: {err}"
