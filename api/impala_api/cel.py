"""CEL rules (`x-kubernetes-validations`) of the ImpalaJob CRD.

Each rule restates a pydantic validator of `impala_api.spec` (or an invariant pydantic
cannot see, such as immutability), so the API server rejects what `impalajob validate` rejects.
Every message names the field, because `kubectl apply` shows the message and nothing else of
the rule. Paths are relative to `.spec`; `[]` means "each item".
"""

from __future__ import annotations

from typing import Any

from impala_api.spec import (
    CUSTOM_MODEL_IMPORT,
    CUSTOM_MODEL_LSTM,
    DEFAULT_POLICY,
    EVALUATION_GAMES_NEED_PETTINGZOO,
    EVALUATION_STOP_NEEDS_EVALUATION,
    MAPPING_NEEDED,
    MAPPING_ONE_WAY,
    MAX_SEQ_LEN_DIVIDES,
    MOUNT_NAMES_VOLUME_MESSAGE,
    MULTI_AGENT_NEEDS_PETTINGZOO,
    NO_STOP_CRITERION,
    ONE_VOLUME_SOURCE_MESSAGE,
    PETTINGZOO_OR_ID,
    POLICY_MAX_SEQ_LEN_DIVIDES,
    POLICY_NAME_PATTERN,
    POLICY_POPART_NEEDS_VTRACE,
    POPART_NEEDS_VTRACE,
    PREV_ACTION_REWARD_LSTM,
    RANDOM_OPPONENT,
    REPLICAS_NEED_VTRACE,
    RESERVED_ENV,
    RESERVED_ENV_MESSAGE,
    RESERVED_ENV_PREFIXES,
    RESERVED_PATH_MESSAGE,
    RESERVED_PATHS,
    RESERVED_VOLUME_MESSAGE,
    RESERVED_VOLUMES,
    SECRET_REF_NEEDS_URI,
    SELF_PLAY_POLICY,
    SEPARATE_LEARNER_NEEDS_VTRACE,
    STOP_POLICY_NEEDS_RETURN,
    UNKNOWN_EVALUATION_OPPONENT,
    UNKNOWN_EVALUATION_POLICY,
    UNKNOWN_MAPPED_POLICY,
    UNKNOWN_POLICY_TO_TRAIN,
    UNKNOWN_STOP_POLICY,
    VOLUME_SOURCES,
)
from impala_api.spec.training import DEFAULT_ENV_ID

Rule = dict[str, Any]


def _rule(rule: str, message: str, field: str | None = None) -> Rule:
    # No messageExpression: the API server's error already shows the offending value, and
    # string-building expressions are charged so much by the cost estimator that they do not fit.
    out: Rule = {"rule": rule, "message": message}
    if field is not None:
        out["fieldPath"] = field
        out["reason"] = "FieldValueInvalid"
    return out


def _immutable(field: str, what: str) -> list[Rule]:
    return [
        _rule(
            "self == oldSelf",
            f"spec.{field} is immutable: create a new ImpalaJob to change the {what}",
        )
    ]


def _replica_group(group: str) -> list[Rule]:
    p = f"spec.{group}"
    return [
        _rule(
            "self.minReplicas <= self.maxReplicas",
            f"{p}.minReplicas must be <= {p}.maxReplicas",
            ".minReplicas",
        ),
        # No rule on `replicas` itself: the spec model keeps a requested count within
        # [minReplicas, maxReplicas] by clamping (ReplicaGroupSpec.initial_replicas), so an
        # out-of-range `kubectl scale` is accepted and clamped, as `impalajob validate` accepts it.
    ]


def _autoscaling(group: str) -> list[Rule]:
    p = f"spec.{group}.autoscaling"
    return [
        _rule(
            "self.starvedQueueFill < self.saturatedQueueFill",
            f"{p}.starvedQueueFill must be below {p}.saturatedQueueFill",
            ".starvedQueueFill",
        )
    ]


def _schedule(field: str) -> list[Rule]:
    p = f"spec.training.{field}"
    return [
        _rule(
            "size(self) >= 1",
            f"{p} must list at least one [timestep, value] point, or be omitted",
        ),
        _rule(
            # Two-variable comprehension (Kubernetes >= 1.33): compare each point with the one
            # before it, O(n), so the rule needs no maxItems to stay within the cost budget.
            "self.all(i, pt, i == 0 || self[i - 1][0] < pt[0])",
            f"{p} timesteps must strictly increase; write points as [[0, start], [N, end], ...]",
        ),
    ]


def _schedule_point(field: str) -> list[Rule]:
    return [
        _rule(
            "self[0] >= 0.0 && double(int(self[0])) == self[0]",
            f"spec.training.{field}: each point is [timestep, value] with a whole-number "
            "timestep >= 0",
        )
    ]


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


