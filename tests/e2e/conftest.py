"""Fixtures for the e2e tests: a real control plane (or an existing cluster) per session.

`kube` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok once per
session (building the binaries first if they are not cached). With IMPALA_E2E_EXISTING_CLUSTER=1
the tests use the cluster in $KUBECONFIG instead. See docs/testing.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from harness.cluster import ControlPlane, Kube, NodeSpec, build_binaries
from harness.cluster.controlplane import COMPONENTS
from harness.cluster.node import RealNode


def _existing_cluster() -> Kube | None:
    if os.environ.get("IMPALA_E2E_EXISTING_CLUSTER", "") in ("", "0"):
        return None
    kubeconfig = os.environ.get("KUBECONFIG", "")
    if not kubeconfig:
        pytest.exit("IMPALA_E2E_EXISTING_CLUSTER=1 needs KUBECONFIG", returncode=4)
    # Prefer the cached kubectl/helm (known versions); fall back to whatever is on PATH.
    bin_dir: Path | None
    try:
        bin_dir = build_binaries("kubectl", "helm", quiet=True)
    except (OSError, subprocess.CalledProcessError):
        bin_dir = None
    kube = Kube(
        kubeconfig=Path(kubeconfig.split(os.pathsep)[0]),
        bin_dir=bin_dir,
        workdir=Path(tempfile.mkdtemp(prefix="impala-e2e-")),
        is_local=False,
    )
    version = json.loads(kube.kubectl("get", "--raw", "/version").stdout)
    kube.version = str(version["gitVersion"])
    return kube


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    # pytest turns KeyboardInterrupt into an orderly shutdown that runs fixture teardown, so a CI
    # timeout (SIGTERM) cleans up the control plane just like Ctrl-C does.
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def kube() -> Iterator[Kube]:
    """The cluster under test: the local control plane, or $KUBECONFIG's cluster if asked."""
    existing = _existing_cluster()
    if existing is not None:
        yield existing
        shutil.rmtree(existing.workdir, ignore_errors=True)
        return
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        with ControlPlane.start(build_binaries(*COMPONENTS)) as k:
            yield k
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    with kube.namespace(request.node.name) as ns:
        yield ns


@pytest.fixture
def kwok_only(kube: Kube) -> None:
    """Skip on an existing cluster: the test drives pod phases through kwok."""
    if not kube.is_local:
        pytest.skip("needs the local kwok control plane")


REPO = Path(__file__).resolve().parents[2]
BUILD_IMAGE = REPO / "hack" / "build-image.sh"


def build_image() -> Path:
    """The product image as an OCI archive (hack/build-image.sh; cached by content)."""
    proc = subprocess.run(
        ["bash", str(BUILD_IMAGE)], stdout=subprocess.PIPE, text=True, check=True, cwd=REPO
    )
    return Path(proc.stdout.strip().splitlines()[-1])


PRODUCT_IMAGE = "impalajob:0.1.0"
"""The image hack/build-image.sh builds (its default `IMAGE`); on the real node it also runs the
local-path provisioner's helper pods."""

JOB_IMAGE = "my-impala:0.1.0"
"""The image manifests/examples/custom.yaml runs: the product image with examples/custom added."""


def build_job_image() -> Path:
    """examples/custom/Dockerfile (FROM the product image) built as a user builds it
    (hack/build-job-image.sh; cached by content), as an OCI archive."""
    proc = subprocess.run(
        ["bash", str(REPO / "hack" / "build-job-image.sh"), "examples/custom", JOB_IMAGE],
        stdout=subprocess.PIPE, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def real_kube() -> Iterator[Kube]:
    """A control plane with one real node and no kwok nodes, with the product image imported
    and a default StorageClass (the local-path provisioner): pods run for real, and manifests
    apply unchanged. Per module, so its containers do not
    compete with the rest of the session for the CPU."""
    if os.environ.get("IMPALA_E2E_EXISTING_CLUSTER", "") not in ("", "0"):
        pytest.skip("the real-node tests start their own cluster")
    if os.geteuid() != 0:
        # Network namespaces, mounts and cgroups; tests/run.sh (CI) runs as root.
        pytest.skip("the real node needs root")
    archives = [build_image(), build_job_image()]
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        with ControlPlane.start(
            build_binaries(),
            nodes=NodeSpec(count=0),
            real_node=True,
            images=archives,
            taint_real_node=False,
            timeout=900,
            storage_image=PRODUCT_IMAGE,
        ) as k:
            workdir = k.workdir
            yield k
        # The teardown is part of the contract: nothing of the node stays on the host.
        leftovers = RealNode(Path(), workdir).leftovers()
        assert not leftovers, f"the real node left behind: {leftovers}"
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


REAL_NODE_REPORT: list[str] = []
"""What the real-node tests saw (pod names, nodes, returns, fault timings): printed at the end of
the session, so CI's log shows it whether or not output is captured."""


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REAL_NODE_REPORT:
        terminalreporter.section("the real node")
        for line in REAL_NODE_REPORT:
            terminalreporter.write_line(line)
