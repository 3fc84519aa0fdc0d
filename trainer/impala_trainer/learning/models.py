"""Actor-critic networks: an MLP for vector observations, the IMPALA shallow CNN and deep ResNet
for frames, any of them with an LSTM core; and the contract a model of your own implements.

Every model maps obs [N, *obs_shape] to (outputs [N, D], values [N]), the outputs being the action
distribution's inputs (`distributions`); a recurrent one maps sequences with a state
(`ActorCritic.forward_sequence`). uint8 observations are scaled to [0, 1] inside the model, so
frames cross process boundaries as bytes (4x smaller). The spec builds them in `model_factory`;
workers act with them through `inference`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import torch
from torch import nn

from impala_trainer.learning.distributions import (
    ActionDistribution,
    DiagGaussian,
    as_distribution,
)

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
    """The model contract the learner, the workers and your own `model.type: custom` class share.

    Feed-forward: `forward(obs [N, *obs_shape]) -> (outputs [N, num_outputs], values [N])`, where
    the outputs are the action distribution's inputs (logits for Discrete, [mean, log_std] per
    dimension for Box; `distributions`). Observations arrive as the env makes them (uint8 frames
    unscaled, float32 vectors); `prepare_observations` scales and casts them.

    Recurrent: set `state_size` (floats of state per env, one flat vector: pack h and c into it)
    and implement `forward_sequence`; `forward` is then unused. The workers carry the state
    across steps and fragments, zeroing it where an episode starts; the learner unrolls each
    fragment column from the state it began with.
    """

    state_size: int = 0
    """Recurrent state per env (0: feed-forward)."""
    uses_prev_action_reward: bool = False
    """The state's tail is the previous action and reward (`RecurrentActorCritic`): the worker
    writes it with `carry` after each env step, the learner passes the batch's actions and
    rewards to `forward_sequence`."""
    policy_head: nn.Linear
    value_head: nn.Linear
    """The built-in models' heads (a model of your own need not have them)."""
    acts_in_bfloat16: bool = False
    """Whether rollout workers may act with a bfloat16 copy of this model where the learner
    computes in bf16 and their CPU does so natively (`acting_policy`): the built-in
    convolutional models. Yours stays float32 unless it sets this (its forward must then run on
    bf16 parameters and inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.log_std: nn.Parameter | None = None

    def _policy_head(self, features: int, dist: ActionDistribution, free_log_std: bool) -> None:
        """policy_head over `features`; with `free_log_std` (Box actions) it outputs the means
        only and the log-stds are parameters of their own, state-independent (RLlib's
        free_log_std)."""
        outputs = dist.num_inputs
        if free_log_std:
            if not isinstance(dist, DiagGaussian):
                raise ValueError(f"freeLogStd needs a Box action space, not {dist.space_name}")
            outputs = dist.dim
            self.log_std = nn.Parameter(torch.zeros(dist.dim))
        self.policy_head = nn.Linear(features, outputs)
        _init_linear(self.policy_head, 0.01)

    def _outputs(self, head: torch.Tensor) -> torch.Tensor:
        if self.log_std is None:
            return head
        return torch.cat([head, self.log_std.to(head.dtype).expand(*head.shape[:-1], -1)], -1)

    def value_function_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters only the value function uses (the separate vf optimiser trains these)."""
        head = getattr(self, "value_head", None)
        if not isinstance(head, nn.Module):
            raise NotImplementedError(
                f"{type(self).__name__} has no value_head: define value_function_parameters() "
                "to use training.separateVfOptimizer"
            )
        return head.parameters()

    def policy_logits(self, obs: torch.Tensor) -> torch.Tensor:
        """Distribution inputs [N, D] only: what acting needs (workers call this every step)."""
        logits: torch.Tensor = self(obs)[0]
        return logits

    def initial_state(self, batch: int) -> torch.Tensor:
        """The state an episode starts from: zeros [batch, state_size]."""
        return torch.zeros(batch, self.state_size)

    def forward_sequence(
        self,
        obs: torch.Tensor,
        state: torch.Tensor,
        resets: torch.Tensor,
        actions: torch.Tensor | None = None,
        rewards: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """obs [T, B, *obs_shape], state [B, S], resets [T, B] (True: zero the state before step
        t, an episode starts there) -> outputs [T, B, D], values [T, B], states [T, B, S] (the
        state after each step, before any reset). Feed-forward models ignore the state. The
        actions and rewards of the steps are passed only to models that set
        `uses_prev_action_reward`."""
        t_len, b = obs.shape[:2]
        outputs, values = self(obs.reshape(t_len * b, *obs.shape[2:]))
        return outputs.view(t_len, b, -1), values.view(t_len, b), state.new_zeros(t_len, b, 0)

    def carry(
        self, state: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor
    ) -> torch.Tensor:
        """The state after the env took `actions` and returned `rewards` (unchanged here)."""
        return state

    def act(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One acting step: obs [B, ...], state [B, S] -> (outputs [B, D], state after [B, S])."""
        if self.state_size == 0:
            return self.policy_logits(obs), state
        no_reset = torch.zeros(1, obs.shape[0], dtype=torch.bool)
        outputs, _, states = self.forward_sequence(obs.unsqueeze(0), state, no_reset)
        return outputs[0], states[0]

    def prepare_observations(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [N, *obs_shape] as the first layer reads them (the built-in models: float, uint8
        frames scaled to [0, 1], convolutions' input channels-last and, under autocast, in its
        dtype); `forward` and `forward_sequence` take the result unchanged, as they take raw
        observations.

        The learner prepares a batch once and reuses the result over its numSgdIter passes
        (`losses.model_inputs`; for a 250-frame Atari batch the uint8 -> float channels-last copy
        is ~5 ms of a ~35 ms update on two cores). Yours (default: as the env made them) must
        return the same for an already prepared tensor; one that reads parameters is prepared
        again on every pass.
        """
        return obs


def _scaled(obs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Observations as `dtype`, uint8 frames scaled to [0, 1]."""
    if obs.dtype == torch.uint8:
        return obs.to(dtype).mul_(1.0 / 255.0)
    return obs if obs.dtype == dtype else obs.to(dtype)


class MLPActorCritic(ActorCritic):
    """Separate policy and value towers (RLlib's fcnet with vf_share_layers=False).

    Separate towers keep the value loss, whose gradients are large early on (returns in the
    hundreds), from swamping the policy's features under global-norm clipping.
    """

    def __init__(
        self,
        obs_size: int,
        actions: ActionDistribution | int,
        hidden: list[int],
        activation: str,
        free_log_std: bool = False,
    ):
        super().__init__()
        self.policy_trunk = _mlp([obs_size, *hidden], activation)
        self.value_trunk = _mlp([obs_size, *hidden], activation)
        self._policy_head(hidden[-1], as_distribution(actions), free_log_std)
        self.value_head = nn.Linear(hidden[-1], 1)
        _init_linear(self.value_head, 1.0)

    def value_function_parameters(self) -> Iterator[nn.Parameter]:
        yield from self.value_trunk.parameters()
        yield from self.value_head.parameters()

    def prepare_observations(self, obs: torch.Tensor) -> torch.Tensor:
        return _scaled(obs, self.value_head.weight.dtype)

    def policy_logits(self, obs: torch.Tensor) -> torch.Tensor:
        # The value tower is half the acting forward and acting never reads it.
        head = self.policy_head(self.policy_trunk(self.prepare_observations(obs).flatten(1)))
        return self._outputs(head)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.prepare_observations(obs).flatten(1)  # [N, obs_size]
        outputs = self._outputs(self.policy_head(self.policy_trunk(x)))  # [N, D]
        values = self.value_head(self.value_trunk(x)).squeeze(-1)  # [N]
        return outputs, values


class ImpalaShallowCNN(ActorCritic):
    """Espeholt et al. 2018's shallow network: conv 16x8x8/4, conv 32x4x4/2, fc, two heads."""

    acts_in_bfloat16 = True

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        actions: ActionDistribution | int,
        hidden: list[int],
        free_log_std: bool = False,
    ):
        super().__init__()
        torso = ShallowCNNTorso(obs_shape, hidden)
        # The torso's layers under this module's own names, as checkpoints have them.
        self.convs, self.fc = torso.convs, torso.fc
        self._policy_head(hidden[-1], as_distribution(actions), free_log_std)
        self.value_head = nn.Linear(hidden[-1], 1)
        _init_linear(self.value_head, 1.0)
        self.to(memory_format=torch.channels_last)

    def prepare_observations(self, obs: torch.Tensor) -> torch.Tensor:
        return _channels_last(obs, self.value_head.weight.dtype)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.fc(self.convs(self.prepare_observations(obs)))  # [N, hidden[-1]]
        return self._outputs(self.policy_head(features)), self.value_head(features).squeeze(-1)


class Torso(nn.Module):
    """Observations -> features [N, out_features]: the part of a network below its heads."""

    out_features: int

    def _dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def prepare_observations(self, obs: torch.Tensor) -> torch.Tensor:
        """As `ActorCritic.prepare_observations`: what `forward` reads, idempotent."""
        return _scaled(obs, self._dtype())


def _channels_last(obs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # uint8 [N, C, H, W] -> float in channels-last layout (the logical shape stays [N, C, H, W];
    # nn.Flatten after the convolutions reads it back in C, H, W order).
    # Channels-last (NHWC in memory): oneDNN's convolutions, and above all their backward, run
    # 2-3x faster on CPU than on NCHW (bench/learner_only.py).
    if dtype == torch.float32 and torch.is_autocast_enabled(obs.device.type):
        # Under autocast the first convolution would cast a float32 input to autocast's dtype
        # on every forward; a learner's SGD passes over one prepared batch then share a single
        # cast, in half the memory. The same values: frames are integers, exact in bf16, and
        # the scaling below rounds once, as the cast of the float32 product did.
        dtype = torch.get_autocast_dtype(obs.device.type)
    if obs.dtype == torch.uint8 and obs.device.type == "cpu" and 2 <= obs.shape[1] <= 4:
        # A few planes (stacked frames, RGB) interleaved by torch.stack, then converted: per
        # 84x84x4 frame 11 against 22 us (float32) and 13 against 36 us (bfloat16) for torch's
        # strided channels-last copy, one thread; the same values and strides.
        x = torch.stack(obs.unbind(1), dim=-1).to(dtype).permute(0, 3, 1, 2)
    else:
        x = obs.to(dtype, memory_format=torch.channels_last)
    return x.mul_(1.0 / 255.0) if obs.dtype == torch.uint8 else x


def _fc_after(convs: nn.Module, obs_shape: tuple[int, ...], hidden: list[int]) -> nn.Sequential:
    """Initialise `convs`' convolutions and return the fully connected layers that follow them,
    sized by probing `convs` with one observation."""
    for layer in convs.modules():
        if isinstance(layer, nn.Conv2d):
            _init_linear(layer, math.sqrt(2.0))
    with torch.no_grad():
        conv_out = int(convs(torch.zeros(1, *obs_shape)).shape[1])
    return _mlp([conv_out, *hidden], "relu")


class ShallowCNNTorso(Torso):
    """The shallow CNN's features: conv 16x8x8/4, conv 32x4x4/2, fc `hidden` (ReLU)."""

    def __init__(self, obs_shape: tuple[int, ...], hidden: list[int]) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(obs_shape[0], 16, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=4, stride=2),
            # Flatten before the ReLU (the same values): the flattened copy's gradient comes
            # back in C, H, W order, and a ReLU on the channels-last map would meet it in
            # another memory format in its backward, a strided pass (torch's profiler, a
            # 260-frame update on two cores: ReLU backward 0.9 ms of ~30, against 2.2-2.5 ms
            # with the ReLU on the channels-last map).
            nn.Flatten(),
            nn.ReLU(),
        )
        self.fc = _fc_after(self.convs, obs_shape, hidden)  # 2592 inputs for 84x84
        self.out_features = hidden[-1]
        self.to(memory_format=torch.channels_last)

    def prepare_observations(self, obs: torch.Tensor) -> torch.Tensor:
        return _channels_last(obs, self._dtype())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(self.prepare_observations(obs)))  # type: ignore[no-any-return]


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))  # type: ignore[no-any-return]


