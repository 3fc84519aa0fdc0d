"""The policies a rollout worker acts by, and the broadcast that loads them.

Every policy an agent of the env maps to has an acting copy here (a gymnasium env's one
policy, `default`), and selfPlay's pool of snapshots (`<policy>@<slot>`) is added as the
broadcasts bring them. Inference is numpy for MLPs (`learning.inference`); a recurrent policy's
forward takes and returns its state. In async-gradients mode (A3C) each trained policy's copy is
a `Learner`'s model, so the gradients are of the policy that acted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from impala_api.spec import ImpalaJobSpec
from impala_trainer.batches import policy_layout, policy_weights
from impala_trainer.learning.distributions import ActionDistribution
from impala_trainer.learning.inference import (
    WeightLoader,
    acting_policy,
    carried_state,
    recurrent_policy,
)
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.learning.model_factory import build_model
from impala_trainer.learning.models import ActorCritic
from impala_trainer.learning.precision import acting_dtype
from impala_trainer.rollouts.agent_envs import PolicyModel


@dataclass
class ActingPolicy:
    """One policy, or one snapshot of it, as a worker acts by it."""

    name: str
    """The policy, or a snapshot's `<policy>@<slot>`."""
    policy: str
    """The policy it is a copy of (its own name for the policy itself)."""
    model: ActorCritic
    actions: ActionDistribution
    logits: Any
    """obs -> distribution inputs (a feed-forward model), or (obs, state) -> (distribution
    inputs, next state) (a recurrent one: `recurrent`)."""
    load: WeightLoader
    trained: bool
    version: int = 0
    carry: Any = None
    """(state, action, reward) -> state, numpy, for a model that takes its previous action and
    reward (lstmUsePrevActionReward); None for any other."""

    @property
    def recurrent(self) -> bool:
        return self.model.state_size > 0


class ActingPolicies:
    """A worker's acting copies: `policies` by name, `snapshots` as broadcast, and in A3C mode
    a `Learner` per trained policy (`learners`)."""

    def __init__(self, spec: ImpalaJobSpec, models: Mapping[str, PolicyModel]) -> None:
        self.spec = spec
        self.models = dict(models)
        trained = set(spec.agents.trained)
        self.learners: dict[str, Learner] = {}
        self.policies = {name: self._acting(name, name, name in trained) for name in models}
        self.snapshots: dict[str, ActingPolicy] = {}
        """selfPlay's pool as it was broadcast: `<policy>@<slot>` -> its frozen copy."""
        self.version = 0
        """The driver's count of broadcasts at the last one loaded (each policy has its own
        version besides: `ActingPolicy.version`)."""

    def _acting(self, name: str, policy: str, trained: bool) -> ActingPolicy:
        spec, built = self.spec.policy_spec(policy), self.models[policy]
        if trained and spec.training.mode == "async-gradients":
            config = LearnerConfig.of(self.spec, policy)
            learner = self.learners[name] = Learner(config, built.obs_shape, built.actions)
            model = learner.model
        else:
            model = build_model(spec.model, built.obs_shape, built.actions)
        model.eval()
        if model.state_size:
            logits: Any = recurrent_policy(model)
        else:
            logits = acting_policy(model, acting_dtype(spec.learner.precision))
        return ActingPolicy(name, policy, model, built.actions, logits, WeightLoader(model),
                            trained, carry=carried_state(model))  # fmt: skip

    def load(self, layout: Mapping[str, Any], version: int) -> None:
        """Every policy's weights out of a broadcast (`batches.policy_weights`), the driver's
        `version` of it; a snapshot seen for the first time gets a copy of its policy's
        model."""
        self.version = int(version)
        for name, (arrays, version) in policy_weights(layout).items():
            acting = self.policies.get(name) or self.snapshots.get(name)
            base = name.partition("@")[0]
            if acting is None and name != base and base in self.policies:  # a new snapshot
                acting = self.snapshots[name] = self._acting(name, base, trained=False)
            if acting is not None:  # a policy no agent of this env maps to has no model here
                acting.load(arrays)
                acting.version = version

    def layout(self) -> dict[str, Any]:
        """The policies' current weights in the broadcast layout."""
        out: dict[str, Any] = {}
        for name, acting in self.policies.items():
            arrays = {k: v.detach().numpy().copy() for k, v in acting.model.state_dict().items()}
            out.update(policy_layout(name, arrays, acting.version))
        return out

    def pool(self) -> list[str]:
        """The snapshots' names, sorted (selfPlay draws from them)."""
        return sorted(self.snapshots)

