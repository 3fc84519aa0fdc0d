"""A real Kubernetes control plane for the e2e tests (etcd + apiserver + controllers + kwok)."""

from .controlplane import ControlPlane, NodeSpec, build_binaries
from .kube import EXIT_CODE_ANNOTATION, CommandError, Kube, wait_for

__all__ = [
    "EXIT_CODE_ANNOTATION",
    "CommandError",
    "ControlPlane",
    "Kube",
    "NodeSpec",
    "build_binaries",
    "wait_for",
]
