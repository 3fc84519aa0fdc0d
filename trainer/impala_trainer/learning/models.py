"""Actor-critic networks: an MLP for vector observations, the IMPALA shallow CNN for Atari.

Every model maps obs [N, *obs_shape] to (logits [N, A], values [N]). uint8 observations are
scaled to [0, 1] inside the model, so frames cross process boundaries as bytes (4x smaller).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

from impala_api.spec import ModelSpec

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def _init_linear(layer: nn.Linear | nn.Conv2d, gain: float) -> None:
    # Orthogonal init with a tiny policy-head gain starts the policy near uniform, which keeps
    # early importance weights near 1 and entropy high (as in cleanrl/sample-factory).
    nn.init.orthogonal_(layer.weight, gain=gain)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


def _mlp(sizes: list[int], activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    for n_in, n_out in itertools.pairwise(sizes):
        linear = nn.Linear(n_in, n_out)
        _init_linear(linear, math.sqrt(2.0))
        layers += [linear, _ACTIVATIONS[activation]()]
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Base class: forward(obs) -> (logits [N, A], values [N])."""

    def __init__(self) -> None:
        super().__init__()
        self.policy_head: nn.Linear
        self.value_head: nn.Linear

    def value_function_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters only the value function uses (the separate vf optimiser trains these)."""
        return self.value_head.parameters()

    def policy_logits(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits [N, A] only: what acting needs (rollout workers call this every step)."""
        logits: torch.Tensor = self(obs)[0]
        return logits

    def _prepare(self, obs: torch.Tensor) -> torch.Tensor:
        dtype = self.value_head.weight.dtype
        if obs.dtype == torch.uint8:
            return obs.to(dtype).mul_(1.0 / 255.0)
        return obs if obs.dtype == dtype else obs.to(dtype)


class MLPActorCritic(ActorCritic):
    """Separate policy and value towers (RLlib's fcnet with vf_share_layers=False).

    Separate towers keep the value loss, whose gradients are large early on (returns in the
    hundreds), from swamping the policy's features under global-norm clipping.
    """

    def __init__(self, obs_size: int, num_actions: int, hidden: list[int], activation: str):
        super().__init__()
        self.policy_trunk = _mlp([obs_size, *hidden], activation)
        self.value_trunk = _mlp([obs_size, *hidden], activation)
        self.policy_head = nn.Linear(hidden[-1], num_actions)
        self.value_head = nn.Linear(hidden[-1], 1)
        _init_linear(self.policy_head, 0.01)
        _init_linear(self.value_head, 1.0)

    def value_function_parameters(self) -> Iterator[nn.Parameter]:
        yield from self.value_trunk.parameters()
        yield from self.value_head.parameters()

    def policy_logits(self, obs: torch.Tensor) -> torch.Tensor:
        # The value tower is half the acting forward and acting never reads it.
        logits: torch.Tensor = self.policy_head(self.policy_trunk(self._prepare(obs).flatten(1)))
        return logits

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self._prepare(obs).flatten(1)  # [N, obs_size]
        logits = self.policy_head(self.policy_trunk(x))  # [N, A]
        values = self.value_head(self.value_trunk(x)).squeeze(-1)  # [N]
        return logits, values