def _pod_overrides(group: str) -> dict[tuple[str, ...], list[Rule]]:
    """The pod overrides' rules (spec.PodOverrides' validators), for one role's `pod`."""
    p = f"spec.{group}.pod"
    prefixes = " && ".join(f"!self.name.startsWith('{x}')" for x in RESERVED_ENV_PREFIXES)
    sources = ", ".join(f"has(self.{s})" for s in VOLUME_SOURCES)
    return {
        (group, "pod"): [
            _rule(
                "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
                "self.volumes.exists(v, v.name == m.name))",
                f"{p}.{MOUNT_NAMES_VOLUME_MESSAGE}",
                ".volumeMounts",
            )
        ],
        (group, "pod", "env", "[]"): [
            _rule(
                f"!(self.name in {_cel_list(RESERVED_ENV)}) && {prefixes}",
                f"{p}.{RESERVED_ENV_MESSAGE}",
                ".name",
            )
        ],
        (group, "pod", "volumes", "[]"): [
            _rule(
                f"!(self.name in {_cel_list(RESERVED_VOLUMES)})",
                f"{p}.{RESERVED_VOLUME_MESSAGE}",
                ".name",
            ),
            _rule(f"[{sources}].filter(x, x).size() == 1", f"{p}.{ONE_VOLUME_SOURCE_MESSAGE}"),
        ],
        (group, "pod", "volumeMounts", "[]"): [
            _rule(
                f"!{_cel_list(RESERVED_PATHS)}.exists(r, self.mountPath == r || "
                "self.mountPath.startsWith(r + '/'))",
                f"{p}.{RESERVED_PATH_MESSAGE}",
                ".mountPath",
            )
        ],
    }


def _is_policy(name: str) -> str:
    """CEL: `name` is a key of spec.multiAgent.policies (its one default policy without it)."""
    return (
        f"(has(self.multiAgent) ? {name} in self.multiAgent.policies : "
        f"{name} == '{DEFAULT_POLICY}')"
    )


