"""The generated CRD: structural, in sync with the spec model and with the committed YAML files."""

from __future__ import annotations

import copy
import io
import re
import types
import typing
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from impala_api import cel, crd
from impala_api.manifest import ManifestError, parse_manifest
from impala_api.population.crd import build_population_crd
from impala_api.spec import ImpalaJobSpec
from impala_cli.main import main as cli_main
from tests.support.crd_cases import INVALID, VALID, job_with

ROOT = Path(__file__).resolve().parents[3]
GENERATED = [ROOT / "manifests/crd.yaml", ROOT / "charts/impala-operator/crds/impala-crds.yaml"]
CRD = crd.build_crd()
VERSION = CRD["spec"]["versions"][0]
ROOT_SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC = ROOT_SCHEMA["properties"]["spec"]
STATUS = ROOT_SCHEMA["properties"]["status"]


def _nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, prop in node.get("properties", {}).items():
        yield from _nodes(prop, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}{{*}}")
    if "items" in node:
        yield from _nodes(node["items"], f"{path}[]")


def structural_problems(schema: dict[str, Any]) -> list[str]:
    """What keeps a schema from being structural (the API server's rules, the parts we use)."""
    problems = []
    for path, node in _nodes(schema):
        where = path or "(root)"
        free = node.get("x-kubernetes-preserve-unknown-fields") is True
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "prefixItems", "title", "$defs"):
            if banned in node:
                problems.append(f"{where}: has {banned}")
        if "type" not in node and not free and not node.get("x-kubernetes-int-or-string"):
            problems.append(f"{where}: no type")
        if node.get("type") == "object":
            has_props = "properties" in node
            has_map = isinstance(node.get("additionalProperties"), dict)
            if has_props and has_map:
                problems.append(f"{where}: both properties and additionalProperties")
            if not (has_props or has_map or free):
                problems.append(f"{where}: object without properties or preserve-unknown-fields")
        if node.get("additionalProperties") is False or node.get("additionalProperties") is True:
            problems.append(f"{where}: boolean additionalProperties")
        if node.get("type") == "array" and "items" not in node:
            problems.append(f"{where}: array without items")
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            if bound in node and not isinstance(node[bound], bool):
                problems.append(f"{where}: {bound} must be a boolean in OpenAPI v3.0")
        if "default" in node and node.get("nullable") and node["default"] is None:
            problems.append(f"{where}: null default")
    return problems


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
    assert path.read_text() == crd.render(), (
        f"{path.relative_to(ROOT)} is stale: run `impalajob crd -o {path.relative_to(ROOT)}`"
    )


def test_cli_prints_and_writes_the_crd(tmp_path: Path) -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["crd"]) == 0
    assert out.getvalue() == crd.render()
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
        assert _at(ROOT_SCHEMA, scale[key])["type"] in ("integer", "string")
    assert scale["specReplicasPath"] == ".spec.rollouts.replicas"


def _at(schema: dict[str, Any], json_path: str) -> dict[str, Any]:
    """The schema node a printer column's path reads (`list[?(filter)]` reads an item)."""
    node = schema
    for part in re.sub(r"\[\?\(.*?\)\]", "[]", json_path).strip(".").split("."):
        name, item = part.removesuffix("[]"), part.endswith("[]")
        node = node["properties"][name]
        node = node["items"] if item else node
    return node


def test_printer_columns_point_at_schema_fields() -> None:
    columns = {c["name"]: c for c in VERSION["additionalPrinterColumns"]}
    assert list(columns)[:8] == [
        "Phase", "Learners", "Rollouts", "Steps", "Return", "Done%", "ETA", "Age"
    ]  # fmt: skip
    for column in columns.values():
        if column["jsonPath"].startswith(".status"):
            node = _at(ROOT_SCHEMA, column["jsonPath"])
            assert node["type"] == column["type"] or (
                column["type"] == "number" and node["type"] == "number"
            )
    assert _at(ROOT_SCHEMA, ".status.phase")["enum"] == crd.PHASES


def _fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, field in model.model_fields.items():
        alias = field.alias or name
        yield f"{prefix}.{alias}", field
        # A model, or an optional one (`Model | None`); lists of models are `items`, not here
        optional = typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
        inner = typing.get_args(field.annotation) if optional else ()
        for ann in (field.annotation, *inner):
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                yield from _fields(ann, f"{prefix}.{alias}")


def test_every_model_field_is_in_the_schema_with_its_docstring() -> None:
    for path, field in _fields(ImpalaJobSpec):
        node = _at(SPEC, path)
        assert node.get("description") == field.description, path
    # and nothing extra: the schema's spec properties are exactly the model's fields
    schema_paths = {p for p, n in _nodes(SPEC) if p and "[" not in p and "{" not in p}
    model_paths = {p for p, _ in _fields(ImpalaJobSpec)}
    assert schema_paths == model_paths


def test_bounds_enums_and_patterns_are_converted() -> None:
    lr = _at(SPEC, ".training.lr")
    assert (lr["minimum"], lr["exclusiveMinimum"], lr["maximum"]) == (0.0, True, 1.0)
    assert _at(SPEC, ".training.optimizer.momentum")["exclusiveMaximum"] is True
    assert _at(SPEC, ".model.type")["enum"] == ["auto", "mlp", "cnn", "resnet", "custom"]
    claim = _at(SPEC, ".checkpoint.volumeClaim")
    assert claim["nullable"] is True and claim["pattern"].startswith("^")
    cpu = _at(SPEC, ".learner.resources.requests")["additionalProperties"]
    assert cpu["type"] == "string" and "pattern" in cpu
    kwargs = _at(SPEC, ".env.kwargs")
    assert kwargs["x-kubernetes-preserve-unknown-fields"] is True
    point = _at(SPEC, ".training.lrSchedule")["items"]
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


def test_cel_rules_sit_where_their_paths_say_and_name_fields() -> None:
    for path, rules in cel.RULES.items():
        node = SPEC
        for part in path:
            node = node["items"] if part == "[]" else node["properties"][part]
        for rule in rules:
            assert rule in node["x-kubernetes-validations"]
            assert "spec." in rule["message"], rule
    assert _at(SPEC, ".env")["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    assert _at(SPEC, ".model")["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"


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
