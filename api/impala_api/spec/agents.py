"""Many agents: the policies a PettingZoo env's agents act by, which agent acts by which, and
which of them learn (RLlib's `config.multi_agent(policies, policy_mapping_fn,
policies_to_train)`, camel-cased)."""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from impala_api.spec.base import POLICY_NAME_PATTERN, SpecModel
from impala_api.spec.training import IMPORT_PATH_PATTERN, ModelSpec

DEFAULT_POLICY = "default"
"""The policy every agent acts by when `spec.multiAgent` is omitted (RLlib's
`default_policy`): one network shared by all agents, trained on all their steps."""

MAX_POLICIES = 16

UNKNOWN_MAPPED_POLICY = (
    "spec.multiAgent.policyMapping names a policy that spec.multiAgent.policies does not define: "
    "add it to policies, or map those agents to one of them"
)
UNKNOWN_POLICY_TO_TRAIN = (
    "spec.multiAgent.policiesToTrain names a policy that spec.multiAgent.policies does not "
    "define: list only the policies' names"
)
MAPPING_NEEDED = (
    "spec.multiAgent.policyMapping: with several policies, say which agents act by which "
    "(rules of agent-id patterns, or policyMappingFn)"
)
MAPPING_ONE_WAY = (
    "spec.multiAgent.policyMapping and spec.multiAgent.policyMappingFn are two ways to map "
    "agents to policies: set one of them"
)
MULTI_AGENT_NEEDS_PETTINGZOO = (
    "spec.multiAgent maps the agents of a PettingZoo env: it needs spec.env.pettingzoo"
)
POLICY_POPART_NEEDS_VTRACE = (
    "spec.multiAgent.policies: a policy's model.popart rewrites its value head as its learner's "
    "statistics of the V-trace targets move, and spec.training.mode async-gradients has no such "
    "learner (the driver applies each worker's gradients): use popart false, or mode vtrace"
)
POLICY_MAX_SEQ_LEN_DIVIDES = (
    "spec.multiAgent.policies: a policy's model.maxSeqLen must divide "
    "spec.training.rolloutFragmentLength (each fragment is cut into whole sequences)"
)
EVALUATION_GAMES_NEED_PETTINGZOO = (
    "spec.evaluation.opponent and spec.evaluation.policy score the games of a PettingZoo env: "
    "they need spec.env.pettingzoo"
)
UNKNOWN_EVALUATION_OPPONENT = (
    "spec.evaluation.opponent must be 'random' or a policy of spec.multiAgent.policies"
)
UNKNOWN_EVALUATION_POLICY = "spec.evaluation.policy must be a policy of spec.multiAgent.policies"
UNKNOWN_STOP_POLICY = (
    "spec.stop.policy must be a policy of a PettingZoo env's spec.multiAgent.policies"
)


class PolicySpec(SpecModel):
    """One policy: a network of its own, acting for the agents mapped to it."""

    model: ModelSpec | None = None
    """Its network; spec.model when omitted. Agents mapped to one policy share its weights and
    train it together, so they must have the same observation and action spaces."""


class PolicyMappingRule(SpecModel):
    """Agents whose id matches `agents` act by `policy`."""

    agents: str = Field(min_length=1, max_length=128)
    """A shell-style pattern of agent ids (`fnmatch`: `*`, `?`, `[...]`), e.g. `adversary_*`."""

    policy: str = Field(pattern=POLICY_NAME_PATTERN, max_length=32)
    """The policy they act by: a key of spec.multiAgent.policies."""


SELF_PLAY_POLICY = (
    "spec.multiAgent.selfPlay.policy must be a policy that learns: one of "
    "spec.multiAgent.policies that policiesToTrain includes"
)


