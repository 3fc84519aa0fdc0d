"""The network a spec asks for (`model.type`: auto, mlp, cnn, resnet, custom; `useLstm`), and the
check that a model of your own keeps the contract of `models.ActorCritic` (run once on two zero
observations, so a bad model fails validation, not the run).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from impala_api.spec import ModelSpec
from impala_trainer.learning import popart
from impala_trainer.learning.distributions import ActionDistribution, as_distribution
from impala_trainer.learning.models import (
    ActorCritic,
    ImpalaShallowCNN,
    MLPActorCritic,
    MLPTorso,
    RecurrentActorCritic,
    ResNetTorso,
    ShallowCNNTorso,
    Torso,
    TorsoActorCritic,
)
from impala_trainer.user_code import UserCodeError, resolve

CNN_MIN_SIDE = 20
"""The smallest side the shallow CNN's convolutions take (8x8 stride 4, then 4x4 stride 2)."""


def build_model(
    model: ModelSpec, obs_shape: tuple[int, ...], actions: ActionDistribution | int
) -> ActorCritic:
    """The network the spec asks for; `type: auto` is the CNN for [C, H, W] frames of at least
    CNN_MIN_SIDE a side, else the MLP (a board game's 3x3x2 observation is no image).

    For the CNNs, `model.hidden` is the fully connected part after the convolutions (the paper
    uses one layer of 256). `useLstm` puts an LSTM core between any built-in torso and the heads.
    """
    built = _network(model, tuple(obs_shape), as_distribution(actions))
    if model.popart:
        popart.attach(built)
    return built


def _network(model: ModelSpec, obs_shape: tuple[int, ...], dist: ActionDistribution) -> ActorCritic:
    if model.type == "custom":
        return _custom_model(model, obs_shape, dist)
    kind = model.type
    if kind == "auto":
        frames = len(obs_shape) == 3 and min(obs_shape[1:]) >= CNN_MIN_SIDE
        kind = "cnn" if frames else "mlp"
    if kind in ("cnn", "resnet") and len(obs_shape) != 3:
        raise ValueError(f"model.type {kind} needs [C, H, W] observations, got {obs_shape}")
    hidden, free = list(model.hidden), model.free_log_std
    if model.use_lstm:
        torso: Torso
        if kind == "cnn":
            torso = ShallowCNNTorso(obs_shape, hidden)
        elif kind == "resnet":
            torso = ResNetTorso(obs_shape, hidden)
        else:
            torso = MLPTorso(math.prod(obs_shape), hidden, model.activation)
        return RecurrentActorCritic(
            torso, model.lstm_cell_size, dist, free, model.lstm_use_prev_action_reward
        )
    if kind == "cnn":
        return ImpalaShallowCNN(obs_shape, dist, hidden, free)
    if kind == "resnet":
        return TorsoActorCritic(ResNetTorso(obs_shape, hidden), dist, free)
    return MLPActorCritic(math.prod(obs_shape), dist, hidden, model.activation, free)


def _custom_model(
    model: ModelSpec, obs_shape: tuple[int, ...], dist: ActionDistribution
) -> ActorCritic:
    assert model.import_path is not None  # the spec requires it with type custom
    cls = resolve(model.import_path, "import")
    if not (isinstance(cls, type) and issubclass(cls, ActorCritic)):
        raise UserCodeError(
            "import",
            f"{model.import_path} must be a subclass of "
            "impala_trainer.learning.models.ActorCritic (docs/models.md)",
        )
    try:
        built: ActorCritic = cls(obs_shape, dist.num_inputs, **model.config)  # type: ignore[call-arg]
    except Exception as err:  # the user's constructor may raise anything
        raise UserCodeError(
            "config",
            f"{model.import_path}(obs_shape={obs_shape}, num_outputs={dist.num_inputs}, "
            f"**config) failed: {type(err).__name__}: {err}",
        ) from err
    return built


def model_problem(
    model: ModelSpec,
    obs_shape: tuple[int, ...],
    obs_dtype: np.dtype,
    actions: ActionDistribution,
    separate_vf_optimizer: bool = False,
) -> tuple[str, str] | None:
    """Why the model cannot train on these spaces, as (its field under spec, the reason), from
    building it and running it once on two zero observations; None when it fits."""
    try:
        built = build_model(model, obs_shape, actions)
    except UserCodeError as err:
        return f"model.{err.field}", str(err)
    except ValueError as err:
        field = next((f for f in ("freeLogStd", "popart") if f in str(err)), "type")
        return f"model.{field}", str(err)
    where = "model.import" if model.type == "custom" else "model"
    try:
        _check_contract(built, obs_shape, obs_dtype, actions.num_inputs)
        if separate_vf_optimizer:
            list(built.value_function_parameters())
    except Exception as err:  # whatever the model raises, it breaks the contract
        return where, f"{type(built).__name__} breaks the model interface: {err}"
    return None


def _check_contract(
    model: ActorCritic, obs_shape: tuple[int, ...], obs_dtype: np.dtype, num_outputs: int
) -> None:
    obs = torch.from_numpy(np.zeros((1, 2, *obs_shape), obs_dtype))
    state = model.initial_state(2)
    if tuple(state.shape) != (2, model.state_size):
        raise ValueError(f"initial_state(2) has shape {tuple(state.shape)}, not (2, state_size)")
    with torch.no_grad():
        if model.state_size:
            outputs, values, states = model.forward_sequence(
                obs, state, torch.zeros(1, 2, dtype=torch.bool)
            )
            want_states = (1, 2, model.state_size)
            if tuple(states.shape) != want_states:
                raise ValueError(
                    f"forward_sequence states {tuple(states.shape)}, not {want_states}"
                )
            outputs, values = outputs[0], values[0]
        else:
            outputs, values = model(obs[0])
    if tuple(outputs.shape) != (2, num_outputs):
        raise ValueError(
            f"outputs for 2 observations have shape {tuple(outputs.shape)}, not (2, {num_outputs})"
        )
    if tuple(values.shape) != (2,):
        raise ValueError(f"values for 2 observations have shape {tuple(values.shape)}, not (2,)")
