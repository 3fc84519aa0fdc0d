"""The generated CRD: structural, in sync with the spec model and with the committed YAML files."""

from __future__ import annotations

import copy
import io
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from impala_api import cel, crd, crd_file
from impala_api.manifest import ManifestError, parse_manifest
from impala_api.population_crd import build_population_crd
from impala_api.spec import ImpalaJobSpec
from impala_cli.main import main as cli_main
from tests.support.crd_cases import INVALID, VALID, job_with
from tests.support.crd_schema import model_fields, schema_at, schema_nodes, structural_problems

ROOT = Path(__file__).resolve().parents[3]
GENERATED = [ROOT / "manifests/crd.yaml", ROOT / "charts/impala-operator/crds/impala-crds.yaml"]
CRD = crd.build_crd()
VERSION = CRD["spec"]["versions"][0]
ROOT_SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC = ROOT_SCHEMA["properties"]["spec"]
STATUS = ROOT_SCHEMA["properties"]["status"]



def test_schema_is_structural() -> None:
    assert structural_problems(ROOT_SCHEMA) == []


def test_structural_checker_catches_what_it_should() -> None:
    bad = {
        "type": "object",
        "properties": {
            "a": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "b": {"type": "object"},
            "c": {"type": "number", "exclusiveMinimum": 0.0},
            "d": {"type": "object", "additionalProperties": True},
        },
    }
    problems = structural_problems(bad)
    assert any(".a: has anyOf" in p for p in problems)
    assert any(".a: no type" in p for p in problems)
    assert any(".b: object without properties" in p for p in problems)
    assert any(".c: exclusiveMinimum" in p for p in problems)
    assert any(".d: boolean additionalProperties" in p for p in problems)


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_files_are_not_stale(path: Path) -> None:
    assert path.read_text() == crd_file.render(), (
        f"{path.relative_to(ROOT)} is stale: run `impalajob crd -o {path.relative_to(ROOT)}`"
    )


def test_cli_prints_and_writes_the_crd(tmp_path: Path) -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["crd"]) == 0
    assert out.getvalue() == crd_file.render()
    target = tmp_path / "crd.yaml"
    assert cli_main(["crd", "-o", str(target)]) == 0
    assert list(yaml.safe_load_all(target.read_text())) == [CRD, build_population_crd()]


def test_names_and_subresources() -> None:
    spec = CRD["spec"]
    assert CRD["metadata"]["name"] == "impalajobs.impala.dev"
    assert spec["names"]["shortNames"] == ["ij"] and spec["names"]["plural"] == "impalajobs"
    assert spec["scope"] == "Namespaced"
    scale = VERSION["subresources"]["scale"]
    assert VERSION["subresources"]["status"] == {}
    for key in ("specReplicasPath", "statusReplicasPath", "labelSelectorPath"):
        assert schema_at(ROOT_SCHEMA, scale[key])["type"] in ("integer", "string")
    assert scale["specReplicasPath"] == ".spec.rollouts.replicas"




def test_printer_columns_point_at_schemamodel_fields() -> None:
    columns = {c["name"]: c for c in VERSION["additionalPrinterColumns"]}
    assert list(columns)[:8] == [
        "Phase", "Learners", "Rollouts", "Steps", "Return", "Done%", "ETA", "Age"
    ]  # fmt: skip
    for column in columns.values():
        if column["jsonPath"].startswith(".status"):
            node = schema_at(ROOT_SCHEMA, column["jsonPath"])
            assert node["type"] == column["type"] or (
                column["type"] == "number" and node["type"] == "number"
            )
    assert schema_at(ROOT_SCHEMA, ".status.phase")["enum"] == crd.PHASES




def test_every_model_field_is_in_the_schema_with_its_docstring() -> None:
    for path, field in model_fields(ImpalaJobSpec):
        node = schema_at(SPEC, path)
        assert node.get("description") == field.description, path
    # and nothing extra: the schema's spec properties are exactly the model's fields
    schema_paths = {p for p, n in schema_nodes(SPEC) if p and "[" not in p and "{" not in p}
    model_paths = {p for p, _ in model_fields(ImpalaJobSpec)}
    assert schema_paths == model_paths


