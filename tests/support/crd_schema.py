"""Reading a generated CRD's schema in tests: its nodes by path, what keeps it from being
structural, the node a printer column reads, a model's fields by path."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel


def schema_nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, prop in node.get("properties", {}).items():
        yield from schema_nodes(prop, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], f"{path}{{*}}")
    if "items" in node:
        yield from schema_nodes(node["items"], f"{path}[]")


def structural_problems(schema: dict[str, Any]) -> list[str]:
    """What keeps a schema from being structural (the API server's rules, the parts we use)."""
    problems = []
    for path, node in schema_nodes(schema):
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


def schema_at(schema: dict[str, Any], json_path: str) -> dict[str, Any]:
    """The schema node a printer column's path reads (`list[?(filter)]` reads an item)."""
    node = schema
    for part in re.sub(r"\[\?\(.*?\)\]", "[]", json_path).strip(".").split("."):
        name, item = part.removesuffix("[]"), part.endswith("[]")
        node = node["properties"][name]
        node = node["items"] if item else node
    return node


def model_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, field in model.model_fields.items():
        alias = field.alias or name
        yield f"{prefix}.{alias}", field
        # A model, or an optional one (`Model | None`); lists of models are `items`, not here
        optional = typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
        inner = typing.get_args(field.annotation) if optional else ()
        for ann in (field.annotation, *inner):
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                yield from model_fields(ann, f"{prefix}.{alias}")
