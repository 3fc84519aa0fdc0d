"""`docs/reference/impalajob.md`: every ImpalaJob field, rendered from the CRD `impalajob crd`
generates (`impala_api.crd.build_crd`), so the page says what the API server checks: one table per
object (path, type, default, bounds, description), its CEL rules by their messages beneath it,
the status the operator writes, and the printer columns of `kubectl get ij`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from impala_api.crd import build_crd
from impala_cli.reference.markdown import REGENERATE, anchor, cell, code, literal, table

RULES = "x-kubernetes-validations"
_FIELD_HEADER = ("Field", "Type", "Default", "Bounds", "Description")


@dataclass
class _Object:
    """One table of the page: an object with fields, and the rules on it and on the fields of it
    that have no table of their own (a schedule's points, say)."""

    path: str
    node: dict[str, Any]
    rules: list[tuple[str, str]] = field(default_factory=list)


def _heading(path: str) -> str:
    return code(path) if path else "ImpalaJob"


def _link(path: str) -> str:
    return f"#{anchor(_heading(path))}"


def _objects(node: dict[str, Any], path: str, into: list[_Object]) -> None:
    """`node` and every object below it with fields of its own, parents first."""
    obj = _Object(path, node, [(path, r["message"]) for r in node.get(RULES, [])])
    into.append(obj)
    for name, prop in node.get("properties", {}).items():
        _field_objects(prop, f"{path}.{name}" if path else name, obj, into)


def _field_objects(node: dict[str, Any], path: str, owner: _Object, into: list[_Object]) -> None:
    if node.get("properties"):
        _objects(node, path, into)
        return
    owner.rules.extend((path, r["message"]) for r in node.get(RULES, []))
    if node.get("type") == "array":
        _field_objects(node.get("items", {}), path + "[]", owner, into)
    elif isinstance(node.get("additionalProperties"), dict):
        _field_objects(node["additionalProperties"], path + ".*", owner, into)


def _type(node: dict[str, Any], path: str) -> str:
    kind = node.get("type", "")
    extra = node.get("additionalProperties")
    if kind == "array":
        text = "array of " + _type(node.get("items", {}), path + "[]")
    elif kind == "object" and node.get("properties"):
        text = f"[object]({_link(path)})"
    elif kind == "object" and isinstance(extra, dict):
        text = "map of " + _type(extra, path + ".*")
    elif kind == "object" and node.get("x-kubernetes-preserve-unknown-fields"):
        text = "object (free-form)"
    else:
        fmt = node.get("format")
        text = f"{kind} ({fmt})" if fmt and fmt != "int64" else kind
    if node.get("nullable"):
        text += ", or null" if kind == "array" else " or null"
    return text


def _number(value: Any) -> str:
    return json.dumps(value)


def _range(low: Any, high: Any, low_open: bool = False, high_open: bool = False) -> str:
    if low is not None and high is not None and not (low_open or high_open):
        return f"{_number(low)}–{_number(high)}"
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '≥'} {_number(low)}")
    if high is not None:
        parts.append(f"{'<' if high_open else '≤'} {_number(high)}")
    return " and ".join(parts)


def _bounds(node: dict[str, Any]) -> list[str]:
    """What the schema refuses, in words: range, lengths, choices, pattern, and those of each item
    or map value."""
    out = []
    if "minimum" in node or "maximum" in node:
        out.append(
            _range(
                node.get("minimum"),
                node.get("maximum"),
                node.get("exclusiveMinimum") is True,
                node.get("exclusiveMaximum") is True,
            )
        )
    if "minLength" in node or "maxLength" in node:
        out.append("length " + _range(node.get("minLength"), node.get("maxLength")))
    low, high = node.get("minItems"), node.get("maxItems")
    if low is not None and low == high:
        out.append(f"exactly {low} items")
    elif low is not None or high is not None:
        out.append(_range(low, high) + " items")
    if "enum" in node:
        out.append("one of " + ", ".join(literal(v) for v in node["enum"]))
    if "pattern" in node:
        out.append("pattern " + code(node["pattern"]))
    items, extra = node.get("items"), node.get("additionalProperties")
    if isinstance(items, dict) and not items.get("properties") and _bounds(items):
        out.append("each: " + ", ".join(_bounds(items)))
    if isinstance(extra, dict) and _bounds(extra):
        out.append("each value: " + ", ".join(_bounds(extra)))
    return out


