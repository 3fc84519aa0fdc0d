"""A model of one's own (`model.type: custom`): a subclass of ActorCritic, called as
Class(obs_shape, num_outputs, **model.config), returning (outputs [N, num_outputs], values [N]).
docs/models.md has the whole contract, the recurrent part included."""

from __future__ import annotations

import math

import torch
from torch import nn

from impala_trainer.learning.models import ActorCritic


class LayerNormMLP(ActorCritic):
    """A shared trunk with LayerNorm, then a policy and a value head."""

    def __init__(self, obs_shape: tuple[int, ...], num_outputs: int, width: int = 64) -> None:
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Linear(math.prod(obs_shape), width), nn.LayerNorm(width), nn.ReLU()
        )
        self.policy_head = nn.Linear(width, num_outputs)
        self.value_head = nn.Linear(width, 1)
        nn.init.zeros_(self.policy_head.weight)  # start from the uniform policy

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.trunk(obs.float().flatten(1))
        return self.policy_head(x), self.value_head(x).squeeze(-1)
