"""Reaching the cluster from a command: the kubeconfig (its context's namespace), else the pod's
in-cluster identity (its ServiceAccount's namespace)."""

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


def connect(namespace: str | None) -> Cluster:
    """Load the Kubernetes client's configuration and settle the namespace."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    in_cluster = False
    try:
        config.load_kube_config()
        if namespace is None:
            _, active = config.list_kube_config_contexts()
            namespace = (active or {}).get("context", {}).get("namespace")
    except ConfigException:
        try:
            config.load_incluster_config()
            in_cluster = True
        except ConfigException as err:
            raise NoClusterError(f"no kubeconfig or in-cluster configuration ({err})") from err
        if namespace is None and os.path.exists(_SA_NAMESPACE):
            with open(_SA_NAMESPACE) as f:
                namespace = f.read().strip()
    return Cluster(namespace or "default", in_cluster)