class SelfPlaySpec(SpecModel):
    """A policy that plays against its own past versions (a pool of frozen snapshots)."""

    policy: str = Field(pattern=POLICY_NAME_PATTERN, max_length=32)
    """The trained policy that plays itself. In each episode one of the agents mapped to it
    (chosen at random) learns by it, and each other agent mapped to it is the opponent: a
    random player with probability randomProbability, else the current policy (its steps train
    too) with probability latestProbability, else a snapshot drawn from the pool (the random
    player's and a snapshot's steps are not trained on)."""

    snapshot_interval_timesteps: int = Field(default=20_000, ge=1)
    """Env steps trained between two snapshots of the policy's weights added to the pool."""

    pool_size: int = Field(default=5, ge=1, le=16)
    """Snapshots kept; the oldest is replaced once the pool is full."""

    latest_probability: float = Field(default=0.5, ge=0.0, le=1.0)
    """Probability that an episode's opponent is the current policy rather than a snapshot
    (1: pure self-play; until the first snapshot, always the current policy)."""

    random_probability: float = Field(default=0.0, ge=0.0, le=1.0)
    """Probability that an episode's opponent is a uniformly random player (among the actions
    its observation allows), drawn before latestProbability. A policy that only ever meets
    itself never sees the positions a weak player leads to, and can lose them: a share of
    random games keeps them in its data (RLlib's self-play example starts its league from a
    random policy for the same reason). Not counted in the pool's score."""


class MultiAgentSpec(SpecModel):
    """Which policies there are, which agent acts by which, and which learn."""

    policies: dict[str, PolicySpec] = Field(
        default_factory=lambda: {DEFAULT_POLICY: PolicySpec()},
        min_length=1,
        max_length=MAX_POLICIES,
    )
    """The policies by name (lowercase letters, digits, `-` and `_`), each with its network.
    Each trained policy has its own learner (V-trace loss, optimiser, learner stats,
    checkpointed state) and trains on the steps of the agents mapped to it."""

    policy_mapping: list[PolicyMappingRule] | None = Field(
        default=None, min_length=1, max_length=64
    )
    """Rules from agent ids to policies, the first match wins, e.g. `[{agents: "adversary_*",
    policy: predator}, {agents: "*", policy: prey}]`. Omitted with one policy: every agent acts
    by it. An agent no rule matches is refused before anything starts."""

    policy_mapping_fn: str | None = Field(default=None, pattern=IMPORT_PATH_PATTERN)
    """Instead of policyMapping: your function `package.module:function`, called with an agent
    id, returning its policy's name (RLlib's policy_mapping_fn; its module must be importable
    wherever the env is made)."""

    policies_to_train: list[str] | None = Field(default=None, min_length=1, max_length=16)
    """The policies that learn (default: all); the others act with the weights they were made
    with, and their agents' steps are not shipped to a learner."""

    self_play: SelfPlaySpec | None = None
    """Self-play for one policy (none when omitted)."""

    @property
    def rules(self) -> list[PolicyMappingRule]:
        """policyMapping, or every agent to the one policy when it is omitted."""
        if self.policy_mapping is not None:
            return self.policy_mapping
        return [PolicyMappingRule(agents="*", policy=next(iter(self.policies)))]

    @property
    def trained(self) -> list[str]:
        """The names of the policies that learn, in policies' order."""
        chosen = set(self.policies_to_train or self.policies)
        return [name for name in self.policies if name in chosen]

    @property
    def main_policy(self) -> str:
        """The policy a run's commands and evaluation take unless told: the self-play one, else
        the first that learns."""
        return self.self_play.policy if self.self_play is not None else self.trained[0]

    @model_validator(mode="after")
    def _names(self) -> MultiAgentSpec:
        for name in self.policies:
            if not re.match(POLICY_NAME_PATTERN, name) or len(name) > 32:
                raise ValueError(
                    f"spec.multiAgent.policies: {name!r} is not a policy name (lowercase "
                    "letters, digits, '-' and '_', at most 32, starting and ending with a "
                    "letter or digit)"
                )
        if self.policy_mapping_fn is not None and self.policy_mapping is not None:
            raise ValueError(MAPPING_ONE_WAY)
        mapped = self.policy_mapping_fn is not None or self.policy_mapping is not None
        if not mapped and len(self.policies) > 1:
            raise ValueError(MAPPING_NEEDED)
        if any(rule.policy not in self.policies for rule in self.policy_mapping or []):
            raise ValueError(UNKNOWN_MAPPED_POLICY)
        if self.policies_to_train is not None and any(
            name not in self.policies for name in self.policies_to_train
        ):
            raise ValueError(UNKNOWN_POLICY_TO_TRAIN)
        if self.self_play is not None and self.self_play.policy not in self.trained:
            raise ValueError(SELF_PLAY_POLICY)
        return self
