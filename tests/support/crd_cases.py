"""ImpalaJob manifests the CRD must reject (and accept), shared by the unit and e2e tests.

Each invalid case names the field the error message must mention. The unit tests check that the
pydantic model rejects every case and that the CRD's OpenAPI schema rejects the schema-level ones;
the e2e tests send every case to a real API server and assert on its message. Together they keep
`impalajob validate` and `kubectl apply` agreeing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

from impala_api.spec import (
    CUSTOM_MODEL_IMPORT,
    CUSTOM_MODEL_LSTM,
    EVALUATION_GAMES_NEED_PETTINGZOO,
    EVALUATION_STOP_NEEDS_EVALUATION,
    MAPPING_NEEDED,
    MAPPING_ONE_WAY,
    MAX_SEQ_LEN_DIVIDES,
    MULTI_AGENT_NEEDS_PETTINGZOO,
    NO_STOP_CRITERION,
    PETTINGZOO_OR_ID,
    POLICY_MAX_SEQ_LEN_DIVIDES,
    POLICY_POPART_NEEDS_VTRACE,
    PREV_ACTION_REWARD_LSTM,
    REPLICAS_NEED_VTRACE,
    SELF_PLAY_POLICY,
    SEPARATE_LEARNER_NEEDS_VTRACE,
    STOP_POLICY_NEEDS_RETURN,
    UNKNOWN_EVALUATION_OPPONENT,
    UNKNOWN_EVALUATION_POLICY,
    UNKNOWN_MAPPED_POLICY,
    UNKNOWN_POLICY_TO_TRAIN,
    UNKNOWN_STOP_POLICY,
)

Kind = Literal["schema", "unknown", "cel", "immutable", "name"]


@dataclass(frozen=True)
class Invalid:
    """A manifest change the API server must refuse."""

    id: str
    kind: Kind
    """schema: bounds/enums/patterns; unknown: a field not in the schema (strict validation);
    cel: a cross-field rule; immutable: a rule checked on update; name: metadata.name."""
    patch: dict[str, Any]
    """Deep-merged into `base_job()['spec']` (for `immutable`: into the spec of an update)."""
    field: str
    """Field path the error message must name."""
    message: str | None = None
    """Text every refusal must carry word for word (the model's, the CLI's, the API server's)."""


@dataclass(frozen=True)
class Replace:
    """A patch value that replaces the section whole instead of merging into it."""

    value: Any


REMOVE = object()
"""A patch value that deletes the key."""


def base_job(name: str = "valid") -> dict[str, Any]:
    """A small valid ImpalaJob."""
    return {
        "apiVersion": "impala.dev/v1alpha1",
        "kind": "ImpalaJob",
        "metadata": {"name": name},
        "spec": {
            "env": {"id": "CartPole-v1", "numEnvsPerWorker": 4},
            "model": {"type": "mlp", "hidden": [32, 32]},
            "training": {"lr": 0.001, "trainBatchSize": 200},
            "rollouts": {"minReplicas": 1, "maxReplicas": 3},
            "stop": {"timesteps": 100_000},
        },
    }


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge (lists and scalars in `patch` replace)."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is REMOVE:
            out.pop(key, None)
        elif isinstance(value, Replace):
            out[key] = copy.deepcopy(value.value)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def job_with(case: Invalid, name: str = "bad") -> dict[str, Any]:
    """The base job with the case's change applied (for `immutable`: the updated object)."""
    job = base_job(LONG_NAME if case.kind == "name" else name)
    job["spec"] = merge(job["spec"], case.patch)
    return job


INVALID: list[Invalid] = [
    # --- bounds, enums, patterns (openAPIV3Schema)
    Invalid("lr-zero", "schema", {"training": {"lr": 0}}, "spec.training.lr"),
    Invalid("lr-above-one", "schema", {"training": {"lr": 2.0}}, "spec.training.lr"),
    Invalid("gamma-above-one", "schema", {"training": {"gamma": 1.5}}, "spec.training.gamma"),
    Invalid("no-envs", "schema", {"env": {"numEnvsPerWorker": 0}}, "spec.env.numEnvsPerWorker"),
    Invalid(
        "wrapper-not-an-import-path",
        "schema",
        {"env": {"wrappers": [{"import": "my grid/wrappers.py"}]}},
        "spec.env.wrappers[0].import",
    ),
    Invalid(
        "wrapper-unknown-field",
        "unknown",
        {"env": {"wrappers": [{"import": "mygrid:Wrap", "args": [1]}]}},
        "spec.env.wrappers[0].args",
    ),
    Invalid(
        "batch-zero", "schema", {"training": {"trainBatchSize": 0}}, "spec.training.trainBatchSize"
    ),
    Invalid("hidden-empty", "schema", {"model": {"hidden": []}}, "spec.model.hidden"),
    Invalid("hidden-zero-units", "schema", {"model": {"hidden": [0]}}, "spec.model.hidden"),
    Invalid(
        "max-replicas-too-many",
        "schema",
        {"rollouts": {"maxReplicas": 1001}},
        "spec.rollouts.maxReplicas",
    ),
    Invalid("gpus-too-many", "schema", {"learner": {"gpus": 17}}, "spec.learner.gpus"),
    Invalid(
        "backoff-negative",
        "schema",
        {"runPolicy": {"backoffLimit": -1}},
        "spec.runPolicy.backoffLimit",
    ),
    Invalid("keep-zero", "schema", {"checkpoint": {"keep": 0}}, "spec.checkpoint.keep"),
    Invalid(
        "claim-bad-name",
        "schema",
        {"checkpoint": {"volumeClaim": "Bad_Name"}},
        "spec.checkpoint.volumeClaim",
    ),
    Invalid(
        "cpu-not-a-quantity",
        "schema",
        {"learner": {"resources": {"requests": {"cpu": "lots"}}}},
        "spec.learner.resources.requests.cpu",
    ),
    Invalid(
        "momentum-one",
        "schema",
        {"training": {"optimizer": {"momentum": 1.0}}},
        "spec.training.optimizer.momentum",
    ),
    Invalid(
        "schedule-point-of-three",
        "schema",
        {"training": {"lrSchedule": [[0, 0.1, 3]]}},
        "spec.training.lrSchedule",
    ),
    Invalid("model-type", "schema", {"model": {"type": "transformer"}}, "spec.model.type"),
    Invalid("training-mode", "schema", {"training": {"mode": "ppo"}}, "spec.training.mode"),
    Invalid(
        "clean-pod-policy",
        "schema",
        {"runPolicy": {"cleanPodPolicy": "Some"}},
        "spec.runPolicy.cleanPodPolicy",
    ),
    Invalid("pull-policy", "schema", {"imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy"),
    Invalid(
        "toleration-operator",
        "schema",
        {"learner": {"tolerations": [{"key": "gpu", "operator": "Maybe"}]}},
        "spec.learner.tolerations[0].operator",
    ),
    Invalid("stop-missing", "schema", {"stop": REMOVE}, "spec.stop"),
    # --- unknown fields (strict field validation)
    Invalid(
        "unknown-training-field",
        "unknown",
        {"training": {"learningRate": 0.1}},
        "spec.training.learningRate",
    ),
    Invalid("unknown-section", "unknown", {"rollout": {"minReplicas": 1}}, "spec.rollout"),
    # --- cross-field rules (CEL)
    Invalid(
        "rollout-min-above-max",
        "cel",
        {"rollouts": {"minReplicas": 5, "maxReplicas": 4}},
        "spec.rollouts.minReplicas",
    ),
    Invalid(
        "aggregator-min-above-max",
        "cel",
        {"aggregators": {"minReplicas": 2, "maxReplicas": 1}},
        "spec.aggregators.minReplicas",
    ),
    Invalid(
        "starved-above-saturated",
        "cel",
        {"rollouts": {"autoscaling": {"starvedQueueFill": 0.9, "saturatedQueueFill": 0.5}}},
        "spec.rollouts.autoscaling.starvedQueueFill",
    ),
    Invalid(
        "custom-model-without-import",
        "cel",
        {"model": {"type": "custom"}},
        "spec.model.import",
        CUSTOM_MODEL_IMPORT,
    ),
    Invalid(
        "import-without-custom-model",
        "cel",
        {"model": {"import": "mygrid.models:Net"}},
        "spec.model.import",
        CUSTOM_MODEL_IMPORT,
    ),
    Invalid(
        "custom-model-with-lstm",
        "cel",
        {"model": {"type": "custom", "import": "mygrid.models:Net", "useLstm": True}},
        "spec.model.useLstm",
        CUSTOM_MODEL_LSTM,
    ),
    Invalid(
        "prev-action-reward-without-lstm",
        "cel",
        {"model": {"lstmUsePrevActionReward": True}},
        "spec.model.lstmUsePrevActionReward",
        PREV_ACTION_REWARD_LSTM,
    ),
    Invalid(
        "seq-len-not-dividing-fragments",
        "cel",
        {"model": {"maxSeqLen": 7}, "training": {"rolloutFragmentLength": 50}},
        "spec.model.maxSeqLen",
        MAX_SEQ_LEN_DIVIDES,
    ),
    Invalid("model-type", "schema", {"model": {"type": "transformer"}}, "spec.model.type"),
    Invalid(
        "model-import-path",
        "schema",
        {"model": {"type": "custom", "import": "not a path"}},
        "spec.model.import",
    ),
    Invalid(
        "replay-without-slots",
        "cel",
        {"training": {"replayBatchesPerFresh": 0.5}},
        "spec.training.replayBufferBatches",
    ),
    Invalid(
        "schedule-decreasing",
        "cel",
        {"training": {"lrSchedule": [[1000, 0.001], [0, 0.0001]]}},
        "spec.training.lrSchedule",
    ),
    Invalid(
        "schedule-repeated-step",
        "cel",
        {"training": {"entropyCoeffSchedule": [[0, 0.01], [0, 0.001]]}},
        "spec.training.entropyCoeffSchedule",
    ),
    Invalid(
        "schedule-negative-step",
        "cel",
        {"training": {"lrSchedule": [[-5, 0.001]]}},
        "spec.training.lrSchedule",
    ),
    Invalid(
        "schedule-fractional-step",
        "cel",
        {"training": {"lrSchedule": [[0.5, 0.001]]}},
        "spec.training.lrSchedule",
    ),
    Invalid(
        "schedule-empty",
        "cel",
        {"training": {"entropyCoeffSchedule": []}},
        "spec.training.entropyCoeffSchedule",
    ),
    Invalid("stop-empty", "cel", {"stop": Replace({})}, "spec.stop", NO_STOP_CRITERION),
    Invalid(
        "evaluation-stop-without-evaluation",
        "cel",
        {"stop": {"evaluationReturnMean": 400}},
        "spec.stop.evaluationReturnMean",
        EVALUATION_STOP_NEEDS_EVALUATION,
    ),
    Invalid(
        "separate-learner-async-gradients",
        "cel",
        {"learner": {"process": "separate"}, "training": {"mode": "async-gradients"}},
        "spec.learner.process",
        SEPARATE_LEARNER_NEEDS_VTRACE,
    ),
    Invalid(
        "learner-replicas-async-gradients",
        "cel",
        {"learner": {"replicas": 2}, "training": {"mode": "async-gradients"}},
        "spec.learner.replicas",
        REPLICAS_NEED_VTRACE,
    ),
    Invalid(
        "pettingzoo-and-id",
        "cel",
        {"env": {"id": "Pendulum-v1", "pettingzoo": "mpe2.simple_spread_v3"}},
        "spec.env.id",
        PETTINGZOO_OR_ID,
    ),
    Invalid(
        "pettingzoo-not-an-import-path",
        "schema",
        {"env": {"pettingzoo": "mpe2/simple spread"}},
        "spec.env.pettingzoo",
    ),
    Invalid(
        "multi-agent-without-pettingzoo",
        "cel",
        {"multiAgent": {"policies": {"default": {}}}},
        "spec.multiAgent",
        MULTI_AGENT_NEEDS_PETTINGZOO,
    ),
    Invalid(
        "mapping-to-an-unknown-policy",
        "cel",
        {
            "env": {"pettingzoo": "mpe2.simple_tag_v3"},
            "multiAgent": {
                "policies": {"predator": {}, "prey": {}},
                "policyMapping": [{"agents": "adversary_*", "policy": "hunter"}],
            },
        },
        "spec.multiAgent.policyMapping",
        UNKNOWN_MAPPED_POLICY,
    ),
    Invalid(
        "unknown-policy-to-train",
        "cel",
        {"env": {"pettingzoo": "mpe2.simple_spread_v3"}, "multiAgent": {"policiesToTrain": ["x"]}},
        "spec.multiAgent.policiesToTrain",
        UNKNOWN_POLICY_TO_TRAIN,
    ),
    Invalid(
        "several-policies-unmapped",
        "cel",
        {
            "env": {"pettingzoo": "mpe2.simple_tag_v3"},
            "multiAgent": {"policies": {"predator": {}, "prey": {}}},
        },
        "spec.multiAgent.policyMapping",
        MAPPING_NEEDED,
    ),
    Invalid(
        "mapping-two-ways",
        "cel",
        {
            "env": {"pettingzoo": "mpe2.simple_spread_v3"},
            "multiAgent": {
                "policyMapping": [{"agents": "*", "policy": "default"}],
                "policyMappingFn": "mygames.mapping:policy_of",
            },
        },
        "spec.multiAgent",
        MAPPING_ONE_WAY,
    ),
    Invalid(
        "policy-name-not-a-label",
        "cel",
        {"env": {"pettingzoo": "mpe2.simple_spread_v3"}, "multiAgent": {"policies": {"Big": {}}}},
        "spec.multiAgent.policies",
    ),
    Invalid(
        "policy-max-seq-len-not-dividing",
        "cel",
        {
            "env": {"pettingzoo": "mpe2.simple_spread_v3"},
            "training": {"rolloutFragmentLength": 50},
            "multiAgent": {
                "policies": {"default": {"model": {"useLstm": True, "maxSeqLen": 20}}}
            },
        },
        "spec.multiAgent.policies",
        POLICY_MAX_SEQ_LEN_DIVIDES,
    ),
    Invalid(
        "self-play-of-a-frozen-policy",
        "cel",
        {
            "env": {"pettingzoo": "pettingzoo.classic.tictactoe_v3"},
            "multiAgent": {
                "policies": {"main": {}, "fixed": {}},
                "policyMapping": [{"agents": "*", "policy": "main"}],
                "policiesToTrain": ["fixed"],
                "selfPlay": {"policy": "main"},
            },
        },
        "spec.multiAgent.selfPlay.policy",
        SELF_PLAY_POLICY,
    ),
    Invalid(
        "policy-popart-with-async-gradients",
        "cel",
        {
            "env": {"pettingzoo": "mpe2.simple_spread_v3"},
            "training": {"mode": "async-gradients"},
            "multiAgent": {"policies": {"default": {"model": {"popart": True}}}},
        },
        "spec.multiAgent.policies",
        POLICY_POPART_NEEDS_VTRACE,
    ),
    Invalid(
        "evaluation-opponent-without-pettingzoo",
        "cel",
        {"evaluation": {"opponent": "random"}},
        "spec.evaluation",
        EVALUATION_GAMES_NEED_PETTINGZOO,
    ),
    Invalid(
        "evaluation-opponent-unknown",
        "cel",
        {
            "env": {"pettingzoo": "pettingzoo.classic.tictactoe_v3"},
            "multiAgent": {"policies": {"main": {}}},
            "evaluation": {"opponent": "expert"},
        },
        "spec.evaluation.opponent",
        UNKNOWN_EVALUATION_OPPONENT,
    ),
    Invalid(
        "evaluation-opponent-unknown-default-policy",
        "cel",
        {
            "env": {"pettingzoo": "pettingzoo.classic.tictactoe_v3"},
            "evaluation": {"opponent": "main"},
        },
        "spec.evaluation.opponent",
        UNKNOWN_EVALUATION_OPPONENT,
    ),
    Invalid(
        "evaluation-policy-unknown",
        "cel",
        {
            "env": {"pettingzoo": "pettingzoo.classic.tictactoe_v3"},
            "multiAgent": {"policies": {"main": {}}},
            "evaluation": {"opponent": "random", "policy": "other"},
        },
        "spec.evaluation.policy",
        UNKNOWN_EVALUATION_POLICY,
    ),
    Invalid(
        "stop-policy-without-a-return-target",
        "cel",
        {
            "env": {"pettingzoo": "pettingzoo.classic.tictactoe_v3"},
            "stop": {"timesteps": 1000, "policy": "default"},
        },
        "spec.stop.policy",
        STOP_POLICY_NEEDS_RETURN,
    ),
    Invalid(
        "stop-policy-unknown",
        "cel",
        {
            "env": {"pettingzoo": "pettingzoo.classic.tictactoe_v3"},
            "stop": {"episodeReturnMean": 0.5, "policy": "main"},
        },
        "spec.stop.policy",
        UNKNOWN_STOP_POLICY,
    ),
    Invalid(
        "stop-policy-without-pettingzoo",
        "cel",
        {"stop": {"episodeReturnMean": 0.5, "policy": "default"}},
        "spec.stop.policy",
        UNKNOWN_STOP_POLICY,
    ),
    Invalid(
        "learner-service-account-not-a-name",
        "schema",
        {"learner": {"pod": {"serviceAccountName": "UPPER"}}},
        "spec.learner.pod.serviceAccountName",
    ),
    Invalid(
        "rollouts-priority-class-not-a-name",
        "schema",
        {"rollouts": {"pod": {"priorityClassName": "high priority"}}},
        "spec.rollouts.pod.priorityClassName",
    ),
    Invalid(
        "learner-replicas-zero", "schema", {"learner": {"replicas": 0}}, "spec.learner.replicas"
    ),
    Invalid(
        "learner-process", "schema", {"learner": {"process": "thread"}}, "spec.learner.process"
    ),
    Invalid(
        "evaluation-duration-unit",
        "schema",
        {"evaluation": {"durationUnit": "minutes"}},
        "spec.evaluation.durationUnit",
    ),
    # --- pod overrides: nothing that leaves the restricted Pod Security Standard or collides
    # with what the operator sets
    Invalid(
        "pod-hostpath-volume",
        "unknown",
        {"learner": {"pod": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}},
        "spec.learner.pod.volumes[0]",
    ),
    Invalid(
        "pod-privileged",
        "unknown",
        {"rollouts": {"pod": {"securityContext": {"privileged": True}}}},
        "spec.rollouts.pod.securityContext",
    ),
    Invalid(
        "pod-reserved-env",
        "cel",
        {"learner": {"pod": {"env": [{"name": "RAY_ADDRESS", "value": "elsewhere"}]}}},
        "spec.learner.pod.env[0].name",
    ),
    Invalid(
        "pod-reserved-volume",
        "cel",
        {"aggregators": {"pod": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}},
        "spec.aggregators.pod.volumes[0].name",
    ),
    Invalid(
        "pod-two-volume-sources",
        "cel",
        {"learner": {"pod": {"volumes": [{"name": "v", "emptyDir": {}, "secret": {}}]}}},
        "spec.learner.pod.volumes[0]",
    ),
    Invalid(
        "pod-reserved-mount",
        "cel",
        {
            "learner": {
                "pod": {
                    "volumes": [{"name": "v", "emptyDir": {}}],
                    "volumeMounts": [{"name": "v", "mountPath": "/var/lib/impalajob/run/x"}],
                }
            }
        },
        "spec.learner.pod.volumeMounts[0].mountPath",
    ),
    Invalid(
        "pod-mount-without-volume",
        "cel",
        {"rollouts": {"pod": {"volumeMounts": [{"name": "nope", "mountPath": "/data"}]}}},
        "spec.rollouts.pod.volumeMounts",
    ),
    # --- immutable fields (CEL transition rules, checked on update)
    Invalid("env-changed", "immutable", {"env": {"id": "Acrobot-v1"}}, "spec.env"),
    Invalid("model-changed", "immutable", {"model": {"hidden": [64]}}, "spec.model"),
    # --- metadata.name: children append up to 11 characters and must fit in 63
    Invalid("name-too-long", "name", {}, "metadata.name"),
]

LONG_NAME = "j" + "x" * 40
"""41 characters: one over the limit (used by the `name` case)."""

VALID: dict[str, dict[str, Any]] = {
    "minimal": {
        "apiVersion": "impala.dev/v1alpha1",
        "kind": "ImpalaJob",
        "metadata": {"name": "minimal"},
        "spec": {"stop": {"timesteps": 1000}},
    },
    "base": base_job("base"),
    "multi-agent-evaluation-video": merge(
        base_job("multi-agent-evaluation-video"),
        {
            "spec": {
                "env": {"pettingzoo": "pettingzoo.classic.tictactoe_v3"},
                "evaluation": {"video": True, "opponent": "random"},
            }
        },
    ),
    "multi-agent-prev-action-reward": merge(
        base_job("multi-agent-prev-action-reward"),
        {
            "spec": {
                "env": {"pettingzoo": "mpe2.simple_spread_v3"},
                "multiAgent": {
                    "policies": {
                        "default": {"model": {"useLstm": True, "lstmUsePrevActionReward": True}}
                    }
                },
            }
        },
    ),
    "multi-agent": merge(
        base_job("multi-agent"),
        {
            "spec": {
                "env": {"pettingzoo": "mpe2.simple_tag_v3", "kwargs": {"num_good": 1}},
                "multiAgent": {
                    "policies": {
                        "predator": {"model": {"hidden": [64, 64]}},
                        "prey": {"model": {"useLstm": True, "maxSeqLen": 10}},
                    },
                    "policyMapping": [
                        {"agents": "adversary_*", "policy": "predator"},
                        {"agents": "*", "policy": "prey"},
                    ],
                    "policiesToTrain": ["predator", "prey"],
                },
                "evaluation": {"opponent": "random", "policy": "predator"},
                "learner": {"process": "separate"},
            }
        },
    ),
    "everything": merge(
        base_job("everything"),
        {
            "spec": {
                "image": "registry.example/impalajob:1.2.3",
                "env": {
                    "id": "mygrid:Corridor-v0",
                    "kwargs": {"max_episode_steps": 200, "render_mode": None},
                    "wrappers": [
                        {"import": "mygrid.wrappers:TimePenalty", "kwargs": {"cost": 0.01}},
                        {"import": "mygrid.wrappers.Flatten"},
                    ],
                },
                "model": {
                    "type": "custom",
                    "import": "mygrid.models:Net",
                    "config": {"width": 128, "layers": [64, 64]},
                    "maxSeqLen": 10,
                    "freeLogStd": True,
                },
                "evaluation": {
                    "intervalTimesteps": 20000,
                    "duration": 2000,
                    "durationUnit": "timesteps",
                    "numEnvRunners": 2,
                    "numEnvsPerRunner": 8,
                    "explore": True,
                    "video": True,
                },
                "training": {
                    "lrSchedule": [[0, 0.001], [100000, 0.0001]],
                    "entropyCoeffSchedule": [[0, 0.01], [50000, 0.001]],
                    "replayBatchesPerFresh": 1.0,
                    "replayBufferBatches": 8,
                    "gradClip": None,
                    "optimizer": {"type": "rmsprop", "epsilon": 0.1},
                },
                "learner": {
                    "gpus": 1,
                    "process": "separate",
                    "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
                    "nodeSelector": {"pool": "gpu"},
                    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "pod": {
                        "labels": {"team": "rl"},
                        "annotations": {"example.com/owner": "rl-team"},
                        "env": [
                            {"name": "WANDB_MODE", "value": "offline"},
                            {
                                "name": "WANDB_API_KEY",
                                "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}},
                            },
                        ],
                        "envFrom": [{"secretRef": {"name": "s3-credentials"}}],
                        "imagePullSecrets": [{"name": "regcred"}],
                        "volumes": [
                            {"name": "datasets", "persistentVolumeClaim": {"claimName": "data"}},
                            {"name": "extra", "configMap": {"name": "extra-config"}},
                        ],
                        "volumeMounts": [
                            {"name": "datasets", "mountPath": "/data", "readOnly": True},
                            {"name": "extra", "mountPath": "/etc/extra"},
                        ],
                        "affinity": {
                            "nodeAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": {
                                    "nodeSelectorTerms": [
                                        {
                                            "matchExpressions": [
                                                {"key": "pool", "operator": "In", "values": ["gpu"]}
                                            ]
                                        }
                                    ]
                                }
                            }
                        },
                    },
                },
                "rollouts": {
                    "replicas": 2,
                    "workersPerPod": 2,
                    "pod": {"env": [{"name": "OMP_NUM_THREADS", "value": "1"}]},
                },
                "aggregators": {"minReplicas": 0, "maxReplicas": 2},
                "stop": {
                    "timesteps": 1000000,
                    "episodeReturnMean": 450,
                    "evaluationReturnMean": 490,
                },
                "checkpoint": {"volumeClaim": "ckpt-store", "keep": 5},
                "runPolicy": {
                    "backoffLimit": 1,
                    "activeDeadlineSeconds": 3600,
                    "ttlSecondsAfterFinished": 60,
                    "cleanPodPolicy": "Running",
                },
            }
        },
    ),
}
