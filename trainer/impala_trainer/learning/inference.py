"""Acting with a model: obs (numpy) -> distribution inputs (numpy), as rollout workers and a
loaded policy call it every step; the fast paths (the MLP's policy tower in numpy, a bfloat16
copy of a CNN) and in-place weight loads.

The models themselves are in `models`; results here equal their `policy_logits` (to float32
rounding, or bit for bit with the learner's bf16 autocast for `CastPolicy`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch import nn

from impala_trainer.learning.models import ActorCritic, MLPActorCritic


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


class CastPolicy:
    """A feed-forward model acting through a copy of itself in `dtype` (bfloat16): obs (numpy)
    -> distribution inputs (float32 numpy).

    The copy is recast from the model whenever the model's parameters or buffers changed since
    the last call (torch counts every in-place write, `load_state_dict`'s included), so it never
    acts on stale weights. Its arithmetic is the learner's under bf16 autocast: frames scaled in
    float32 and rounded to bf16, bf16 weights, bf16 outputs. For the Pong CNN, one rollout
    thread's forward over 10 frames took 87 against 117 us per frame in float32.
    """

    def __init__(self, model: ActorCritic, dtype: torch.dtype) -> None:
        self._copy = copy.deepcopy(model).to(dtype).eval()
        self._sources = [*model.parameters(), *model.buffers()]
        self._targets = [*self._copy.parameters(), *self._copy.buffers()]
        self._seen: list[int] = []

    def _versions(self) -> list[int]:
        return [t._version for t in self._sources]

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        versions = self._versions()
        if versions != self._seen:
            with torch.no_grad():
                for target, source in zip(self._targets, self._sources, strict=True):
                    target.copy_(source)
            self._seen = versions
        with torch.inference_mode():
            return self._copy.policy_logits(torch.from_numpy(obs)).float().numpy()


class WeightLoader:
    """Writes arrays (a state dict from the learner) into a model's own tensors, in place.

    `load_state_dict` walks the module tree with its hooks and checks on every call, and a
    CartPole actor loads a broadcast with every 128-step fragment: for the MLP's 12 tensors,
    unpickling included, one thread, 124 us that way against 37 us copying tensor by tensor
    (beside `sample`, as an actor runs them: 218-236 against 101-114 us). The tensors written
    are the model's (torch counts the writes, so `CastPolicy` sees them); keys or shapes that
    do not match go through `load_state_dict`, for its checks and its error.
    """

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        # Detached views: the parameters' and buffers' own storage and version counters.
        self._targets = model.state_dict()

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> None:
        targets = self._targets
        if arrays.keys() != targets.keys() or any(
            np.shape(arrays[k]) != t.shape for k, t in targets.items()
        ):
            self._model.load_state_dict(
                {k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()}
            )
            return
        with torch.no_grad():
            for k, t in targets.items():
                t.copy_(torch.from_numpy(np.asarray(arrays[k])))


def acting_policy(
    model: ActorCritic, dtype: torch.dtype | None = None
) -> Callable[[np.ndarray], np.ndarray]:
    """obs (numpy) -> distribution inputs (numpy) for a feed-forward model's acting: numpy for
    float32 MLPs whose outputs are all head outputs, a `CastPolicy` where `dtype` (bfloat16) is
    given and the model `acts_in_bfloat16`, torch otherwise."""
    if model.state_size:
        raise ValueError("a recurrent model acts through recurrent_policy")
    if dtype is not None and model.acts_in_bfloat16:
        return CastPolicy(model, dtype)
    if (
        isinstance(model, MLPActorCritic)
        and model.log_std is None
        and model.policy_head.weight.dtype == torch.float32
    ):
        return NumpyPolicy(model)

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model.policy_logits(torch.from_numpy(obs)).numpy()

    return act


def recurrent_policy(
    model: ActorCritic,
) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(obs, state) -> (distribution inputs, next state), numpy in and out, for acting."""

    def act(obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            outputs, after = model.act(torch.from_numpy(obs), torch.from_numpy(state))
            return outputs.numpy(), after.numpy()

    return act


def carried_state(
    model: ActorCritic,
) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None:
    """(state, actions, rewards) -> state, numpy, for a model that carries its previous action
    and reward in its state (None for any other)."""
    if not model.uses_prev_action_reward:
        return None

    def carry(state: np.ndarray, actions: np.ndarray, rewards: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            after = model.carry(
                torch.from_numpy(state), torch.from_numpy(actions), torch.from_numpy(rewards)
            )
            return after.numpy()

    return carry