def test_bounds_enums_and_patterns_are_converted() -> None:
    lr = schema_at(SPEC, ".training.lr")
    assert (lr["minimum"], lr["exclusiveMinimum"], lr["maximum"]) == (0.0, True, 1.0)
    assert schema_at(SPEC, ".training.optimizer.momentum")["exclusiveMaximum"] is True
    assert schema_at(SPEC, ".model.type")["enum"] == ["auto", "mlp", "cnn", "resnet", "custom"]
    claim = schema_at(SPEC, ".checkpoint.volumeClaim")
    assert claim["nullable"] is True and claim["pattern"].startswith("^")
    cpu = schema_at(SPEC, ".learner.resources.requests")["additionalProperties"]
    assert cpu["type"] == "string" and "pattern" in cpu
    kwargs = schema_at(SPEC, ".env.kwargs")
    assert kwargs["x-kubernetes-preserve-unknown-fields"] is True
    point = schema_at(SPEC, ".training.lrSchedule")["items"]
    assert point["items"] == {"type": "number"} and point["minItems"] == point["maxItems"] == 2


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it: a missing field with a default gets it,
    then defaulting continues inside (which is how `default: {}` sections fill up)."""
    if isinstance(value, dict) and "properties" in schema:
        for name, prop in schema["properties"].items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                value[name] = apply_defaults(prop, value[name])
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(schema["items"], v) for v in value]
    return value


def _without_empty(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_empty(v) for k, v in value.items() if v not in (None, {}, [])}
    return value


def test_server_side_defaults_equal_the_model_defaults() -> None:
    stop = {"timesteps": 1000}
    defaulted = apply_defaults(ROOT_SCHEMA, {"spec": {"stop": stop}})["spec"]
    model = ImpalaJobSpec.model_validate({"stop": stop}).model_dump(mode="json", by_alias=True)
    assert defaulted == _without_empty(model)
    # and a partly given section keeps what was given, defaulting only the rest
    partial = apply_defaults(SPEC, {"training": {"lr": 0.01}})
    assert partial["training"]["lr"] == 0.01 and partial["training"]["gamma"] == 0.99


def test_cel_rules_sit_where_their_paths_say_and_namemodel_fields() -> None:
    for path, rules in cel.RULES.items():
        node = SPEC
        for part in path:
            node = node["items"] if part == "[]" else node["properties"][part]
        for rule in rules:
            assert rule in node["x-kubernetes-validations"]
            assert "spec." in rule["message"], rule
    assert schema_at(SPEC, ".env")["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    assert schema_at(SPEC, ".model")["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"


def _json_schema(node: Any) -> Any:
    """The CRD schema as a JSON-Schema draft-4 document, closed like strict field validation."""
    if isinstance(node, list):
        return [_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if node.get("nullable"):
        out["type"] = [node["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if (
        node.get("type") == "object"
        and "properties" in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    out.pop("nullable", None)
    return out


VALIDATOR = jsonschema.Draft4Validator(_json_schema(SPEC))


@pytest.mark.parametrize("case", [c for c in INVALID if c.kind != "immutable"], ids=lambda c: c.id)
def test_model_rejects_every_invalid_case(case: Any) -> None:
    # Immutability needs the old object; the model sees one manifest at a time.
    with pytest.raises(ManifestError):
        parse_manifest(job_with(case))


@pytest.mark.parametrize(
    "case", [c for c in INVALID if c.kind in ("schema", "unknown")], ids=lambda c: c.id
)
def test_schema_rejects_the_schema_level_cases(case: Any) -> None:
    errors = list(VALIDATOR.iter_errors(job_with(case)["spec"]))
    assert errors, f"{case.id}: the CRD schema accepts it"


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_cases_pass_model_and_schema(name: str) -> None:
    manifest = VALID[name]
    parse_manifest(copy.deepcopy(manifest))
    VALIDATOR.validate(apply_defaults(SPEC, copy.deepcopy(manifest.get("spec", {}))))


def test_enough_cases_for_the_api_server() -> None:
    assert len(INVALID) >= 20
    assert {c.kind for c in INVALID} == {"schema", "unknown", "cel", "immutable", "name"}