def _default(node: dict[str, Any]) -> str:
    if node.get("properties"):
        return ""  # an object's defaults are its fields'
    return literal(node["default"]) if "default" in node else ""


def _object_section(obj: _Object) -> list[str]:
    depth = obj.path.count(".") + 1 if obj.path else 1
    lines = ["#" * min(depth + 1, 4) + " " + _heading(obj.path), ""]
    if obj.node.get("description"):
        lines += [cell(obj.node["description"]), ""]
    required = set(obj.node.get("required", []))
    rows = []
    for name, prop in obj.node["properties"].items():
        path = f"{obj.path}.{name}" if obj.path else name
        rows.append(
            (
                code(path) + (" (required)" if name in required else ""),
                _type(prop, path),
                _default(prop),
                "; ".join(_bounds(prop)),
                cell(prop.get("description", "")),
            )
        )
    # Default and Bounds only where a field has one (the status has neither).
    keep = [i for i, _ in enumerate(_FIELD_HEADER) if i not in (2, 3) or any(r[i] for r in rows)]
    lines += [*table([_FIELD_HEADER[i] for i in keep], ([r[i] for i in keep] for r in rows)), ""]
    if obj.rules:
        lines += ["Rules:", ""]
        lines += [
            "- " + ("" if where == obj.path else f"on {code(where)}: ") + cell(message)
            for where, message in obj.rules
        ]
        lines.append("")
    return lines


def _resource_section(crd: dict[str, Any]) -> list[str]:
    spec = crd["spec"]
    names, version = spec["names"], spec["versions"][0]
    scale = version.get("subresources", {}).get("scale")
    spellings = [names["plural"], names["singular"], *names.get("shortNames", [])]
    rows = [
        ("apiVersion", code(f"{spec['group']}/{version['name']}")),
        ("kind", code(names["kind"]) + f" (list: {code(names['listKind'])})"),
        ("names", ", ".join(code(n) for n in spellings)),
        ("categories", ", ".join(code(c) for c in names.get("categories", []))),
        ("scope", spec["scope"]),
    ]
    if scale:
        rows.append(
            (
                "scale subresource",
                (
                    f"{code('kubectl scale')} sets {code(scale['specReplicasPath'].lstrip('.'))}; "
                    f"reads {code(scale['statusReplicasPath'].lstrip('.'))}"
                ),
            )
        )
    return ["## Resource", "", *table(("Property", "Value"), rows), ""]


def _columns_section(crd: dict[str, Any]) -> list[str]:
    columns = crd["spec"]["versions"][0].get("additionalPrinterColumns", [])
    rows = [
        (
            c["name"],
            c["type"],
            code(c["jsonPath"]),
            "with `-o wide`" if c.get("priority", 0) else "always",
        )
        for c in columns
    ]
    return [
        "## Printer columns",
        "",
        "What `kubectl get ij` shows.",
        "",
        *table(("Column", "Type", "From", "Shown"), rows),
        "",
    ]


def render_spec_reference(crd: dict[str, Any] | None = None) -> str:
    """The ImpalaJob reference page for `crd` (the product's, `build_crd()`, unless given)."""
    crd = build_crd() if crd is None else crd
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    objects: list[_Object] = []
    _objects(root, "", objects)
    anchors = [anchor(_heading(o.path)) for o in objects]
    if len(set(anchors)) != len(anchors):
        raise ValueError(f"two objects share a heading anchor: {sorted(anchors)}")
    lines = [
        "# ImpalaJob reference",
        "",
        f"Generated by `{REGENERATE}` from the CustomResourceDefinition that `impalajob crd` "
        "writes; do not edit.",
        "",
        "One table per object. **Default**: what an omitted field becomes (inside a section "
        "absent unless given, once it is given). **Bounds**: what the "
        "API server refuses outside of. **Rules** under a table: the object's cross-field "
        "checks (CEL), each as the message the API server and `impalajob validate` answer with.",
        "",
        "Contents: "
        + ", ".join(
            f"[{_heading(o.path)}]({_link(o.path)})" for o in objects if o.path.count(".") < 2
        )
        + ", [printer columns](#printer-columns).",
        "",
        *_resource_section(crd),
    ]
    for obj in objects:
        lines += _object_section(obj)
    lines += _columns_section(crd)
    return "\n".join(lines).rstrip("\n") + "\n"
