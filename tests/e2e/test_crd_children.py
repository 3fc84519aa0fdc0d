"""The children the operator builds pass the real API server's validation: strict field
validation (no misspelt or unknown fields), the `restricted` Pod Security Standard, and
ownerReferences to a live ImpalaJob. No operator runs here; `tests/e2e/test_operator_*.py` runs
it end to end."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.cluster import Kube, wait_for
from impala_api.manifest import parse_manifest
from impala_operator.lifecycle.plan import plan_children
from tests.support.crd import install_crd
from tests.support.crd_cases import VALID
from tests.support.jobs import operator_access
from tests.support.plans import tick

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _children(live: dict[str, Any]) -> list[dict[str, Any]]:
    """What the operator writes for a new job: `plan_children`, and its first tick's learner pod
    and Deployments."""
    job, uid = parse_manifest(live), live["metadata"]["uid"]
    first = tick(job, uid=uid)
    return [*plan_children(job, uid, **operator_access(uid)), *first.create, *first.apply]


@pytest.mark.parametrize("name", ["base", "everything"])
def test_children_pass_strict_validation_and_restricted_pod_security(
    kube: Kube, namespace: str, name: str
) -> None:
    install_crd(kube)
    kube.kubectl(
        "label",
        "namespace",
        namespace,
        "--overwrite",
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    )
    manifest = VALID[name]
    kube.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
    live = kube.get("ij", manifest["metadata"]["name"], "-n", namespace)
    children = _children(live)
    listing: dict[str, Any] = {"apiVersion": "v1", "kind": "List", "items": children}
    proc = kube.kubectl(
        "apply",
        "--server-side",
        "--field-manager=e2e",
        "--dry-run=server",
        "--validate=strict",
        "-f",
        "-",
        stdin=json.dumps(listing),
    )
    # Strict validation and Pod Security report problems as warnings on stderr when they do not
    # reject outright; a clean child set produces none.
    assert "Warning" not in proc.stderr, proc.stderr
    assert proc.stdout.count("serverside-applied") == len(children), proc.stdout


def test_children_are_garbage_collected_with_the_job(kube: Kube, namespace: str) -> None:
    install_crd(kube)
    # A Kueue queue label admits the job as one workload; it must not reach any child.
    manifest = json.loads(json.dumps(VALID["base"]))
    manifest["metadata"].setdefault("labels", {})["kueue.x-k8s.io/queue-name"] = "team-q"
    kube.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
    live = kube.get("ij", manifest["metadata"]["name"], "-n", namespace)
    assert live["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-q"
    children = _children(live)
    kube.kubectl(
        "apply",
        "--server-side",
        "--field-manager=e2e",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": children}),
    )
    selector = f"app.kubernetes.io/instance={manifest['metadata']['name']}"
    kinds = "secrets,configmaps,services,deployments,networkpolicies,poddisruptionbudgets,pods"

    def live_children() -> set[tuple[str, str]]:
        items = kube.get(kinds, "-n", namespace, "-l", selector)["items"]
        return {(o["kind"], o["metadata"]["name"]) for o in items}

    built = {(c["kind"], c["metadata"]["name"]) for c in children}
    assert built <= live_children()  # (plus the Deployments' pods)
    for obj in kube.get(kinds, "-n", namespace, "-l", selector)["items"]:
        assert "kueue.x-k8s.io/queue-name" not in obj["metadata"].get("labels", {}), obj["kind"]
    kube.kubectl("delete", "ij", manifest["metadata"]["name"], "-n", namespace, "--wait=true")
    wait_for(lambda: not live_children(), timeout=90, what="garbage collection of the children")
