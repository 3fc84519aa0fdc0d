"""ImpalaJob manifests for tests: one builder for the dict, two for the validated models.

    job_manifest("scaled", rollouts={"minReplicas": 1, "maxReplicas": 4})
        -> {"apiVersion": "impala.dev/v1alpha1", "kind": "ImpalaJob",
            "metadata": {"name": "scaled"},
            "spec": {"rollouts": {...}, "stop": DEFAULT_STOP}}
    make_job(training={"lr": 0.01})     -> ImpalaJob      (validated)
    make_spec(model={"hidden": [16]})   -> ImpalaJobSpec  (validated)
    example_manifest("cartpole", stop={"timeLimitSeconds": 200})
        -> manifests/examples/cartpole.yaml with the override deep-merged

Spec sections are keyword arguments named as in the manifest (camelCase: `runPolicy=...`,
`training={"trainBatchSize": 400}`); they are deep-merged over `spec` (a preset a test file keeps
as a constant), so an override changes only the fields it names. A job must say when it stops:
when neither gives `stop`, the builders add DEFAULT_STOP. Everything is built fresh on each call:
tests may mutate what they get.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from impala_api.manifest import parse_manifest
from impala_api.spec import API_GROUP, API_VERSION, KIND, ImpalaJob, ImpalaJobSpec

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
"""manifests/examples/: the manifests users apply."""

DEFAULT_STOP: dict[str, Any] = {"timesteps": 100_000}
"""`spec.stop` of a built job that names none (the model requires a criterion; tests of a job
without one delete the key from the manifest)."""


def deep_merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `patch` merged in: mappings merge key by key, anything else
    (scalars, lists, None) replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def job_manifest(
    name: str = "t",
    spec: Mapping[str, Any] | None = None,
    *,
    namespace: str | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """An ImpalaJob manifest as a user writes it (or `kubectl apply` takes it), unvalidated.

    `spec` (default: empty, every other field at its default) with `sections` deep-merged over
    it, and DEFAULT_STOP when neither has `stop`. Nothing is validated here, so tests of invalid
    manifests build theirs with it too.
    """
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    merged = deep_merge(spec or {}, sections)
    if "stop" not in merged:
        merged["stop"] = copy.deepcopy(DEFAULT_STOP)
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": merged,
    }


def make_job(
    name: str = "t",
    spec: Mapping[str, Any] | None = None,
    *,
    namespace: str | None = None,
    **sections: Any,
) -> ImpalaJob:
    """`job_manifest(...)` validated as `impalajob validate` does (a ManifestError names the
    field when a test's manifest is wrong)."""
    return parse_manifest(job_manifest(name, spec, namespace=namespace, **sections))


def make_spec(spec: Mapping[str, Any] | None = None, **sections: Any) -> ImpalaJobSpec:
    """The validated spec alone, for the code that takes an ImpalaJobSpec (learner, workers)."""
    return make_job("t", spec, **sections).spec


def example_documents(example: str) -> list[dict[str, Any]]:
    """Every document of manifests/examples/EXAMPLE.yaml (the job and the claim it uses)."""
    text = (EXAMPLES / f"{example}.yaml").read_text()
    return [d for d in yaml.safe_load_all(text) if d]


def example_manifest(
    example: str, *, name: str | None = None, namespace: str | None = None, **sections: Any
) -> dict[str, Any]:
    """manifests/examples/EXAMPLE.yaml as a dict, with `sections` deep-merged into its spec and,
    when given, metadata.name / metadata.namespace set."""
    (manifest,) = [d for d in example_documents(example) if d["kind"] == "ImpalaJob"]
    manifest["spec"] = deep_merge(manifest.get("spec") or {}, sections)
    if name is not None:
        manifest["metadata"]["name"] = name
    if namespace is not None:
        manifest["metadata"]["namespace"] = namespace
    return manifest


def static_volume(namespace: str, claim: str, path: str, size: str = "1Gi") -> dict[str, Any]:
    """A hostPath PersistentVolume reserved for `namespace/claim` (claimRef): what an
    administrator provides where no StorageClass provisions claims, as on the test clusters."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{namespace}-{claim}"},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": namespace, "name": claim},
            "hostPath": {"path": path, "type": "Directory"},
        },
    }


def operator_access(uid: str) -> dict[str, Any]:
    """`plan_children`'s credentials keywords as an operator with a fixed test key derives them."""
    from impala_operator.build.tokens import job_tokens

    return {"tokens": job_tokens(b"test-key", uid), "operator_namespace": "impala-system"}
