"""Models of a user's own (`model.type: custom`, `model.import: tests.support.custom_models:X`):
two that keep the ActorCritic contract (docs/models.md), a feed-forward and a recurrent one, and
three that break it in the ways a user's first try does."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from impala_trainer.learning.models import ActorCritic


class TinyActorCritic(ActorCritic):
    """One shared trunk, two heads: the smallest model of the feed-forward contract."""

    def __init__(self, obs_shape: tuple[int, ...], num_outputs: int, width: int = 32) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(math.prod(obs_shape), width), nn.Tanh())
        self.policy_head = nn.Linear(width, num_outputs)
        self.value_head = nn.Linear(width, 1)
        nn.init.zeros_(self.policy_head.weight)  # a uniform policy to start from

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.trunk(obs.float().flatten(1))
        return self.policy_head(x), self.value_head(x).squeeze(-1)


class GRUActorCritic(ActorCritic):
    """The recurrent contract: a GRU whose hidden state is the whole state (state_size)."""

    def __init__(self, obs_shape: tuple[int, ...], num_outputs: int, hidden: int = 16) -> None:
        super().__init__()
        self.state_size = hidden
        self.encoder = nn.Sequential(nn.Linear(math.prod(obs_shape), hidden), nn.ReLU())
        self.cell = nn.GRUCell(hidden, hidden)
        self.policy_head = nn.Linear(hidden, num_outputs)
        self.value_head = nn.Linear(hidden, 1)

    def forward_sequence(
        self, obs: torch.Tensor, state: torch.Tensor, resets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t_len, b = obs.shape[:2]
        x = self.encoder(obs.float().reshape(t_len, b, -1))
        h, states = state.float(), []
        for t in range(t_len):
            h = self.cell(x[t], h * (~resets[t]).float().unsqueeze(-1))
            states.append(h)
        core = torch.stack(states)
        return self.policy_head(core), self.value_head(core).squeeze(-1), core


class NotAModel:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


class WrongOutputs(TinyActorCritic):
    """Ignores num_outputs: its policy has 3 outputs whatever the env's actions."""

    def __init__(self, obs_shape: tuple[int, ...], num_outputs: int) -> None:
        super().__init__(obs_shape, 3)


class NoValueHead(ActorCritic):
    """Values from the policy's own layer: fine, unless separateVfOptimizer asks which
    parameters are the value function's."""

    def __init__(self, obs_shape: tuple[int, ...], num_outputs: int) -> None:
        super().__init__()
        self.layer = nn.Linear(math.prod(obs_shape), num_outputs + 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.layer(obs.float().flatten(1))
        return out[:, :-1], out[:, -1]
