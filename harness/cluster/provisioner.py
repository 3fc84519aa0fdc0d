"""Storage for the real node: Rancher's local-path provisioner (v0.0.30, built from its Go module
by build.sh), the dynamic provisioner kind and k3s ship, so a claim with no volume binds as on
a real cluster and the examples apply unchanged.

As in its own deploy/local-path-storage.yaml: namespace `local-path-storage`, ConfigMap
`local-path-config` (node path map, setup/teardown scripts, helper pod), StorageClass
`local-path` (WaitForFirstConsumer, reclaim Delete), marked the cluster's default. Two
differences: the provisioner runs as a host process beside the control plane (as Kueue does:
its image is not reachable from here), and its helper pods, which create and remove each
volume's directory on the node, run the product image (Debian: `sh`, `mkdir`, `rm`) instead of
busybox, which no registry here serves. Volumes live under the work dir, so they go with the
cluster.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

NAMESPACE = "local-path-storage"
CONFIG_MAP = "local-path-config"
SERVICE_ACCOUNT = "local-path-provisioner-service-account"
STORAGE_CLASS = "local-path"
PROVISIONER = "rancher.io/local-path"

SETUP = '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n'
TEARDOWN = '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n'


def helper_pod(image: str) -> dict[str, Any]:
    """The pod that makes or removes one volume's directory (the provisioner adds the command,
    the scripts and the host directory)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            "priorityClassName": "system-node-critical",
            "tolerations": [
                {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists",
                 "effect": "NoSchedule"},
            ],
            "containers": [
                {"name": "helper-pod", "image": image, "imagePullPolicy": "IfNotPresent",
                 "securityContext": {"runAsUser": 0, "runAsGroup": 0}},
            ],
        },
    }  # fmt: skip


def objects(volumes: Path, image: str) -> list[dict[str, Any]]:
    """What the provisioner's deploy YAML applies, but its Deployment and RBAC."""
    config = {"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES",
                               "paths": [str(volumes)]}]}  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
            "data": {
                "config.json": json.dumps(config),
                "setup": SETUP,
                "teardown": TEARDOWN,
                "helperPod.yaml": yaml.safe_dump(helper_pod(image)),
            },
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
        },
    ]


def start(
    spawn: Callable[[str, Sequence[str]], Any],
    apply: Callable[[list[dict[str, Any]]], None],
    *,
    bin_dir: Path,
    workdir: Path,
    kubeconfig: Path,
    image: str,
) -> Path:
    """Apply the provisioner's objects and run it; the directory its volumes go under."""
    home = workdir / "local-path"
    volumes = home / "volumes"
    volumes.mkdir(parents=True, exist_ok=True)
    docs = objects(volumes, image)
    apply(docs)
    config_map = docs[2]["data"]
    (home / "config.json").write_text(config_map["config.json"])
    (home / "helperPod.yaml").write_text(config_map["helperPod.yaml"])
    spawn(
        "local-path-provisioner",
        [
            str(bin_dir / "local-path-provisioner"),
            "start",
            f"--config={home / 'config.json'}",
            f"--helper-pod-file={home / 'helperPod.yaml'}",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}",
            f"--configmap-name={CONFIG_MAP}",
            f"--service-account-name={SERVICE_ACCOUNT}",
            f"--helper-image={image}",
            f"--provisioner-name={PROVISIONER}",
        ],
    )
    return volumes