class ImpalaShallowCNN(ActorCritic):
    """Espeholt et al. 2018's shallow network: conv 16x8x8/4, conv 32x4x4/2, fc, two heads."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, hidden: list[int]):
        super().__init__()
        channels = obs_shape[0]
        self.convs = nn.Sequential(
            nn.Conv2d(channels, 16, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Flatten(),
        )
        for layer in self.convs:
            if isinstance(layer, nn.Conv2d):
                _init_linear(layer, math.sqrt(2.0))
        with torch.no_grad():
            conv_out = int(self.convs(torch.zeros(1, *obs_shape)).shape[1])  # 2592 for 84x84
        self.fc = _mlp([conv_out, *hidden], "relu")
        self.policy_head = nn.Linear(hidden[-1], num_actions)
        self.value_head = nn.Linear(hidden[-1], 1)
        _init_linear(self.policy_head, 0.01)
        _init_linear(self.value_head, 1.0)

        # Channels-last (NHWC in memory): oneDNN's convolutions, and above all their backward,
        # run 2-3x faster on CPU than on NCHW (bench/learner_only.py; docs/benchmarks.md).
        self.to(memory_format=torch.channels_last)

    def _prepare(self, obs: torch.Tensor) -> torch.Tensor:
        # One pass: uint8 [N, C, H, W] -> float in channels-last layout (the logical shape stays
        # [N, C, H, W]; nn.Flatten after the convolutions reads it back in C, H, W order).
        dtype = self.value_head.weight.dtype
        x = obs.to(dtype, memory_format=torch.channels_last)
        return x.mul_(1.0 / 255.0) if obs.dtype == torch.uint8 else x

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.fc(self.convs(self._prepare(obs)))  # [N, hidden[-1]]
        return self.policy_head(features), self.value_head(features).squeeze(-1)


class NumpyPolicy:
    """The MLP's policy tower in numpy, for acting: logits [N, A] from obs [N, obs_size].

    A CartPole worker's forward is 32 rows through three small layers, where torch spends its
    time dispatching ops (~41 us per forward) and numpy's calls cost ~1-3 us each (~12 us).
    The arrays are views of the torch parameters (load_state_dict copies into them in place), so
    this never holds stale weights; results equal `policy_logits` to float32 rounding.
    """

    def __init__(self, model: MLPActorCritic) -> None:
        linears = [m for m in model.policy_trunk if isinstance(m, nn.Linear)]
        activation = next(m for m in model.policy_trunk if not isinstance(m, nn.Linear))
        # [in, out] transposed views: BLAS reads them in place, no copy per call.
        self._layers = [_numpy_view(m) for m in (*linears, model.policy_head)]
        self._activation: Callable[[np.ndarray], object] = (
            (lambda x: np.tanh(x, out=x))
            if isinstance(activation, nn.Tanh)
            else (lambda x: np.maximum(x, 0.0, out=x))
        )
        self._buffers: dict[int, list[np.ndarray]] = {}

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Logits for `obs`; the returned array is reused by the next call with as many rows."""
        x = np.asarray(obs, np.float32).reshape(len(obs), -1)
        buffers = self._buffers.get(len(x))
        if buffers is None:
            buffers = [np.empty((len(x), w.shape[1]), np.float32) for w, _ in self._layers]
            self._buffers[len(x)] = buffers
        last = len(self._layers) - 1
        for i, ((weight, bias), out) in enumerate(zip(self._layers, buffers, strict=True)):
            np.matmul(x, weight, out=out)
            np.add(out, bias, out=out)
            if i < last:
                self._activation(out)
            x = out
        return x


def _numpy_view(layer: nn.Linear) -> tuple[np.ndarray, np.ndarray]:
    assert layer.bias is not None
    return layer.weight.detach().numpy().T, layer.bias.detach().numpy()


def acting_policy(model: ActorCritic) -> Callable[[np.ndarray], np.ndarray]:
    """obs (numpy) -> logits (numpy) for acting: numpy for float32 MLPs, torch otherwise."""
    if isinstance(model, MLPActorCritic) and model.policy_head.weight.dtype == torch.float32:
        return NumpyPolicy(model)

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model.policy_logits(torch.from_numpy(obs)).numpy()

    return act


def build_model(model: ModelSpec, obs_shape: tuple[int, ...], num_actions: int) -> ActorCritic:
    """The network the spec asks for; `type: auto` is the CNN for 3-D observations, else MLP.

    For the CNN, `model.hidden` is the fully connected part after the convolutions (the paper
    uses one layer of 256).
    """
    kind = model.type
    if kind == "auto":
        kind = "cnn" if len(obs_shape) == 3 else "mlp"
    if kind == "cnn":
        if len(obs_shape) != 3:
            raise ValueError(f"model.type cnn needs [C, H, W] observations, got {obs_shape}")
        return ImpalaShallowCNN(tuple(obs_shape), num_actions, list(model.hidden))
    obs_size = math.prod(obs_shape)
    return MLPActorCritic(obs_size, num_actions, list(model.hidden), model.activation)
