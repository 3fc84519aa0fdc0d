"""`impalajob crd`: the ImpalaJob CustomResourceDefinition, generated from the pydantic spec model.

The spec's openAPIV3Schema is `ImpalaJobSpec.model_json_schema()` made structural: `$ref`s
inlined, `anyOf [X, null]` turned into `nullable: true`, JSON-Schema-2020 exclusive bounds turned
into OpenAPI 3.0 booleans, tuples turned into fixed-size arrays, free-form maps marked
`x-kubernetes-preserve-unknown-fields`, and defaults taken from a default-constructed model (so
`default_factory` fields get theirs too), inside a section absent by default (`evaluation`, a
policy's `model`) from its fields' own (the API server fills them in once the section is given).
Cross-field rules that pydantic checks in validators
are restated as CEL (`x-kubernetes-validations`, see `cel.py`), so the API server and the model
reject the same manifests. The status schema is written here: the operator is its only writer.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, TypeAdapter

from impala_api import cel, names
from impala_api.population.spec import ImpalaPopulationSpec
from impala_api.spec import (
    API_GROUP,
    API_VERSION,
    KIND,
    MAX_NAME_LENGTH,
    PLURAL,
    ImpalaJobSpec,
    StopSpec,
)

SINGULAR = "impalajob"
SHORT_NAMES = ["ij"]
CATEGORIES = ["impala"]
CRD_NAME = f"{PLURAL}.{API_GROUP}"
PHASES = ["Pending", "Starting", "Running", "Suspended", "Succeeded", "Failed"]

_DROP = {"title", "$defs", "default"}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline a `$ref` (the referring node's description wins: it is the field's docstring)."""
    if "$ref" not in node:
        return node
    target: dict[str, Any] = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
    target.update({k: v for k, v in node.items() if k != "$ref"})
    return target


def _models() -> dict[str, type[BaseModel]]:
    """Every section model of both kinds' specs by class name (the JSON schema's `$defs`
    keys)."""
    found: dict[str, type[BaseModel]] = {}
    todo: list[Any] = [ImpalaJobSpec, ImpalaPopulationSpec]
    while todo:
        cls = todo.pop()
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__name__ not in found:
            found[cls.__name__] = cls
            for info in cls.model_fields.values():
                todo.extend(_classes_in(info.annotation))
    return found


def _classes_in(annotation: Any) -> list[Any]:
    args = getattr(annotation, "__args__", ())
    return [annotation, *(c for a in args for c in _classes_in(a))]


def _section_default(ref: str | None) -> dict[str, Any] | None:
    """The defaults of a section whose position has none of its own (an optional section, a
    map's values): each of its fields' defaults, so the API server fills in the fields a
    manifest omits inside it as the model would."""
    cls = _models().get(ref.rsplit("/", 1)[-1]) if ref else None
    if cls is None:
        return None
    out = {}
    for name, info in cls.model_fields.items():
        if not info.is_required() and info.annotation is not None:
            value = TypeAdapter(info.annotation).dump_python(
                info.get_default(call_default_factory=True), mode="json", by_alias=True
            )
            out[info.alias or name] = value
    return out


