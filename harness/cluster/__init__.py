"""A real Kubernetes control plane for the e2e tests and the operator benchmarks (etcd + apiserver
+ controllers + kwok); `python -m harness.cluster` starts one by hand."""

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
