"""Action distributions: what a policy's outputs mean, for acting (numpy) and learning (torch).

A model outputs `num_inputs` numbers per row (RLlib's "distribution inputs"); the distribution
turns them into actions in the rollout workers and into log-probabilities and entropies in the
loss. V-trace only needs the joint log-probability of the action taken, so the loss is the same
for every space.

- `Categorical(n)` for Discrete: inputs are logits.
- `MultiCategorical(nvec)` for MultiDiscrete/MultiBinary: one Categorical per component, the
  log-probabilities and entropies summed (independent components, as RLlib's).
- `SquashedGaussian(low, high)` for a Box whose bounds are all finite (the default there): a
  Gaussian sample squashed into the bounds by tanh (SAC's, Brax's PPO's). The learner scores the
  sample before the squash; its entropy is that of the squashed action.
- `DiagGaussian(low, high)` for any Box: inputs are [mean, log_std] per dimension. The learner
  scores the sampled, unclipped action; only the env sees it clipped to the space (RLlib's
  `normalize_actions: False, clip_actions: True`), so log-probabilities stay those of the
  distribution that acted.

Why squash where the bounds allow: the env's actions stay inside the space by construction,
near a bound the policy still tells its actions apart (tanh's slope shrinks smoothly, where a
clipped sample past the bound is the bound itself), and the entropy bonus is the squashed
action's, which falls as samples saturate, so it pulls a saturating policy back instead of
widening it. (Continuous policies collapse from policy lag under V-trace's policy gradient, not
from the clip: `tests/unit/trainer/test_policy_lag.py`, `training.surrogateClip`.)

Workers draw each fragment's noise in one call (Gumbel for the categoricals, standard normal for
the Gaussian), which is cheaper than a distribution object per step and makes a worker's actions
a pure function of its seed and weights.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

_LOG_2PI = math.log(2.0 * math.pi)
LOG_STD_BOUNDS = (-20.0, 2.0)
"""log-std is clamped to this range in the loss and when acting: a std of e^-20 is a
deterministic policy already, and an unclamped head can overflow exp() early in training."""


MASKED_LOGIT = -1e9
"""What a masked action's logit becomes (an observation's action_mask), in acting and in the
loss: finite, so a masked action's p * log p is 0 in the entropy, not NaN, and far enough below
any logit that its probability is 0 in float32 and bfloat16 alike."""


class ActionDistribution(ABC):
    """One action space's distribution; plain data, so it pickles to every actor."""

    num_inputs: int
    """Model outputs per row."""
    action_shape: tuple[int, ...]
    """Shape of one action as the learner stores it (flat: the env's own shape is restored by
    `to_env`)."""
    action_dtype: np.dtype
    space_name: str
    """The space as gymnasium prints it, for messages and the export metadata."""

    @abstractmethod
    def log_prob(self, inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """[..., num_inputs], [..., *action_shape] -> [...]."""

    @abstractmethod
    def entropy(self, inputs: torch.Tensor) -> torch.Tensor:
        """[..., num_inputs] -> [...]."""

    def log_prob_and_entropy(
        self,
        inputs: torch.Tensor,
        actions: torch.Tensor,
        behaviour_inputs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both at once (what the loss needs of the learner's own outputs). `behaviour_inputs`
        are those of the policy that sampled `actions`: a distribution whose entropy has no
        closed form estimates it from the sample's own noise."""
        return self.log_prob(inputs, actions), self.entropy(inputs)

    @abstractmethod
    def noise(self, rng: np.random.Generator, t_len: int, batch: int) -> np.ndarray:
        """The randomness of a fragment's T x B actions, drawn in one call."""

    @abstractmethod
    def sample(self, inputs: np.ndarray, noise: np.ndarray, out: np.ndarray) -> None:
        """Write actions for [B, num_inputs] `inputs` and one step's `noise` into `out`."""

    @abstractmethod
    def greedy(self, inputs: np.ndarray) -> np.ndarray:
        """The most likely action per row (evaluation without exploration)."""

    @abstractmethod
    def mode(self, inputs: torch.Tensor) -> torch.Tensor:
        """`greedy` in torch, for exported graphs: [..., num_inputs] -> [..., *action_shape]."""

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """Actions [B, *action_shape] as the vector env takes them."""
        return actions

    @property
    def encoded_size(self) -> int:
        """Floats per action in `encode` (a recurrent model's previous-action input)."""
        return self.num_inputs

    @abstractmethod
    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions [..., *action_shape] as model inputs [..., encoded_size]: one-hot for the
        discrete spaces, the (unclipped) sample itself for Box (RLlib's prev-action input)."""

    def empty_actions(self, t_len: int, batch: int) -> np.ndarray:
        return np.empty((t_len, batch, *self.action_shape), self.action_dtype)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and repr(other) == repr(self)

    def __hash__(self) -> int:
        return hash(repr(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.space_name})"


class Categorical(ActionDistribution):
    def __init__(self, n: int) -> None:
        self.n = int(n)
        self.num_inputs = self.n
        self.action_shape = ()
        self.action_dtype = np.dtype(np.int64)
        self.space_name = f"Discrete({self.n})"
        self._scores: np.ndarray | None = None

    def log_prob(self, inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        log_probs = F.log_softmax(inputs, dim=-1)
        return log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    def entropy(self, inputs: torch.Tensor) -> torch.Tensor:
        log_probs = F.log_softmax(inputs, dim=-1)
        return -(log_probs.exp() * log_probs).sum(-1)

    def log_prob_and_entropy(
        self,
        inputs: torch.Tensor,
        actions: torch.Tensor,
        behaviour_inputs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # One log-softmax for both: the CartPole learner's update is op dispatch, op for op.
        log_probs = F.log_softmax(inputs, dim=-1)
        taken = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return taken, -(log_probs.exp() * log_probs).sum(-1)

    def noise(self, rng: np.random.Generator, t_len: int, batch: int) -> np.ndarray:
        return rng.gumbel(size=(t_len, batch, self.n)).astype(np.float32)

    def sample(self, inputs: np.ndarray, noise: np.ndarray, out: np.ndarray) -> None:
        # Gumbel-max: argmax(logits + Gumbel noise) is a sample of softmax(logits).
        if self._scores is None or self._scores.shape != inputs.shape:
            self._scores = np.empty(inputs.shape, np.float32)
        np.add(inputs, noise, out=self._scores)
        np.argmax(self._scores, axis=1, out=out)

    def greedy(self, inputs: np.ndarray) -> np.ndarray:
        return np.asarray(np.argmax(inputs, axis=-1))

    def mode(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs.argmax(-1)

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        return F.one_hot(actions.long(), self.n).float()

    def __getstate__(self) -> dict[str, object]:
        return {**vars(self), "_scores": None}


class MultiCategorical(ActionDistribution):
    def __init__(
        self, nvec: list[int] | tuple[int, ...], shape: tuple[int, ...], dtype: str
    ) -> None:
        self.nvec = tuple(int(n) for n in nvec)
        self.env_shape = tuple(shape)
        self.env_dtype = str(dtype)
        self.num_inputs = sum(self.nvec)
        self.action_shape = (len(self.nvec),)
        self.action_dtype = np.dtype(np.int64)
        self.space_name = f"MultiDiscrete({list(self.nvec)})"
        self._bounds = np.cumsum((0, *self.nvec)).tolist()

    def _parts(self, inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.split(inputs, list(self.nvec), dim=-1)

    def log_prob(self, inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        total = inputs.new_zeros(inputs.shape[:-1])
        for i, part in enumerate(self._parts(inputs)):
            logp = F.log_softmax(part, dim=-1)
            total = total + logp.gather(-1, actions[..., i : i + 1]).squeeze(-1)
        return total

    def entropy(self, inputs: torch.Tensor) -> torch.Tensor:
        total = inputs.new_zeros(inputs.shape[:-1])
        for part in self._parts(inputs):
            logp = F.log_softmax(part, dim=-1)
            total = total - (logp.exp() * logp).sum(-1)
        return total

    def noise(self, rng: np.random.Generator, t_len: int, batch: int) -> np.ndarray:
        return rng.gumbel(size=(t_len, batch, self.num_inputs)).astype(np.float32)

    def sample(self, inputs: np.ndarray, noise: np.ndarray, out: np.ndarray) -> None:
        scores = inputs + noise
        for i, (lo, hi) in enumerate(zip(self._bounds, self._bounds[1:], strict=False)):
            np.argmax(scores[:, lo:hi], axis=1, out=out[:, i])

    def greedy(self, inputs: np.ndarray) -> np.ndarray:
        parts = [
            np.argmax(inputs[..., lo:hi], axis=-1)
            for lo, hi in zip(self._bounds, self._bounds[1:], strict=False)
        ]
        return np.stack(parts, axis=-1)

    def mode(self, inputs: torch.Tensor) -> torch.Tensor:
        return torch.stack([part.argmax(-1) for part in self._parts(inputs)], dim=-1)

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        parts = [F.one_hot(actions[..., i].long(), n) for i, n in enumerate(self.nvec)]
        return torch.cat(parts, dim=-1).float()

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        return actions.reshape(len(actions), *self.env_shape).astype(self.env_dtype, copy=False)


class DiagGaussian(ActionDistribution):
    def __init__(self, low: np.ndarray, high: np.ndarray, dtype: str = "float32") -> None:
        self.low = np.asarray(low, np.float32)
        self.high = np.asarray(high, np.float32)
        self.env_shape = tuple(self.low.shape)
        self.env_dtype = str(dtype)
        self.dim = int(self.low.size)
        self.num_inputs = 2 * self.dim
        self.action_shape = (self.dim,)
        self.action_dtype = np.dtype(np.float32)
        self.space_name = f"Box({self.low.tolist()}, {self.high.tolist()}, {self.env_shape})"
        self._flat_low = self.low.reshape(-1)
        self._flat_high = self.high.reshape(-1)

    def _mean_log_std(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = torch.split(inputs, self.dim, dim=-1)
        return mean, log_std.clamp(*LOG_STD_BOUNDS)

    def log_prob(self, inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        mean, log_std = self._mean_log_std(inputs)
        z = (actions.to(mean.dtype) - mean) * torch.exp(-log_std)
        return -(0.5 * z.pow(2) + log_std + 0.5 * _LOG_2PI).sum(-1)

    def entropy(self, inputs: torch.Tensor) -> torch.Tensor:
        _, log_std = self._mean_log_std(inputs)
        return (log_std + 0.5 * (_LOG_2PI + 1.0)).sum(-1)

    def noise(self, rng: np.random.Generator, t_len: int, batch: int) -> np.ndarray:
        return rng.standard_normal((t_len, batch, self.dim), np.float32)

    def sample(self, inputs: np.ndarray, noise: np.ndarray, out: np.ndarray) -> None:
        mean, log_std = inputs[:, : self.dim], inputs[:, self.dim :]
        np.multiply(np.exp(np.clip(log_std, *LOG_STD_BOUNDS)), noise, out=out)
        np.add(out, mean, out=out)

    def greedy(self, inputs: np.ndarray) -> np.ndarray:
        return np.array(inputs[..., : self.dim], np.float32)

    def mode(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs[..., : self.dim]

    @property
    def encoded_size(self) -> int:
        return self.dim

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        return actions.float()

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        clipped = np.clip(actions, self._flat_low, self._flat_high)
        return np.asarray(clipped.reshape(len(actions), *self.env_shape), self.env_dtype)


class SquashedGaussian(DiagGaussian):
    """A diagonal Gaussian sample u squashed into [low, high] by tanh: the env gets
    `low + (tanh(u) + 1) / 2 * (high - low)`, the batch keeps u.

    Scoring u is exact for V-trace: the squash's Jacobian depends on u alone, so it cancels in
    the ratio of two policies' densities. The entropy is the squashed action's (the Gaussian's
    plus E[log |det J(u)|]), estimated at one sample of the learner's policy drawn with the
    behaviour sample's own noise, `u' = mean + std * (u - mean_b) / std_b`: differentiable in
    the learner's outputs, with no random numbers in the loss."""

    def __init__(self, low: np.ndarray, high: np.ndarray, dtype: str = "float32") -> None:
        super().__init__(low, high, dtype)
        if not (np.isfinite(self.low).all() and np.isfinite(self.high).all()):
            raise ValueError(f"a squashed Gaussian needs finite bounds, not {self.space_name}")
        self._center = (self._flat_high + self._flat_low) / 2
        self._half = (self._flat_high - self._flat_low) / 2
        self._log_half = float(np.log(self._half).sum())

    def squashed_entropy(self, inputs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The squashed action's entropy at the sample `mean + std * noise` of `inputs`."""
        mean, log_std = self._mean_log_std(inputs)
        u = mean + torch.exp(log_std) * noise
        # log(1 - tanh(u)^2), stable for large |u|.
        log_det = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
        return super().entropy(inputs) + log_det.sum(-1) + self._log_half

    def log_prob_and_entropy(
        self,
        inputs: torch.Tensor,
        actions: torch.Tensor,
        behaviour_inputs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if behaviour_inputs is None:
            return super().log_prob_and_entropy(inputs, actions)
        b_mean, b_log_std = self._mean_log_std(behaviour_inputs.to(inputs.dtype))
        noise = (actions.to(inputs.dtype) - b_mean) * torch.exp(-b_log_std)
        return self.log_prob(inputs, actions), self.squashed_entropy(inputs, noise)

    def entropy(self, inputs: torch.Tensor) -> torch.Tensor:
        # Without a sample: the estimate at the mean (noise 0), for reports only; the loss
        # uses log_prob_and_entropy.
        return self.squashed_entropy(inputs, torch.zeros_like(inputs[..., : self.dim]))

    def mode(self, inputs: torch.Tensor) -> torch.Tensor:
        center = torch.as_tensor(self._center, dtype=inputs.dtype, device=inputs.device)
        half = torch.as_tensor(self._half, dtype=inputs.dtype, device=inputs.device)
        return center + half * torch.tanh(inputs[..., : self.dim])

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        squashed = self._center + self._half * np.tanh(actions)
        # tanh rounds to exactly +-1 in float32 from |u| ~ 9: keep the result inside the space.
        np.clip(squashed, self._flat_low, self._flat_high, out=squashed)
        return np.asarray(squashed.reshape(len(actions), *self.env_shape), self.env_dtype)


def squashable(space: gym.Space[Any]) -> bool:
    """Whether a squashed Gaussian fits `space`: a Box whose every bound is finite."""
    return (
        isinstance(space, gym.spaces.Box)
        and bool(np.isfinite(space.low).all())
        and bool(np.isfinite(space.high).all())
    )


def action_distribution(space: gym.Space[Any], squash: bool | None = None) -> ActionDistribution:
    """The policy's distribution over `space` (one `rollouts.envs.check_spaces` accepts):
    Categorical for Discrete, one Categorical per component for MultiDiscrete and MultiBinary,
    for a float Box a squashed Gaussian (`squash`; None: where every bound is finite) or a
    clipped one."""
    if isinstance(space, gym.spaces.Discrete):
        return Categorical(int(space.n))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MultiCategorical(space.nvec.reshape(-1).tolist(), space.shape, str(space.dtype))
    if isinstance(space, gym.spaces.MultiBinary):
        shape = tuple(space.shape)
        return MultiCategorical([2] * int(np.prod(shape)), shape, str(space.dtype))
    if isinstance(space, gym.spaces.Box):
        if squash or (squash is None and squashable(space)):
            return SquashedGaussian(space.low, space.high, str(space.dtype))
        return DiagGaussian(space.low, space.high, str(space.dtype))
    raise ValueError(f"no action distribution for {space}")


def as_distribution(actions: ActionDistribution | int) -> ActionDistribution:
    """A distribution, or a number of discrete actions as its Categorical."""
    return actions if isinstance(actions, ActionDistribution) else Categorical(actions)
