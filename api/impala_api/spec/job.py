"""The ImpalaJob resource: its identity (group, version, kind), metadata and the spec that gathers
every section."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from impala_api.spec.agents import (
    EVALUATION_GAMES_NEED_PETTINGZOO,
    MULTI_AGENT_NEEDS_PETTINGZOO,
    POLICY_MAX_SEQ_LEN_DIVIDES,
    POLICY_POPART_NEEDS_VTRACE,
    UNKNOWN_EVALUATION_OPPONENT,
    UNKNOWN_EVALUATION_POLICY,
    UNKNOWN_STOP_POLICY,
    MultiAgentSpec,
)
from impala_api.spec.base import SpecModel
from impala_api.spec.evaluation import (
    EVALUATION_STOP_NEEDS_EVALUATION,
    RANDOM_OPPONENT,
    EvaluationSpec,
)
from impala_api.spec.lifecycle import CheckpointSpec, RunPolicy
from impala_api.spec.replicas import (
    REPLICAS_NEED_VTRACE,
    SEPARATE_LEARNER_NEEDS_VTRACE,
    AggregatorsSpec,
    LearnerSpec,
    RolloutsSpec,
)
from impala_api.spec.training import (
    MAX_SEQ_LEN_DIVIDES,
    POPART_NEEDS_VTRACE,
    EnvSpec,
    ModelSpec,
    StopSpec,
    TrainingSpec,
)

API_GROUP = "impala.dev"
API_VERSION = "v1alpha1"
KIND = "ImpalaJob"
PLURAL = "impalajobs"

# Children are named "<job>-learner", "<job>-rollout", "<job>-aggregator", "<job>-status": keeping
# the job name at most 40 characters leaves room under the 63-character label/DNS limit.
MAX_NAME_LENGTH = 40
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class ImpalaJobSpec(SpecModel):
    """What to train and how to run it."""

    image: str = Field(default="impalajob:0.1.0", min_length=1)
    """Container image every role runs (cluster only)."""

    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Image pull policy (cluster only)."""

    env: EnvSpec = Field(default_factory=EnvSpec)
    """Environment (immutable after creation)."""

    model: ModelSpec = Field(default_factory=ModelSpec)
    """Network (immutable after creation)."""

    multi_agent: MultiAgentSpec | None = None
    """The policies of a PettingZoo env's agents (spec.env.pettingzoo; when omitted, every
    agent acts by one shared policy of spec.model)."""

    training: TrainingSpec = Field(default_factory=TrainingSpec)
    """Algorithm hyperparameters."""

    learner: LearnerSpec = Field(default_factory=LearnerSpec)
    """Learner pod."""

    rollouts: RolloutsSpec = Field(default_factory=RolloutsSpec)
    """Rollout pods."""

    aggregators: AggregatorsSpec = Field(default_factory=AggregatorsSpec)
    """Aggregator pods."""

    stop: StopSpec
    """Stop criteria (required: a job ends when one is met)."""

    evaluation: EvaluationSpec | None = None
    """Evaluation during training (none when omitted)."""

    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """Checkpointing."""

    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    """Lifecycle policy (cluster only)."""

    @model_validator(mode="after")
    def _sequences(self) -> ImpalaJobSpec:
        seq = self.model.max_seq_len
        if seq is not None and self.training.rollout_fragment_length % seq:
            raise ValueError(MAX_SEQ_LEN_DIVIDES)
        for policy in (self.multi_agent.policies if self.multi_agent else {}).values():
            seq = policy.model.max_seq_len if policy.model else None
            if seq is not None and self.training.rollout_fragment_length % seq:
                raise ValueError(POLICY_MAX_SEQ_LEN_DIVIDES)
        if self.stop.evaluation_return_mean is not None and self.evaluation is None:
            raise ValueError(EVALUATION_STOP_NEEDS_EVALUATION)
        if self.learner.process == "separate" and self.training.mode != "vtrace":
            raise ValueError(SEPARATE_LEARNER_NEEDS_VTRACE)
        if self.learner.replicas > 1 and self.training.mode != "vtrace":
            raise ValueError(REPLICAS_NEED_VTRACE)
        if self.model.popart and self.training.mode != "vtrace":
            raise ValueError(POPART_NEEDS_VTRACE)
        return self

    @model_validator(mode="after")
    def _agents(self) -> ImpalaJobSpec:
        if self.multi_agent is not None and not self.env.is_pettingzoo:
            raise ValueError(MULTI_AGENT_NEEDS_PETTINGZOO)
        own_popart = any(p.model and p.model.popart for p in self.agents.policies.values())
        if own_popart and self.training.mode != "vtrace":
            raise ValueError(POLICY_POPART_NEEDS_VTRACE)
        games = self.evaluation
        if games is not None and (games.opponent or games.policy):
            if not self.env.is_pettingzoo:
                raise ValueError(EVALUATION_GAMES_NEED_PETTINGZOO)
            policies = self.agents.policies
            if games.opponent not in (None, RANDOM_OPPONENT, *policies):
                raise ValueError(UNKNOWN_EVALUATION_OPPONENT)
            if games.policy is not None and games.policy not in policies:
                raise ValueError(UNKNOWN_EVALUATION_POLICY)
        if self.stop.policy is not None and (
            not self.env.is_pettingzoo or self.stop.policy not in self.agents.policies
        ):
            raise ValueError(UNKNOWN_STOP_POLICY)
        return self

    @property
    def agents(self) -> MultiAgentSpec:
        """spec.multiAgent, or the one shared policy a PettingZoo env's agents get without it."""
        return self.multi_agent or MultiAgentSpec()

    @property
    def evaluated_policy(self) -> str:
        """The policy whose games spec.evaluation.opponent scores (spec.evaluation.policy, else
        the self-play policy, else the first policy that learns)."""
        chosen = self.evaluation.policy if self.evaluation is not None else None
        return chosen or self.agents.main_policy

    def policy_spec(self, policy: str) -> ImpalaJobSpec:
        """This spec as one policy's learner and acting model see it: the policy's model in
        place of spec.model, nothing else changed."""
        model = self.agents.policies[policy].model
        return self if model is None else self.model_copy(update={"model": model})


class ObjectMeta(BaseModel):
    """The subset of metadata the job uses; other keys (uid, resourceVersion...) pass through."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH)
    """Job name: a DNS-1035 label of at most 40 characters."""

    namespace: str | None = None
    """Namespace (cluster only)."""

    labels: dict[str, str] = Field(default_factory=dict)
    """Labels, copied onto every child."""

    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations."""

    @field_validator("name")
    @classmethod
    def _dns(cls, v: str) -> str:
        if not _DNS1035.match(v):
            raise ValueError(
                "must be lowercase letters, digits and '-', start with a letter and end with a "
                "letter or digit (DNS-1035 label)"
            )
        return v


class ImpalaJob(BaseModel):
    """An ImpalaJob manifest (impala.dev/v1alpha1)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["impala.dev/v1alpha1"] = Field(
        default="impala.dev/v1alpha1", alias="apiVersion"
    )
    kind: Literal["ImpalaJob"] = "ImpalaJob"
    metadata: ObjectMeta
    spec: ImpalaJobSpec
    # Status is written by the operator; a manifest read back from the cluster may carry it.
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    def to_manifest(self) -> dict[str, Any]:
        """The manifest as camelCase JSON-ready data, with defaults filled in."""
        return self.model_dump(mode="json", by_alias=True, exclude={"status"})
