"""PopArt (van Hasselt et al. 2016; Hessel et al. 2019, "Multi-task deep RL with PopArt", the
IMPALA authors' value normalisation): the value head learns values in units of the return's
running scale, and its weights are rewritten whenever that scale moves, so that what it outputs
is unchanged ("Preserving Outputs Precisely, while Adaptively Rescaling Targets").

`PopArtHead` replaces a model's `value_head` (an `nn.Linear` to one output) and keeps the running
first and second moments of the V-trace targets as buffers: they travel with the model's state
dict (checkpoints, broadcast weights, exports), and the head's output is the value in the
return's own units, `sigma * normalised + mu`, wherever the model runs. The loss divides the
value error by sigma^2 and the policy-gradient advantage by sigma (`scale`): the value loss is
that of the normalised targets, and the advantage's scale no longer depends on the reward's, so
an entropy coefficient means the same at any reward scale.
"""

from __future__ import annotations

import torch
from torch import nn

from impala_trainer.learning.models import ActorCritic

BETA = 3e-4
"""Step size of the moments' running averages, per train batch (the paper's Atari setting)."""
MIN_SIGMA = 1e-4
MAX_SIGMA = 1e6
"""The scale's clamp (the paper's): a constant return would otherwise divide by zero."""


class PopArtHead(nn.Module):
    """`linear` (features -> the normalised value), its output unnormalised by the moments."""

    mu: torch.Tensor
    """The running mean of the targets."""
    nu: torch.Tensor
    """The running mean of the targets' squares (sigma^2 = nu - mu^2)."""
    updates: torch.Tensor
    """Batches the moments have moved for (int64)."""

    def __init__(self, linear: nn.Linear, beta: float = BETA) -> None:
        super().__init__()
        if linear.out_features != 1:
            raise ValueError(f"PopArt needs a value head with one output, not {linear}")
        self.linear = linear
        self.beta = beta
        self.register_buffer("mu", torch.zeros(()))
        self.register_buffer("nu", torch.ones(()))
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))

    @property
    def weight(self) -> torch.Tensor:
        """The linear layer's weight (models read the head's dtype from it)."""
        return self.linear.weight

    def sigma(self) -> torch.Tensor:
        return (self.nu - self.mu.square()).clamp(MIN_SIGMA**2, MAX_SIGMA**2).sqrt()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        sigma = self.sigma().to(features.dtype)
        normalised: torch.Tensor = self.linear(features)
        return normalised * sigma + self.mu.to(features.dtype)

    @torch.no_grad()
    def update(self, mean: torch.Tensor, mean_square: torch.Tensor) -> None:
        """Move the moments towards a batch's (the mean and mean square of its targets) and
        rewrite the linear layer so the head's outputs stay exactly what they were.

        The first batch sets them outright: starting from (0, 1) a return scale of thousands
        would take thousands of batches to be learned, with value errors in the millions."""
        old_mu, old_sigma = self.mu.clone(), self.sigma()
        if int(self.updates) == 0:
            self.mu.copy_(mean)
            self.nu.copy_(torch.maximum(mean_square, mean.square() + 1.0))
        else:
            self.mu.lerp_(mean.to(self.mu), self.beta)
            self.nu.lerp_(mean_square.to(self.nu), self.beta)
        self.updates.add_(1)
        new_sigma = self.sigma()
        w, b = self.linear.weight, self.linear.bias
        w.mul_((old_sigma / new_sigma).to(w.dtype))
        b.mul_(old_sigma.to(b.dtype)).add_((old_mu - self.mu).to(b.dtype)).div_(
            new_sigma.to(b.dtype)
        )


def attach(model: ActorCritic) -> PopArtHead:
    """Replace `model.value_head` with its PopArt head (once); returns the head."""
    head = getattr(model, "value_head", None)
    if isinstance(head, PopArtHead):
        return head
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"model.popart needs the model's value_head to be an nn.Linear with one output; "
            f"{type(model).__name__} has {type(head).__name__}"
        )
    model.value_head = PopArtHead(head)  # type: ignore[assignment]
    return model.value_head  # type: ignore[return-value]


def head_of(model: nn.Module) -> PopArtHead | None:
    """The model's PopArt head, or None where the model has none."""
    head = getattr(model, "value_head", None)
    return head if isinstance(head, PopArtHead) else None


def scale(model: nn.Module) -> torch.Tensor | None:
    """sigma of the model's PopArt head (detached), or None without one."""
    head = head_of(model)
    return None if head is None else head.sigma().detach()