class ResNetTorso(Torso):
    """Espeholt et al. 2018's deep network (Figure 3, right): three stacks of conv 3x3 + max-pool
    3x3/2 + two residual blocks, 16/32/32 channels, then ReLU and fc `hidden` (256 in the paper).
    """

    def __init__(self, obs_shape: tuple[int, ...], hidden: list[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = obs_shape[0]
        for out in (16, 32, 32):
            layers += [
                nn.Conv2d(channels, out, kernel_size=3, padding=1),
                nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
                _ResidualBlock(out),
                _ResidualBlock(out),
            ]
            channels = out
        self.stacks = nn.Sequential(*layers, nn.Flatten(), nn.ReLU())  # as ShallowCNNTorso
        self.fc = _fc_after(self.stacks, obs_shape, hidden)  # 3872 inputs for 84x84
        self.out_features = hidden[-1]
        self.to(memory_format=torch.channels_last)

    def prepare_observations(self, obs: torch.Tensor) -> torch.Tensor:
        return _channels_last(obs, self._dtype())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.stacks(self.prepare_observations(obs)))  # type: ignore[no-any-return]


class MLPTorso(Torso):
    """Observations flattened through one MLP (the recurrent models' encoder for vectors)."""

    def __init__(self, obs_size: int, hidden: list[int], activation: str) -> None:
        super().__init__()
        self.mlp = _mlp([obs_size, *hidden], activation)
        self.out_features = hidden[-1]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.prepare_observations(obs).flatten(1))  # type: ignore[no-any-return]


