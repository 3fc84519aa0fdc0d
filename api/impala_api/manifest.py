"""Reading an ImpalaJob manifest: YAML, `--set` overrides, and actionable validation errors."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from impala_api.population.spec import POPULATION_KIND, ImpalaPopulation
from impala_api.spec import RENAMED_RLLIB, ImpalaJob


class ManifestError(ValueError):
    """An invalid manifest; `problems` holds one line per error, each naming the field path."""

    def __init__(self, source: str, problems: list[str], kind: str = "ImpalaJob") -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid {kind}\n" + "\n".join(f"  {p}" for p in problems))


def _field_aliases(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _model_at(loc: tuple[int | str, ...], root: type[BaseModel]) -> type[BaseModel] | None:
    """The pydantic model class that the location's parent points into (for 'did you mean')."""
    model: type[BaseModel] = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = next(
            (f for n, f in model.model_fields.items() if (f.alias or n) == part or n == part), None
        )
        ann = getattr(field, "annotation", None) if field else None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return None
    return model


def _bounds(loc: tuple[int | str, ...], root: type[BaseModel]) -> str:
    """'allowed: >= 1, <= 64' from the field's constraints, when the location names a field."""
    model = _model_at(loc, root)
    if model is None or not loc or isinstance(loc[-1], int):
        return ""
    field = next(
        (f for n, f in model.model_fields.items() if (f.alias or n) == loc[-1]), None
    )
    if field is None:
        return ""
    parts: list[str] = []
    for meta in field.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            val = getattr(meta, attr, None)
            if val is not None:
                parts.append(f"{sym} {val}")
    return f" (allowed: {', '.join(parts)})" if parts else ""


def format_validation_error(
    err: ValidationError, root: type[BaseModel] = ImpalaJob
) -> list[str]:
    """One line per problem: `path: problem (got value; allowed ...)`; `root` is the model
    the paths start from."""
    lines: list[str] = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc)
        path = path.replace(".[", "[") or "(manifest)"
        if e["type"] == "extra_forbidden" and str(loc[-1]) in RENAMED_RLLIB:
            lines.append(f"{path}: {RENAMED_RLLIB[str(loc[-1])]}")
            continue
        if e["type"] == "extra_forbidden":
            model = _model_at(loc, root)
            hint = ""
            if model is not None:
                allowed = _field_aliases(model)
                close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                hint += f"; allowed fields: {', '.join(allowed)}"
            lines.append(f"{path}: unknown field{hint}")
            continue
        msg = str(e["msg"]).removeprefix("Value error, ")
        got = "" if e["type"] == "missing" else f" (got {e.get('input')!r})"
        # A message that names its own field (as the CRD's CEL messages do) is not prefixed.
        # A message that names its field itself (a cross-field rule's, as the CEL rule words
        # it) is shown as it is, the same words as the API server's.
        where = "" if msg.startswith((f"{path} ", f"{path}.")) else f"{path}: "
        lines.append(f"{where}{msg}{got}{_bounds(loc, root)}")
    return lines


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to raw manifest data.

    Paths are relative to the manifest root; a leading `spec.` may be left out, so
    `training.lr=1e-3` and `spec.training.lr=1e-3` mean the same.
    """
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ManifestError("--set", [f"{item!r}: expected KEY=VALUE, e.g. training.lr=0.001"])
        parts = key.split(".")
        if parts[0] not in ("spec", "metadata", "apiVersion", "kind"):
            parts = ["spec", *parts]
        node = data
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ManifestError("--set", [f"{key}: {p} is not a mapping"])
            node = nxt
        node[parts[-1]] = yaml.safe_load(raw)
    return data


def parse_manifest(data: Any, source: str = "manifest") -> ImpalaJob:
    """Validate raw manifest data; raise ManifestError with actionable lines."""
    if not isinstance(data, dict):
        raise ManifestError(source, ["the document must be a mapping with kind: ImpalaJob"])
    try:
        return ImpalaJob.model_validate(data)
    except ValidationError as err:
        raise ManifestError(source, format_validation_error(err)) from None


def _documents(path: str | Path) -> list[Any]:
    try:
        return [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as err:
        raise ManifestError(str(path), [str(err)]) from None


def _first_of(kind: str, path: str | Path) -> dict[str, Any]:
    found = [d for d in _documents(path) if isinstance(d, dict) and d.get("kind") == kind]
    if not found:
        raise ManifestError(str(path), [f"no document with kind: {kind} found"], kind)
    return found[0]


def manifest_kind(path: str | Path) -> str:
    """The kind of a file's first document of ours: ImpalaPopulation when it holds one, else
    ImpalaJob (whose loading then says what is missing)."""
    kinds = [d.get("kind") for d in _documents(path) if isinstance(d, dict)]
    return POPULATION_KIND if POPULATION_KIND in kinds else "ImpalaJob"


def load_manifest(path: str | Path, overrides: list[str] | None = None) -> ImpalaJob:
    """Read the first ImpalaJob document of a YAML file, apply overrides, validate."""
    return parse_manifest(apply_overrides(_first_of("ImpalaJob", path), overrides or []), str(path))


def parse_population(data: Any, source: str = "manifest") -> ImpalaPopulation:
    """Validate raw ImpalaPopulation data; raise ManifestError with actionable lines."""
    if not isinstance(data, dict):
        raise ManifestError(source, ["the document must be a mapping"], POPULATION_KIND)
    try:
        return ImpalaPopulation.model_validate(data)
    except ValidationError as err:
        lines = format_validation_error(err, ImpalaPopulation)
        raise ManifestError(source, lines, POPULATION_KIND) from None


def load_population(path: str | Path, overrides: list[str] | None = None) -> ImpalaPopulation:
    """Read the first ImpalaPopulation document of a YAML file, apply overrides, validate."""
    data = apply_overrides(_first_of(POPULATION_KIND, path), overrides or [])
    return parse_population(data, str(path))
