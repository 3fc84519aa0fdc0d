"""Field paths of an ImpalaJob spec (`training.lr`, `model.hidden`): what a population's search
and mutations name, read and write.

A path is the camelCase field names from `.spec` down, dot-separated, as `--set` takes them.
It must end at a field of the spec's models: a whole section (`training`) is not a value to
draw, and a map's keys (`multiAgent.policies.<name>`) are not fields the CRD can check.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from impala_api.spec import ImpalaJobSpec
from impala_api.spec.training import ENTROPY_COEFF

Values = dict[str, Any]
"""Field path to value."""

LIVE_FIELDS: tuple[str, ...] = (
    "training.lr",
    "training.lrVf",
    "training.entropyCoeff",
    "training.vfLossCoeff",
    "training.gradClip",
    "training.vtraceClipRhoThreshold",
    "training.vtraceClipPgRhoThreshold",
    "training.optimizer.epsilon",
)
"""The fields a running learner takes at its next update (`pbt.mutations` may name only these):
the learning rates (a schedule's values scaled with them), the entropy coefficient (its
schedule's too), the loss weights, the clip thresholds and the optimiser's epsilon. Everything
else is fixed for a run: the model's shape, the batch and fragment sizes the rollouts and the
learner's buffers are built for, gamma (the value function's meaning)."""

SCHEDULE_OF = {"training.lr": "training.lrSchedule",
               "training.entropyCoeff": "training.entropyCoeffSchedule"}  # fmt: skip
"""A live field whose schedule, when the template has one, is what the learner follows: a new
value scales the schedule's values by new / old, so its shape over the run is kept."""


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The section model a field holds (`X` or `X | None`), or None for a value field."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if _model_in(a) is not None]
        if len(models) == 1 and len(typing.get_args(annotation)) == 2:
            return _model_in(models[0])
    return None


def _fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    return {info.alias or name: info for name, info in model.model_fields.items()}


def value_paths(model: type[BaseModel] = ImpalaJobSpec, prefix: str = "") -> Iterator[str]:
    """Every path that ends at a value field (not a section), in declaration order."""
    for alias, info in _fields(model).items():
        inner = _model_in(info.annotation)
        if inner is None:
            yield prefix + alias
        else:
            yield from value_paths(inner, f"{prefix}{alias}.")


def field_at(path: str) -> FieldInfo:
    """The field `path` names; ValueError saying which part is not a field, and what is."""
    model: type[BaseModel] | None = ImpalaJobSpec
    parts = path.split(".")
    for i, part in enumerate(parts):
        if model is None:
            where = ".".join(parts[:i])
            raise ValueError(f"{where} is a value, not a section: {path} has no field")
        fields = _fields(model)
        if part not in fields:
            where = ".".join(parts[:i]) or "the spec"
            raise ValueError(
                f"{path}: {where} has no field {part!r} (its fields: {', '.join(fields)})"
            )
        info = fields[part]
        model = _model_in(info.annotation)
    if model is not None:
        raise ValueError(f"{path} is a section; name one of its fields ({path}.<field>)")
    return info


def is_numeric(path: str) -> bool:
    """Whether the field holds a number (int or float, optional or not; not a bool)."""
    annotation = field_at(path).annotation
    args = typing.get_args(annotation) if typing.get_origin(annotation) else (annotation,)
    kinds = [a for a in args if a is not type(None)]
    return bool(kinds) and all(a in (int, float) for a in kinds)


def get_value(spec: dict[str, Any], path: str) -> Any:
    """The value at `path` of a spec's camelCase data (None where a section is absent)."""
    node: Any = spec
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def set_value(spec: dict[str, Any], path: str, value: Any) -> None:
    """Write `value` at `path` of a spec's camelCase data, creating absent sections."""
    node = spec
    *parents, last = path.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[last] = value


def live_value(spec: ImpalaJobSpec, path: str) -> float | None:
    """A live field's value as the learner uses it: an omitted entropyCoeff is the default,
    an omitted optimiser epsilon the optimiser's; None where the field is off (gradClip null)."""
    data = spec.model_dump(mode="json", by_alias=True)
    value = get_value(data, path)
    if value is not None:
        return float(value)
    if path == "training.entropyCoeff":
        return ENTROPY_COEFF
    if path == "training.optimizer.epsilon":
        return spec.training.optimizer.epsilon_or_default
    return None


def with_values(spec: ImpalaJobSpec, values: Values) -> ImpalaJobSpec:
    """`spec` with each path set to its value, validated as an ImpalaJob spec. A live field
    whose schedule is given (`paths.SCHEDULE_OF`) scales that schedule's values by new / old,
    so the run keeps the schedule's shape at the new level. ValueError names the path."""
    data = spec.model_dump(mode="json", by_alias=True)
    for path, value in values.items():
        schedule_path = SCHEDULE_OF.get(path)
        schedule = get_value(data, schedule_path) if schedule_path else None
        if schedule_path and schedule:
            old = live_value(spec, path)
            scale = float(value) / old if old else 1.0
            set_value(data, schedule_path, [[t, v * scale] for t, v in schedule])
        set_value(data, path, value)
    try:
        return ImpalaJobSpec.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        msg = str(first["msg"]).removeprefix("Value error, ")
        raise ValueError(f"{where}: {msg} (with {values})") from None