def _structural(node: dict[str, Any], defs: dict[str, Any], default: Any) -> dict[str, Any]:
    """One JSON-schema node as a structural OpenAPI v3.0 node; `default` is the model's default
    for this position (from a default-constructed spec), or None."""
    ref = node.get("$ref")
    node = _resolve(node, defs)
    any_of = node.get("anyOf")
    if any_of is not None:
        # pydantic writes Optional[X] as anyOf [X, {type: null}]; structural schemas want X with
        # nullable: true instead (a real union would not be structural, so refuse it).
        others = [s for s in any_of if s.get("type") != "null"]
        if len(others) != 1 or len(any_of) != 2:
            raise ValueError(f"cannot express anyOf {any_of} structurally")
        merged = dict(others[0])
        merged.update({k: v for k, v in node.items() if k != "anyOf"})
        inner = _structural(merged, defs, default)
        inner["nullable"] = True
        return _ordered(inner)

    out: dict[str, Any] = {k: v for k, v in node.items() if k not in _DROP}
    for bound, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), int | float) and not isinstance(out[bound], bool):
            out[inclusive] = out[bound]
            out[bound] = True

    kind = out.get("type")
    if kind is None and not any(k in out for k in ("properties", "items", "enum")):
        # Any value (a grid's points: numbers, lists, strings): kept as given.
        out["x-kubernetes-preserve-unknown-fields"] = True
    if kind == "object":
        props = out.get("properties")
        extra = out.pop("additionalProperties", None)
        if props is not None:
            sub = default if isinstance(default, dict) else _section_default(ref) or {}
            out["properties"] = {
                name: _structural(prop, defs, sub.get(name)) for name, prop in props.items()
            }
            if default is not None and not out.get("required"):
                # Each section defaults to {} so that the API server then fills in its fields:
                # `spec: {stop: ...}` comes back fully defaulted, as the pydantic model would have
                # it. A section with required fields (`spec` itself: `stop`) has no default; the
                # API server refuses a default that lacks them.
                out["default"] = {}
        elif extra is True or extra is None:
            out["x-kubernetes-preserve-unknown-fields"] = True
        else:
            out["additionalProperties"] = _structural(extra, defs, None)
    elif kind == "array" and "prefixItems" in out:
        # A tuple field ([low, high]): one item schema for all, its length fixed.
        kinds = {item.get("type") for item in out.pop("prefixItems")}
        out["items"] = {"type": "integer" if kinds == {"integer"} else "number"}
    elif kind == "array":
        items = out.get("items", {})
        if "prefixItems" in items:
            # A tuple such as a schedule point (timestep, value): a structural schema has one item
            # schema per array, so it is a 2-array of numbers; CEL checks the timestep part.
            tuple_items = items["prefixItems"]
            out["items"] = {
                "type": "array",
                "items": {"type": "number"},
                "minItems": len(tuple_items),
                "maxItems": len(tuple_items),
            }
        else:
            out["items"] = _structural(items, defs, None)
    if kind != "object" and default is not None and default != [] and default != {}:
        out["default"] = default
    return _ordered(out)


_FIRST = ("type", "format", "description", "nullable", "default", "enum")


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    """Type and description first: the generated YAML is read by people in code review."""
    head = {k: node[k] for k in _FIRST if k in node}
    return head | {k: v for k, v in node.items() if k not in head}


def _filled(node: dict[str, Any], value: Any) -> Any:
    """`value` with the schema's defaults applied inside it, as the API server would."""
    if isinstance(value, dict) and "properties" in node:
        for name, prop in node["properties"].items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                value[name] = _filled(prop, value[name])
    return value


def attach_rules(
    schema: dict[str, Any], rules_at: dict[tuple[str, ...], list[cel.Rule]] = cel.RULES
) -> None:
    """Put each CEL rule on the schema node it is written against (paths from `schema`)."""
    for path, rules in rules_at.items():
        node = schema
        for part in path:
            if part == "[]":
                node = node["items"]
            elif part == "{}":  # each value of a map
                node = node["additionalProperties"]
            else:
                node = node["properties"][part]
        node.setdefault("x-kubernetes-validations", []).extend(copy.deepcopy(rules))
        if "default" in node and any("oldSelf" not in r["rule"] for r in rules):
            # The API server checks a default against the rules as written, without defaulting
            # inside it first, so a section with rules defaults to its complete default value.
            node["default"] = _filled(node, {})


def spec_schema() -> dict[str, Any]:
    """The structural openAPIV3Schema of `.spec`, with defaults and CEL rules."""
    # `stop` is required and has no default (an empty one is refused): the other sections' defaults
    # come from a spec whose only given field is a placeholder stop, which is then dropped.
    placeholder = ImpalaJobSpec(stop=StopSpec(timesteps=1))
    defaults = placeholder.model_dump(mode="json", by_alias=True, exclude={"stop"})
    schema = model_schema(ImpalaJobSpec, defaults)
    attach_rules(schema)
    return schema


