"""The CRD on a real API server: invalid ImpalaJobs rejected naming the field, valid ones accepted
and defaulted exactly as the spec model defaults them, the scale and status subresources."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import CommandError, Kube
from impala_api.manifest import load_manifest, load_population, manifest_kind, parse_manifest
from impala_api.spec import ImpalaJobSpec
from tests.support.crd import install_crd
from tests.support.crd_cases import INVALID, VALID, Invalid, base_job, job_with
from tests.support.plugin import kubectl_impalajob

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def crd(kube: Kube) -> Kube:
    install_crd(kube)
    return kube


def _apply(kube: Kube, ns: str, manifest: dict[str, Any], *extra: str) -> None:
    kube.kubectl(
        "apply", "-n", ns, "--validate=strict", *extra, "-f", "-", stdin=json.dumps(manifest)
    )


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_invalid_job_is_rejected_naming_the_field(crd: Kube, namespace: str, case: Invalid) -> None:
    if case.kind == "immutable":
        _apply(crd, namespace, base_job("bad"))  # create, then change the immutable field
        update = job_with(case, "bad")
        with pytest.raises(CommandError) as err:
            _apply(crd, namespace, update)
        assert "immutable" in err.value.stderr
    else:
        with pytest.raises(CommandError) as err:
            _apply(crd, namespace, job_with(case), "--dry-run=server")
    message = err.value.stderr
    assert case.field in message, f"{case.id}: the error does not name {case.field}:\n{message}"
    if case.message is not None:
        assert case.message in message, f"{case.id}: the API server's message differs:\n{message}"


@pytest.mark.parametrize("case", [c for c in INVALID if c.message], ids=lambda c: c.id)
def test_cli_refuses_with_the_api_servers_message(tmp_path: Path, case: Invalid) -> None:
    """`impalajob validate` and `impalajob train` refuse the manifest the API server refuses,
    with the same words, before anything starts."""
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job_with(case)))
    for command in (["validate"], ["train", "--run-dir", str(tmp_path / "run")]):
        res = subprocess.run(
            [sys.executable, "-m", "impala_cli.main", *command, "-f", str(manifest)],
            capture_output=True, text=True, timeout=120,
        )
        assert res.returncode == 2, res.stderr
        assert res.stderr.startswith(f"impalajob {command[0]}: error: {manifest}: invalid")
        assert f"\n  {case.message}" in res.stderr, res.stderr
    assert not (tmp_path / "run").exists()


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        # Unset inside list items too: the API server defaults no field of an array's items
        # (a wrapper's `kwargs: {}` is the model's default, and absent on the server).
        return {k: _clean(v) for k, v in value.items() if v is not None and v != {} and v != []}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    """Non-empty leaves of a nested dict by dotted path (None/{}/[] are "unset"; lists are
    leaves, with unset fields inside their items dropped)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{path}.{k}" if path else k))
        return out
    return {} if value in (None, [], {}) else {path: _clean(value)}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_job_is_accepted_and_defaulted_like_the_model(
    crd: Kube, namespace: str, name: str
) -> None:
    manifest = VALID[name]
    # `create`, not client-side `apply`: apply drops explicit nulls (e.g. gradClip: null, which
    # disables clipping) before they reach the server.
    crd.kubectl(
        "create", "-n", namespace, "--validate=strict", "-f", "-", stdin=json.dumps(manifest)
    )
    stored = crd.get("impalajob", manifest["metadata"]["name"], "-n", namespace)["spec"]
    expected = parse_manifest(manifest).spec
    assert ImpalaJobSpec.model_validate(stored) == expected
    # The server filled in every default itself (not just "nothing contradicts the model").
    stored_leaves = _leaves(stored)
    for path, value in _leaves(expected.model_dump(mode="json", by_alias=True)).items():
        assert stored_leaves.get(path) == value, f"{name}: {path} is {stored_leaves.get(path)}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted(crd: Kube, namespace: str, path: Path) -> None:
    if manifest_kind(path) == "ImpalaPopulation":
        load_population(path)
    else:
        load_manifest(path)  # the example's ImpalaJob document (its results claim rides along)
    crd.kubectl("apply", "-n", namespace, "--validate=strict", "--dry-run=server", "-f", str(path))


def test_scale_subresource_and_printer_columns(crd: Kube, namespace: str) -> None:
    _apply(crd, namespace, base_job("scaled"))
    crd.kubectl("scale", "ij/scaled", "-n", namespace, "--replicas=3")
    job = crd.get("ij", "scaled", "-n", namespace)
    assert job["spec"]["rollouts"]["replicas"] == 3
    status = {
        "phase": "Running",
        "learner": {"replicas": 2, "readyReplicas": 1, "summary": "1/2"},
        "rollouts": {
            "desired": 3,
            "replicas": 3,
            "ready": 2,
            "summary": "2/3",
            "selector": "app.kubernetes.io/instance=scaled,app.kubernetes.io/component=rollout",
        },
        "progress": {
            "timesteps": 12345, "episodeReturnMean": 87.5, "returnMean": 87.5,
            "percentComplete": 41, "remainingSeconds": 200, "eta": "3m20s",
        },
    }
    crd.kubectl(
        "patch",
        "ij",
        "scaled",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )
    scale = json.loads(
        crd.kubectl(
            "get",
            "--raw",
            f"/apis/impala.dev/v1alpha1/namespaces/{namespace}/impalajobs/scaled/scale",
        ).stdout
    )
    assert scale["spec"]["replicas"] == 3
    # Observed replicas (pods that exist), not ready ones, as a Deployment's scale reports.
    assert scale["status"] == {"replicas": 3, "selector": status["rollouts"]["selector"]}
    table = crd.kubectl("get", "ij", "scaled", "-n", namespace).stdout.split("\n")
    header = ["NAME", "PHASE", "LEARNERS", "ROLLOUTS", "STEPS", "RETURN", "DONE%", "ETA", "AGE",
              "REGRESSED"]  # fmt: skip
    assert table[0].split() == header
    row = ["scaled", "Running", "1/2", "2/3", "12345", "87.5", "41", "3m20s"]
    assert table[1].split()[:8] == row