class TorsoActorCritic(ActorCritic):
    """A torso's features into a policy head and a value head (the deep ResNet's model)."""

    def __init__(
        self, torso: Torso, actions: ActionDistribution, free_log_std: bool = False
    ) -> None:
        super().__init__()
        self.torso = torso
        self.acts_in_bfloat16 = isinstance(torso, ShallowCNNTorso | ResNetTorso)
        features = torso.out_features
        self._policy_head(features, actions, free_log_std)
        self.value_head = nn.Linear(features, 1)
        _init_linear(self.value_head, 1.0)

    def prepare_observations(self, obs: torch.Tensor) -> torch.Tensor:
        return self.torso.prepare_observations(obs)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.torso(obs)
        return self._outputs(self.policy_head(features)), self.value_head(features).squeeze(-1)


class RecurrentActorCritic(ActorCritic):
    """torso -> LSTM core -> policy and value heads (RLlib's use_lstm wrapper; the paper's agents).

    The torso runs once over all T x B observations; the core steps through time, zeroing the
    state where an episode starts (`resets`), as torchbeast's and the paper's learners unroll.
    The state is [h, c] in one [B, 2 * cell] vector.

    With `prev_action_reward` (RLlib's lstm_use_prev_action_reward) the core also sees the
    previous action (`ActionDistribution.encode`) and reward, zeros at an episode's start. They
    travel as the state's tail, [h, c, action, reward]: whatever carries the state (the worker,
    a fragment's `state_in`, sequence starts, checkpoints of nothing new) carries them too. The
    worker writes them after each env step (`carry`); the learner's unroll writes them from the
    batch's actions and rewards, so both see the same inputs.
    """

    def __init__(
        self,
        torso: Torso,
        cell_size: int,
        actions: ActionDistribution,
        free_log_std: bool = False,
        prev_action_reward: bool = False,
    ) -> None:
        super().__init__()
        self.torso = torso
        self.cell_size = cell_size
        self.actions = actions
        self.prev_size = actions.encoded_size + 1 if prev_action_reward else 0
        self.uses_prev_action_reward = prev_action_reward
        self.state_size = 2 * cell_size + self.prev_size
        self.core = nn.LSTMCell(torso.out_features + self.prev_size, cell_size)
        self._policy_head(cell_size, actions, free_log_std)
        self.value_head = nn.Linear(cell_size, 1)
        _init_linear(self.value_head, 1.0)

    def prepare_observations(self, obs: torch.Tensor) -> torch.Tensor:
        return self.torso.prepare_observations(obs)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise TypeError("a recurrent model runs through forward_sequence(obs, state, resets)")

    def _prev(self, actions: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.actions.encode(actions), rewards.unsqueeze(-1).float()], dim=-1)

    def carry(
        self, state: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor
    ) -> torch.Tensor:
        """The state with the action just taken and its reward written into its tail."""
        if not self.prev_size:
            return state
        return torch.cat([state[:, : 2 * self.cell_size], self._prev(actions, rewards)], dim=-1)

    def forward_sequence(
        self,
        obs: torch.Tensor,
        state: torch.Tensor,
        resets: torch.Tensor,
        actions: torch.Tensor | None = None,
        rewards: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As `ActorCritic.forward_sequence`; with prev_action_reward, `actions` [T', B, ...]
        and `rewards` [T', B] (T' <= T) are written into the state after each of the first T'
        steps, as the worker's `carry` did."""
        t_len, b = obs.shape[:2]
        x = self.torso(obs.reshape(t_len * b, *obs.shape[2:])).view(t_len, b, -1)
        cell = self.cell_size
        h, c, prev = torch.split(state.to(x.dtype), [cell, cell, self.prev_size], dim=-1)
        if self.prev_size and actions is not None and rewards is not None:
            prevs = self._prev(actions, rewards).to(x.dtype)  # [T', B, prev_size]
        else:
            prevs = x.new_zeros(0, b, self.prev_size)
        keep = (~resets).to(x.dtype).unsqueeze(-1)  # [T, B, 1]
        hs, cs, ps = [], [], []
        for t in range(t_len):
            h, c, prev = h * keep[t], c * keep[t], prev * keep[t]
            h, c = self.core(torch.cat([x[t], prev], dim=-1) if self.prev_size else x[t], (h, c))
            if t < len(prevs):
                prev = prevs[t]
            hs.append(h)
            cs.append(c)
            ps.append(prev)
        core = torch.stack(hs)  # [T, B, cell]
        outputs = self._outputs(self.policy_head(core))
        states = torch.cat([core, torch.stack(cs), torch.stack(ps)], dim=-1)
        return outputs, self.value_head(core).squeeze(-1), states