RULES: dict[tuple[str, ...], list[Rule]] = {
    (): [
        _rule(
            "!has(self.model.maxSeqLen) || "
            "self.training.rolloutFragmentLength % self.model.maxSeqLen == 0",
            MAX_SEQ_LEN_DIVIDES,
            ".model.maxSeqLen",
        ),
        _rule(
            "!has(self.stop.evaluationReturnMean) || has(self.evaluation)",
            EVALUATION_STOP_NEEDS_EVALUATION,
            ".stop.evaluationReturnMean",
        ),
        _rule(
            "!has(self.learner.process) || self.learner.process != 'separate' || "
            "!has(self.training.mode) || self.training.mode == 'vtrace'",
            SEPARATE_LEARNER_NEEDS_VTRACE,
            ".learner.process",
        ),
        _rule(
            "!has(self.learner.replicas) || self.learner.replicas == 1 || "
            "!has(self.training.mode) || self.training.mode == 'vtrace'",
            REPLICAS_NEED_VTRACE,
            ".learner.replicas",
        ),
        _rule(
            "!has(self.model.popart) || !self.model.popart || "
            "!has(self.training.mode) || self.training.mode == 'vtrace'",
            POPART_NEEDS_VTRACE,
            ".model.popart",
        ),
        _rule(
            "!has(self.multiAgent) || has(self.env.pettingzoo)",
            MULTI_AGENT_NEEDS_PETTINGZOO,
            ".multiAgent",
        ),
        _rule(
            "!has(self.training.mode) || self.training.mode == 'vtrace' || "
            "!has(self.multiAgent) || self.multiAgent.policies.all(k, "
            "!has(self.multiAgent.policies[k].model) || "
            "!has(self.multiAgent.policies[k].model.popart) || "
            "!self.multiAgent.policies[k].model.popart)",
            POLICY_POPART_NEEDS_VTRACE,
            ".multiAgent.policies",
        ),
        _rule(
            "!has(self.multiAgent) || self.multiAgent.policies.all(k, "
            "!has(self.multiAgent.policies[k].model) || "
            "!has(self.multiAgent.policies[k].model.maxSeqLen) || "
            "self.training.rolloutFragmentLength % "
            "self.multiAgent.policies[k].model.maxSeqLen == 0)",
            POLICY_MAX_SEQ_LEN_DIVIDES,
            ".multiAgent.policies",
        ),
        _rule(
            "!has(self.evaluation) || has(self.env.pettingzoo) || "
            "(!has(self.evaluation.opponent) && !has(self.evaluation.policy))",
            EVALUATION_GAMES_NEED_PETTINGZOO,
            ".evaluation",
        ),
        _rule(
            "!has(self.evaluation) || !has(self.evaluation.opponent) || "
            f"self.evaluation.opponent == '{RANDOM_OPPONENT}' || "
            + _is_policy("self.evaluation.opponent"),
            UNKNOWN_EVALUATION_OPPONENT,
            ".evaluation.opponent",
        ),
        _rule(
            "!has(self.evaluation) || !has(self.evaluation.policy) || "
            + _is_policy("self.evaluation.policy"),
            UNKNOWN_EVALUATION_POLICY,
            ".evaluation.policy",
        ),
        _rule(
            "!has(self.stop.policy) || (has(self.env.pettingzoo) && "
            + _is_policy("self.stop.policy") + ")",
            UNKNOWN_STOP_POLICY,
            ".stop.policy",
        ),
    ],
    ("multiAgent",): [
        _rule(
            "self.policies.all(k, k.matches('" + POLICY_NAME_PATTERN + "') && size(k) <= 32)",
            "spec.multiAgent.policies: a policy name is lowercase letters, digits, '-' and '_', "
            "at most 32, starting and ending with a letter or digit",
            ".policies",
        ),
        _rule("!(has(self.policyMapping) && has(self.policyMappingFn))", MAPPING_ONE_WAY),
        _rule(
            "has(self.policyMapping) || has(self.policyMappingFn) || size(self.policies) == 1",
            MAPPING_NEEDED,
            ".policyMapping",
        ),
        _rule(
            "!has(self.policyMapping) || self.policyMapping.all(r, r.policy in self.policies)",
            UNKNOWN_MAPPED_POLICY,
            ".policyMapping",
        ),
        _rule(
            "!has(self.policiesToTrain) || self.policiesToTrain.all(p, p in self.policies)",
            UNKNOWN_POLICY_TO_TRAIN,
            ".policiesToTrain",
        ),
        _rule(
            "!has(self.selfPlay) || (self.selfPlay.policy in self.policies && "
            "(!has(self.policiesToTrain) || self.selfPlay.policy in self.policiesToTrain))",
            SELF_PLAY_POLICY,
            ".selfPlay.policy",
        ),
    ],
    ("env",): [
        *_immutable("env", "environment"),
        _rule(f"!has(self.pettingzoo) || self.id == '{DEFAULT_ENV_ID}'", PETTINGZOO_OR_ID, ".id"),
    ],
    ("stop",): [
        _rule(
            "has(self.timesteps) || has(self.episodeReturnMean) || "
            "has(self.evaluationReturnMean) || has(self.timeLimitSeconds)",
            NO_STOP_CRITERION,
        ),
        _rule(
            "!has(self.policy) || has(self.episodeReturnMean)", STOP_POLICY_NEEDS_RETURN, ".policy"
        ),
    ],
    ("model",): [
        *_immutable("model", "network"),
        _rule("(self.type == 'custom') == has(self.import)", CUSTOM_MODEL_IMPORT, ".import"),
        _rule("self.type != 'custom' || !self.useLstm", CUSTOM_MODEL_LSTM, ".useLstm"),
        _rule(
            "!self.lstmUsePrevActionReward || self.useLstm",
            PREV_ACTION_REWARD_LSTM,
            ".lstmUsePrevActionReward",
        ),
    ],
    ("training",): [
        _rule(
            "self.replayBatchesPerFresh == 0.0 || self.replayBufferBatches >= 1",
            "spec.training.replayBatchesPerFresh > 0 needs spec.training.replayBufferBatches >= 1 "
            "(the replay capacity)",
            ".replayBufferBatches",
        )
    ],
    ("training", "lrSchedule"): _schedule("lrSchedule"),
    ("training", "lrSchedule", "[]"): _schedule_point("lrSchedule"),
    ("training", "entropyCoeffSchedule"): _schedule("entropyCoeffSchedule"),
    ("training", "entropyCoeffSchedule", "[]"): _schedule_point("entropyCoeffSchedule"),
    ("checkpoint",): [
        _rule(
            "!has(self.secretRef) || has(self.storageUri)",
            f"spec.{SECRET_REF_NEEDS_URI}",
            ".secretRef",
        )
    ],
    ("rollouts",): _replica_group("rollouts"),
    ("aggregators",): _replica_group("aggregators"),
    ("rollouts", "autoscaling"): _autoscaling("rollouts"),
    ("aggregators", "autoscaling"): _autoscaling("aggregators"),
    **_pod_overrides("learner"),
    **_pod_overrides("rollouts"),
    **_pod_overrides("aggregators"),
}
