"""The ImpalaPopulation CustomResourceDefinition, generated from `population.spec`'s models as
the ImpalaJob's is (`impala_api.crd`): the template is an ImpalaJob spec with every rule of
one, and the population's own cross-field rules are restated as CEL where the API server can
check them (the field paths a search and the mutations name, ranges and bounds in order). What
CEL cannot see the model refuses (`impalajob validate`), and so will the operator: a grid that
does not divide the members, a drawn value a job would refuse, and a parameter with two
distributions (`grid` and `choice` hold any JSON, which CEL cannot type, so no rule can name
them)."""

from __future__ import annotations

from typing import Any

from impala_api import cel, crd
from impala_api.population.paths import LIVE_FIELDS, value_paths
from impala_api.population.search import LOG_RANGE_POSITIVE, RANGE_ORDER
from impala_api.population.spec import (
    MAX_POPULATION_NAME_LENGTH,
    MUTATION_BOUNDS,
    MUTATION_NOT_LIVE,
    POPULATION_KIND,
    POPULATION_PLURAL,
    ImpalaPopulationSpec,
)
from impala_api.spec import ImpalaJobSpec, StopSpec

SHORT_NAMES = ["ipop"]
PHASES = ["Pending", "Running", "Succeeded", "Failed"]


def _keys_in(allowed: list[str] | tuple[str, ...], message: str) -> cel.Rule:
    listed = ", ".join(f"'{a}'" for a in allowed)
    return {"rule": f"self.all(k, k in [{listed}])", "message": message}


def _ordered(field: str, strict: bool = True) -> cel.Rule:
    op = "<" if strict else "<="
    return {"rule": f"!has(self.{field}) || self.{field}[0] {op} self.{field}[1]",
            "message": RANGE_ORDER}  # fmt: skip


RULES: dict[tuple[str, ...], list[cel.Rule]] = {
    ("search", "parameters"): [_keys_in(list(value_paths()),
        "spec.search.parameters: each key is a field path of spec.template that holds a value "
        "(training.lr, model.hidden, ...): `impalajob validate` names the fields")],
    ("search", "parameters", "{}"): [
        _ordered("uniform"), _ordered("logUniform"), _ordered("integer"),
        {"rule": "!has(self.logUniform) || self.logUniform[0] > 0.0",
         "message": LOG_RANGE_POSITIVE},
    ],
    ("pbt", "mutations"): [_keys_in(LIVE_FIELDS, MUTATION_NOT_LIVE)],
    ("pbt", "mutations", "{}"): [
        {"rule": "!has(self.min) || !has(self.max) || self.min < self.max",
         "message": MUTATION_BOUNDS},
    ],
}  # fmt: skip


def spec_schema() -> dict[str, Any]:
    """`.spec`: the template with an ImpalaJob spec's defaults and rules, the rest with its
    own."""
    template = ImpalaJobSpec(stop=StopSpec(timesteps=1))
    placeholder = ImpalaPopulationSpec(template=template, members=1)
    defaults = placeholder.model_dump(mode="json", by_alias=True, exclude={"members"})
    defaults["template"].pop("stop")
    schema = crd.model_schema(ImpalaPopulationSpec, defaults)
    crd.attach_rules(schema["properties"]["template"])
    crd.attach_rules(schema, RULES)
    return schema


def status_schema() -> dict[str, Any]:
    """`.status`: written only by the operator."""
    number = {"type": "number", "nullable": True}
    member = {"type": "object", "description": "A member on the leaderboard.", "properties": {
        "name": {"type": "string", "description": "The member's ImpalaJob."},
        "phase": {"type": "string", "description": "Its phase."},
        "fitness": {**number, "description": "Its fitness now (spec.pbt.fitness)."},
        "envSteps": {"type": "integer", "description": "Env steps it has sampled."},
        "values": {"type": "object", "description": "Its live hyperparameters now.",
                   "additionalProperties": {"type": "number"}},
        "parent": {"type": "string", "description": "The member it last adopted."},
    }}  # fmt: skip
    decision = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                "description": "A decision: member, index, timesteps, fitness, parent, values, "
                               "reason."}  # fmt: skip
    return {"type": "object", "description": "Observed state, written by the operator.",
            "properties": {
                "phase": {"type": "string", "enum": PHASES, "description": "Lifecycle phase."},
                "message": {"type": "string", "description": "Why it is in this phase."},
                "members": {"type": "array", "items": member,
                            "description": "The leaderboard, best first."},
                "summary": {"type": "string", "description": "running/members (printer column)."},
                "best": {"type": "string", "description": "The best member now."},
                "bestFitness": {**number, "description": "Its fitness."},
                "exploits": {"type": "integer", "description": "Exploits so far."},
                "lineage": {"type": "array", "items": decision,
                            "description": "Every decision taken, oldest first."},
            }}  # fmt: skip


def build_population_crd() -> dict[str, Any]:
    root = {"type": "object", "required": ["spec"],
            "description": "A population of ImpalaJobs: a sweep, or population-based training.",
            "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                "metadata": {"type": "object", "properties": {"name": {
                    "type": "string", "maxLength": MAX_POPULATION_NAME_LENGTH,
                    "pattern": r"^[a-z]([-a-z0-9]*[a-z0-9])?$"}}},
                "spec": spec_schema(), "status": status_schema()}}  # fmt: skip
    columns: list[crd.Column] = [
        ("Phase", "string", ".status.phase", 0),
        ("Members", "string", ".status.summary", 0),
        ("Best", "string", ".status.best", 0),
        ("Fitness", "number", ".status.bestFitness", 0),
        ("Exploits", "integer", ".status.exploits", 0),
        ("Age", "date", ".metadata.creationTimestamp", 0),
        ("Message", "string", ".status.message", 1),
    ]
    kind_names = {"kind": POPULATION_KIND, "plural": POPULATION_PLURAL,
                  "singular": POPULATION_KIND.lower(), "shortNames": SHORT_NAMES}  # fmt: skip
    return crd.definition(kind_names, root, {"status": {}}, columns)
