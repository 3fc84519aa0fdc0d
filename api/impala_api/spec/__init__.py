"""The ImpalaJob manifest as pydantic models: the single source of truth.

The same models validate a manifest for `impalajob train -f`, are used by the operator, and
generate the CRD's openAPIV3Schema (`impala_api.crd`). Free of torch/Ray imports: the operator
image path and the CRD generator import it. One module per concern:

- `base`: SpecModel (camelCase, unknown fields refused) and the schedule type;
- `training`: env, model, hyperparameters (RLlib's IMPALAConfig names in camelCase with RLlib's
  defaults except DEFAULTS_APART_FROM_RLLIB; RLlib names whose meaning differs are refused,
  RENAMED_RLLIB) and stop criteria;
- `agents`: a PettingZoo env's policies, which agent acts by which, which learn;
- `pods`: resources, tolerations, pod overrides and their security rules;
- `replicas`: the learner, rollout and aggregator pods, autoscaling;
- `lifecycle`: checkpointing and the run policy;
- `job`: the resource's identity, metadata and the spec that gathers the sections.

Import from here (`from impala_api.spec import ImpalaJob`); the modules are the layout.
"""

from __future__ import annotations

from impala_api.spec.agents import (
    DEFAULT_POLICY,
    EVALUATION_GAMES_NEED_PETTINGZOO,
    MAPPING_NEEDED,
    MAPPING_ONE_WAY,
    MULTI_AGENT_NEEDS_PETTINGZOO,
    MULTI_AGENT_NOT_YET,
    POLICY_MAX_SEQ_LEN_DIVIDES,
    POLICY_NAME_PATTERN,
    SELF_PLAY_POLICY,
    UNKNOWN_EVALUATION_OPPONENT,
    UNKNOWN_EVALUATION_POLICY,
    UNKNOWN_MAPPED_POLICY,
    UNKNOWN_POLICY_TO_TRAIN,
    MultiAgentSpec,
    PolicyMappingRule,
    PolicySpec,
    SelfPlaySpec,
)
from impala_api.spec.base import (
    MAX_SCHEDULE_POINTS,
    Schedule,
    SpecModel,
    check_schedule,
)
from impala_api.spec.evaluation import (
    EVALUATION_STOP_NEEDS_EVALUATION,
    RANDOM_OPPONENT,
    EvaluationSpec,
)
from impala_api.spec.job import (
    API_GROUP,
    API_VERSION,
    KIND,
    MAX_NAME_LENGTH,
    PLURAL,
    ImpalaJob,
    ImpalaJobSpec,
    ObjectMeta,
)
from impala_api.spec.lifecycle import (
    SECRET_REF_NEEDS_URI,
    STORAGE_URI_PATTERN,
    CheckpointSpec,
    RunPolicy,
    SecretReference,
)
from impala_api.spec.pods import (
    MOUNT_NAMES_VOLUME_MESSAGE,
    ONE_VOLUME_SOURCE_MESSAGE,
    RESERVED_ENV,
    RESERVED_ENV_MESSAGE,
    RESERVED_ENV_PREFIXES,
    RESERVED_PATH_MESSAGE,
    RESERVED_PATHS,
    RESERVED_VOLUME_MESSAGE,
    RESERVED_VOLUMES,
    VOLUME_SOURCES,
    EnvFromSource,
    EnvVar,
    PodOverrides,
    Quantity,
    Resources,
    Toleration,
    Volume,
    VolumeMount,
)
from impala_api.spec.replicas import (
    REPLICAS_NEED_VTRACE,
    SEPARATE_LEARNER_NEEDS_VTRACE,
    AggregatorsSpec,
    AutoscalingSpec,
    LearnerSpec,
    ReplicaGroupSpec,
    RolloutsSpec,
)
from impala_api.spec.training import (
    CUSTOM_MODEL_IMPORT,
    CUSTOM_MODEL_LSTM,
    DEFAULTS_APART_FROM_RLLIB,
    IMPORT_PATH_PATTERN,
    MAX_SEQ_LEN_DIVIDES,
    NO_STOP_CRITERION,
    PETTINGZOO_OR_ID,
    POPART_NEEDS_VTRACE,
    PREV_ACTION_REWARD_LSTM,
    RENAMED_RLLIB,
    EnvSpec,
    ModelSpec,
    OptimizerSpec,
    StopSpec,
    TrainingSpec,
    WrapperSpec,
)

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "CUSTOM_MODEL_IMPORT",
    "CUSTOM_MODEL_LSTM",
    "DEFAULTS_APART_FROM_RLLIB",
    "DEFAULT_POLICY",
    "EVALUATION_GAMES_NEED_PETTINGZOO",
    "EVALUATION_STOP_NEEDS_EVALUATION",
    "IMPORT_PATH_PATTERN",
    "KIND",
    "MAPPING_NEEDED",
    "MAPPING_ONE_WAY",
    "MAX_NAME_LENGTH",
    "MAX_SCHEDULE_POINTS",
    "MAX_SEQ_LEN_DIVIDES",
    "MOUNT_NAMES_VOLUME_MESSAGE",
    "MULTI_AGENT_NEEDS_PETTINGZOO",
    "MULTI_AGENT_NOT_YET",
    "NO_STOP_CRITERION",
    "ONE_VOLUME_SOURCE_MESSAGE",
    "PETTINGZOO_OR_ID",
    "PLURAL",
    "POLICY_MAX_SEQ_LEN_DIVIDES",
    "POLICY_NAME_PATTERN",
    "POPART_NEEDS_VTRACE",
    "PREV_ACTION_REWARD_LSTM",
    "RANDOM_OPPONENT",
    "RENAMED_RLLIB",
    "REPLICAS_NEED_VTRACE",
    "RESERVED_ENV",
    "RESERVED_ENV_MESSAGE",
    "RESERVED_ENV_PREFIXES",
    "RESERVED_PATHS",
    "RESERVED_PATH_MESSAGE",
    "RESERVED_VOLUMES",
    "RESERVED_VOLUME_MESSAGE",
    "SECRET_REF_NEEDS_URI",
    "SELF_PLAY_POLICY",
    "SEPARATE_LEARNER_NEEDS_VTRACE",
    "STORAGE_URI_PATTERN",
    "UNKNOWN_EVALUATION_OPPONENT",
    "UNKNOWN_EVALUATION_POLICY",
    "UNKNOWN_MAPPED_POLICY",
    "UNKNOWN_POLICY_TO_TRAIN",
    "VOLUME_SOURCES",
    "AggregatorsSpec",
    "AutoscalingSpec",
    "CheckpointSpec",
    "EnvFromSource",
    "EnvSpec",
    "EnvVar",
    "EvaluationSpec",
    "ImpalaJob",
    "ImpalaJobSpec",
    "LearnerSpec",
    "ModelSpec",
    "MultiAgentSpec",
    "ObjectMeta",
    "OptimizerSpec",
    "PodOverrides",
    "PolicyMappingRule",
    "PolicySpec",
    "Quantity",
    "ReplicaGroupSpec",
    "Resources",
    "RolloutsSpec",
    "RunPolicy",
    "Schedule",
    "SecretReference",
    "SelfPlaySpec",
    "SpecModel",
    "StopSpec",
    "Toleration",
    "TrainingSpec",
    "Volume",
    "VolumeMount",
    "WrapperSpec",
    "check_schedule",
]
