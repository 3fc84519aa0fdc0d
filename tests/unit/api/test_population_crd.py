"""The generated ImpalaPopulation CRD: structural, every model field described, its template an
ImpalaJob spec with the job's rules, and its own CEL rules where their paths say."""

from __future__ import annotations

from typing import Any

import jsonschema

from impala_api import cel
from impala_api.crd import spec_schema as job_spec_schema
from impala_api.population.spec import ImpalaPopulationSpec
from impala_api.population_crd import RULES, build_population_crd
from tests.support.crd_schema import model_fields, schema_at, structural_problems

CRD = build_population_crd()
VERSION = CRD["spec"]["versions"][0]
ROOT = VERSION["schema"]["openAPIV3Schema"]
SPEC = ROOT["properties"]["spec"]


def test_schema_is_structural_and_named() -> None:
    assert structural_problems(ROOT) == []
    assert CRD["metadata"]["name"] == "impalapopulations.impala.dev"
    names = CRD["spec"]["names"]
    assert names["kind"] == "ImpalaPopulation" and names["shortNames"] == ["ipop"]
    assert VERSION["subresources"] == {"status": {}}
    assert SPEC["required"] == ["template", "members"]


def test_the_template_is_an_impalajob_spec_with_its_rules() -> None:
    template = SPEC["properties"]["template"]
    job = job_spec_schema()
    assert template["properties"].keys() == job["properties"].keys()
    assert template["properties"]["training"] == job["properties"]["training"]
    for path in cel.RULES:
        node: dict[str, Any] = template
        for part in path:
            node = node["items"] if part == "[]" else node["properties"][part]
        assert "x-kubernetes-validations" in node, path


def test_every_model_field_is_in_the_schema_with_its_docstring() -> None:
    for path, field in model_fields(ImpalaPopulationSpec):
        if path.startswith(".template."):
            continue  # the job's own test covers its fields
        assert schema_at(SPEC, path).get("description") == field.description, path


def test_rules_sit_where_their_paths_say() -> None:
    for path in RULES:
        node: dict[str, Any] = SPEC
        for part in path:
            node = node["additionalProperties"] if part == "{}" else node["properties"][part]
        assert node["x-kubernetes-validations"], path


def test_printer_columns_point_at_statusmodel_fields() -> None:
    for column in VERSION["additionalPrinterColumns"]:
        if column["jsonPath"].startswith(".status"):
            assert schema_at(ROOT, column["jsonPath"])["type"] == column["type"], column


def test_the_example_passes_the_schema() -> None:
    from pathlib import Path

    import yaml

    example = Path(__file__).resolve().parents[3] / "manifests/examples/cartpole-pbt.yaml"
    doc = yaml.safe_load(example.read_text())
    jsonschema.validate(doc["spec"], _openapi_to_jsonschema(SPEC))


def _openapi_to_jsonschema(node: Any) -> Any:
    """Enough of OpenAPI v3.0 as JSON schema for jsonschema: nullable as a null type."""
    if isinstance(node, dict):
        out = {k: _openapi_to_jsonschema(v) for k, v in node.items()
               if not k.startswith("x-kubernetes")}  # fmt: skip
        if node.get("nullable") and "type" in out:
            out["type"] = [out["type"], "null"]
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            if out.get(bound) is True:
                out[bound] = out.pop("minimum" if bound == "exclusiveMinimum" else "maximum")
            elif out.get(bound) is False:
                del out[bound]
        return out
    if isinstance(node, list):
        return [_openapi_to_jsonschema(v) for v in node]
    return node