def test_status_is_validated_and_pruned(crd: Kube, namespace: str) -> None:
    _apply(crd, namespace, base_job("statusy"))

    def patch(status: dict[str, Any]) -> None:
        crd.kubectl(
            "patch",
            "ij",
            "statusy",
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
        )

    with pytest.raises(CommandError) as err:
        patch({"phase": "Exploding"})
    assert "status.phase" in err.value.stderr
    patch({"phase": "Pending", "madeUp": 1, "kopf": {"progress": {"h": {"retries": 1}}}})
    stored = crd.get("ij", "statusy", "-n", namespace)["status"]
    # Pruned: only the schema's fields are stored. kopf keeps its progress in annotations, so
    # the public schema has no `kopf` area either.
    assert "madeUp" not in stored and "kopf" not in stored
    # the status subresource ignores spec changes and vice versa
    crd.kubectl(
        "patch",
        "ij",
        "statusy",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Failed"}}),
    )
    assert crd.get("ij", "statusy", "-n", namespace)["status"]["phase"] == "Pending"


def test_kubectl_runs_the_plugin_on_the_context_and_namespace_named(
    crd: Kube, namespace: str
) -> None:
    """`kubectl impalajob status NAME -n NS --context C --kubeconfig F` through the real kubectl:
    a finished job's status, read from its CR."""
    _apply(crd, namespace, base_job("done"))
    progress = {"timesteps": 5000, "episodes": 40, "episodeReturnMean": 480.5,
                "percentComplete": 100}  # fmt: skip
    status = {"phase": "Succeeded", "message": "stop criterion timesteps met", "progress": progress}
    crd.kubectl("patch", "ij", "done", "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": status}))  # fmt: skip
    table = kubectl_impalajob(crd, "status", "done", "-n", namespace)
    assert "Succeeded (stop criterion timesteps met)" in table and "5,000" in table, table
    final = json.loads(kubectl_impalajob(crd, "status", "done", "-n", namespace, "--json"))
    assert (final["namespace"], final["phase"]) == (namespace, "Succeeded")
    assert kubectl_impalajob(crd, "--help").startswith("usage: kubectl impalajob")


def _population(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"members": 2, "template": {"stop": {"timesteps": 1000}}}
    body.update(spec)
    return {"apiVersion": "impala.dev/v1alpha1", "kind": "ImpalaPopulation",
            "metadata": {"name": "pop"}, "spec": body}  # fmt: skip


_PBT = {"readyIntervalTimesteps": 1000, "mutations": {"training.lr": {}}}


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"search": {"parameters": {"training.lrr": {"choice": [1e-3]}}}},
         "each key is a field path of spec.template"),
        ({"search": {"parameters": {"training.lr": {"uniform": [0.2, 0.1]}}}},
         "with low < high"),
        ({"pbt": {**_PBT, "mutations": {"training.gamma": {}}}},
         "may name only the fields a running learner takes"),
        ({"pbt": {**_PBT, "mutations": {"training.lr": {"min": 1.0, "max": 0.1}}}},
         "min must be below max"),
        ({"template": {"stop": {"timesteps": 1}, "training": {"lr": 2.0}}},
         "spec.template.training.lr"),
        ({"template": {"training": {}}}, "spec.template.stop"),
        ({"members": 0}, "spec.members"),
    ],
)  # fmt: skip
def test_invalid_population_is_rejected_naming_the_field(
    crd: Kube, namespace: str, spec: dict[str, Any], says: str
) -> None:
    with pytest.raises(CommandError) as err:
        _apply(crd, namespace, _population(**spec), "--dry-run=server")
    assert says in err.value.stderr, err.value.stderr


def test_a_population_is_stored_with_its_template_defaulted_as_a_job(
    crd: Kube, namespace: str
) -> None:
    body = _population(search={"parameters": {"training.lr": {"logUniform": [1e-5, 1e-2]}}},
                       pbt=_PBT)  # fmt: skip
    _apply(crd, namespace, body)
    stored = crd.get("impalapopulation", "pop", "-n", namespace)["spec"]
    assert stored["template"]["training"]["lr"] == 5e-4  # the job's default
    assert stored["pbt"]["selection"]["method"] == "tournament"
    assert stored["pbt"]["mutations"]["training.lr"]["factors"] == [1.2, 1 / 1.2]
    listed = crd.kubectl("get", "ipop", "-n", namespace).stdout
    assert "pop" in listed and "EXPLOITS" in listed