def model_schema(model: type[BaseModel], defaults: dict[str, Any]) -> dict[str, Any]:
    """A model's structural openAPIV3Schema, with `defaults` (its default-constructed dump)."""
    raw = model.model_json_schema(by_alias=True)
    return _structural(raw, raw.get("$defs", {}), defaults)


def _obj(props: dict[str, Any], description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "description": description, "properties": props, **extra}


def _int(description: str) -> dict[str, Any]:
    return {"type": "integer", "format": "int64", "description": description}


def _str(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _time(description: str) -> dict[str, Any]:
    return {"type": "string", "format": "date-time", "description": description}


def _group_status(what: str) -> dict[str, Any]:
    return _obj(
        {
            "desired": _int(f"{what} pods the operator wants (after autoscaling and suspend)."),
            "replicas": _int(f"{what} pods that exist (the scale subresource's status.replicas)."),
            "ready": _int(f"{what} pods that are Ready."),
            "selector": _str(f"Label selector of the {what.lower()} pods (scale subresource)."),
            "summary": _str("ready/desired, e.g. 2/3 (printer column)."),
        },
        f"{what} pods.",
    )


def _progress_schema() -> dict[str, Any]:
    """status.progress: the sidecar's figures the operator copies into the CR."""
    return _obj(
        {
            "timesteps": _int("Env steps sampled."),
            "episodes": _int("Episodes completed."),
            "episodeReturnMean": {
                "type": "number",
                "nullable": True,
                "description": "Mean return of the last 100 episodes (null before the first).",
            },
            "bestEpisodeReturnMean": {
                "type": "number",
                "nullable": True,
                "description": (
                    "The best of those means so far, once 100 episodes have ended (the "
                    "ReturnRegressed condition compares the mean with it); absent for a job "
                    "whose returnSource is evaluation."
                ),
            },
            "returnMean": {
                "type": "number",
                "nullable": True,
                "description": (
                    "The return the job is judged by (the Return column; its ReturnRegressed "
                    "condition follows it): episodeReturnMean, or for a job scored against a "
                    "fixed opponent (spec.evaluation.opponent: self-play, whose zero-sum "
                    "training return is 0 whatever it learns) evaluationReturnMean (null "
                    "before the first evaluation)."
                ),
            },
            "returnSource": {
                "type": "string",
                "enum": ["training", "evaluation"],
                "description": "Which return returnMean is: training or evaluation.",
            },
            "evaluationReturnMean": {
                "type": "number",
                "nullable": True,
                "description": "Mean return of the latest evaluation (spec.evaluation).",
            },
            "evaluationTimesteps": _int("Env steps sampled when its weights were taken."),
            "bestEvaluationReturnMean": {
                "type": "number",
                "nullable": True,
                "description": "The best evaluation's mean return so far.",
            },
            "bestCheckpoint": _str("The best evaluation's checkpoint, in the run directory."),
            "evaluationWinRate": {
                "type": "number",
                "nullable": True,
                "description": (
                    "A PettingZoo env's: wins per game of the latest evaluation against "
                    "spec.evaluation.opponent."
                ),
            },
            "policies": _policies_progress_schema(),
            "stopProgress": {
                "type": "number",
                "description": "Progress toward the nearest stop criterion, 0..1.",
            },
            **_completion_schema(),
            "envStepsPerSecond": {"type": "number", "description": "Sampling throughput."},
            "learnerQueueFill": {
                "type": "number",
                "description": "Learner queue fill, 0..1 (what the autoscaler reads).",
            },
            "policyVersion": _int("Learner updates applied (weights version)."),
            "updatedAt": _time("When the sidecar's snapshot was written."),
        },
        "Training progress, read from the status sidecar's /status.",
    )


def _policies_progress_schema() -> dict[str, Any]:
    """status.progress.policies: a PettingZoo env's policies by name."""
    return {
        "type": "object",
        "description": "A PettingZoo env's policies by name (spec.multiAgent).",
        "additionalProperties": _obj(
            {
                "episodeReturnMean": {
                    "type": "number",
                    "nullable": True,
                    "description": (
                        "Mean return of its agents over their last 100 episodes (what "
                        "spec.stop.policy's episodeReturnMean measures)."
                    ),
                },
                "episodes": _int("Agent episodes counted."),
                "selfPlayScore": {
                    "type": "number",
                    "nullable": True,
                    "description": (
                        "spec.multiAgent.selfPlay's policy: its mean score over its "
                        "last 100 games against the snapshot pool (1 a win, 0.5 a draw)."
                    ),
                },
            },
            "One policy's training figures.",
        ),
    }


def _completion_schema() -> dict[str, Any]:
    """status.progress's percent done and time left (the Done% and ETA printer columns)."""
    return {
        "percentComplete": _int(
            "Percent of the way to stop.timesteps or stop.timeLimitSeconds, whichever is "
            "nearer; absent when neither is set (a return criterion's end cannot be known)."
        ),
        "remainingSeconds": _int(
            "Estimated seconds left until stop.timesteps (at the recent sampling rate) or "
            "stop.timeLimitSeconds, whichever comes first: at most that when a return "
            "criterion ends the run sooner. Only while the job runs."
        ),
        "eta": _str("remainingSeconds as kubectl prints a duration (3m20s, 1h05m)."),
    }


def _admission_schema() -> dict[str, Any]:
    """`.status.admission`: where Kueue admitted a queued job."""
    return _obj(
        {
            "clusterQueue": _str("The ClusterQueue that admitted the job."),
            "podSets": {
                "type": "array",
                "description": "Per pod set (learner, rollout, aggregator): what was admitted.",
                "items": _obj(
                    {
                        "name": _str("learner, rollout or aggregator."),
                        "count": _int("Pods admitted (rollouts autoscale up to it)."),
                        "nodeSelector": {
                            "type": "object",
                            "description": "Node labels of the assigned ResourceFlavors.",
                            "additionalProperties": {"type": "string"},
                        },
                        "tolerations": {
                            "type": "array",
                            "description": "Tolerations of the assigned ResourceFlavors.",
                            "items": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                        "labels": {
                            "type": "object",
                            "description": "Pod labels an admission check added.",
                            "additionalProperties": {"type": "string"},
                        },
                        "annotations": {
                            "type": "object",
                            "description": "Pod annotations an admission check added.",
                            "additionalProperties": {"type": "string"},
                        },
                    },
                    "One pod set's admission.",
                    required=["name", "count"],
                ),
            },
        },
        "Where Kueue admitted a job labelled kueue.x-k8s.io/queue-name (absent while it "
        "waits): its pods carry these node labels and tolerations.",
        nullable=True,
    )


def status_schema() -> dict[str, Any]:
    """`.status`: written only by the operator; every field is described (`kubectl explain`)."""
    condition = _obj(
        {
            "type": _str(f"Condition type: {', '.join(names.CONDITION_TYPES)}."),
            "status": _str("True, False or Unknown.", enum=["True", "False", "Unknown"]),
            "reason": _str("One-word CamelCase reason."),
            "message": _str("Human-readable detail."),
            "lastTransitionTime": _time("When status last changed."),
            "observedGeneration": _int("metadata.generation the condition describes."),
        },
        "A condition, as metav1.Condition.",
        required=["type", "status", "reason", "message", "lastTransitionTime"],
    )
    progress = _progress_schema()
    learner = _obj(
        {
            "ready": {"type": "boolean", "description": "The learner pod of rank 0 is Ready."},
            "replicas": _int("spec.learner.replicas: learner pods per attempt."),
            "readyReplicas": _int("Learner pods of the current attempt that are Ready."),
            "summary": _str("readyReplicas/replicas, as `kubectl get ij` shows it."),
            "restarts": _int("Learner restarts so far (each resumes from the latest checkpoint)."),
            "failures": _int("Restarts after the learner failed: what backoffLimit counts."),
            "disruptions": _int(
                "Restarts after the cluster or a user ended a learner pod (eviction, preemption, "
                "node shutdown or loss, a deleted pod): retried without using backoffLimit."
            ),
            "podName": _str("Name of the current learner pod of rank 0 (the driver's)."),
            "lastExitCode": _int("Exit code of the last learner container that ended."),
        },
        "The learner pods.",
    )
    admission = _admission_schema()
    return _obj(
        {
            "phase": _str("Lifecycle phase.", enum=PHASES),
            "message": _str("Why the job is in this phase."),
            "observedGeneration": _int(
                "metadata.generation whose children the operator applied (a generation it "
                "could not apply is never reported)."
            ),
            "conditions": {
                "type": "array",
                "description": (
                    f"Conditions ({', '.join(names.CONDITION_TYPES)}); `kubectl wait "
                    "--for=condition=Succeeded` waits for the job to finish."
                ),
                "items": condition,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
            "learner": learner,
            "rollouts": _group_status("Rollout"),
            "aggregators": _group_status("Aggregator"),
            "progress": progress,
            "startTime": _time("When the job first started running."),
            "completionTime": _time("When the job reached Succeeded or Failed."),
            "lastScaleTime": _time("Last autoscaling decision that changed replicas."),
            "statusURL": _str("URL of the job's status sidecar /status (/metrics beside it)."),
            "admission": admission,
        },
        "Observed state, written by the operator.",
    )


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition as a dict."""
    root = _obj(
        {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                # Only name/generateName may be constrained here; children append up to 11
                # characters ("-aggregator") and must stay within 63.
                "properties": {
                    "name": {
                        "type": "string",
                        "maxLength": MAX_NAME_LENGTH,
                        "pattern": r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
                    }
                },
            },
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "An IMPALA reinforcement-learning job: a learner pod (Ray head) and autoscaled rollout "
        "and aggregator pods.",
        required=["spec"],
    )
    columns: list[Column] = [
        ("Phase", "string", ".status.phase", 0),
        ("Learners", "string", ".status.learner.summary", 0),
        ("Rollouts", "string", ".status.rollouts.summary", 0),
        ("Steps", "integer", ".status.progress.timesteps", 0),
        ("Return", "number", ".status.progress.returnMean", 0),
        ("Done%", "integer", ".status.progress.percentComplete", 0),
        ("ETA", "string", ".status.progress.eta", 0),
        ("Age", "date", ".metadata.creationTimestamp", 0),
        ("Regressed", "string", '.status.conditions[?(@.type=="ReturnRegressed")].status', 0),
        ("Eval", "number", ".status.progress.evaluationReturnMean", 1),
        ("Message", "string", ".status.message", 1),
    ]
    subresources = {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.rollouts.replicas",
            "statusReplicasPath": ".status.rollouts.replicas",
            "labelSelectorPath": ".status.rollouts.selector",
        },
    }
    kind_names = {"kind": KIND, "plural": PLURAL, "singular": SINGULAR, "shortNames": SHORT_NAMES}
    return definition(kind_names, root, subresources, columns)


Column = tuple[str, str, str, int]
"""A printer column: name, type, JSON path, priority (0: always shown)."""


def definition(
    kind_names: dict[str, Any],
    root: dict[str, Any],
    subresources: dict[str, Any],
    columns: list[Column],
) -> dict[str, Any]:
    """A CustomResourceDefinition of ours: `kind_names` (kind, plural, singular, shortNames),
    the root schema, the subresources and the printer columns."""
    kind, plural = kind_names["kind"], kind_names["plural"]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{API_GROUP}",
            "labels": {names.NAME: names.APP_NAME, names.PART_OF_KEY: names.PART_OF},
        },
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind_names["singular"],
                "shortNames": kind_names["shortNames"],
                "categories": CATEGORIES,
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": subresources,
                    "additionalPrinterColumns": [
                        {"name": n, "type": t, "jsonPath": p, **({"priority": pr} if pr else {})}
                        for n, t, p, pr in columns
                    ],
                }
            ],
        },
    }
