"""The policy as a file a serving stack loads: TorchScript or ONNX, with a JSON sidecar.

The graph takes observations as the env (with the job's wrappers and preprocessing) makes them,
batch first: `obs [N, *obs_shape]`, uint8 frames unscaled (the division by 255 is inside it).
Its outputs are, in order: `action_inputs` (the distribution's inputs: logits, or [mean, log_std]),
`action` (the greedy action: argmax; the squashed Gaussian's mean squashed into the bounds; or the
clipped Gaussian's mean, which the env clips to its bounds), `value`. A recurrent policy adds the
input `state [N, S]` (zeros at an episode's start) and the output `state_out` to feed back on the
next step; with lstmUsePrevActionReward also the inputs `prev_action` and `prev_reward` (the last
step's, zeros at an episode's start).
The sidecar (`FILE.json`) says all of that for the file at hand: shapes, dtypes, the
preprocessing, the action space and how to read an action, the state.
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

import impala_trainer
from impala_trainer.learning.distributions import (
    ActionDistribution,
    Categorical,
    DiagGaussian,
    MultiCategorical,
    SquashedGaussian,
)
from impala_trainer.learning.models import ActorCritic
from impala_trainer.policy.loaded import LoadedPolicy

Format = Literal["onnx", "torchscript"]
FORMATS: tuple[Format, ...] = ("onnx", "torchscript")
OPSET = 18
"""The ONNX opset written (onnxruntime runs it from 1.14 on)."""


class FeedForwardGraph(nn.Module):
    def __init__(self, model: ActorCritic, actions: ActionDistribution) -> None:
        super().__init__()
        self.model = model
        self.actions = actions

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        outputs, value = self.model(obs)
        return outputs, self.actions.mode(outputs), value


class RecurrentGraph(nn.Module):
    def __init__(self, model: ActorCritic, actions: ActionDistribution) -> None:
        super().__init__()
        self.model = model
        self.actions = actions

    def forward(
        self, obs: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._step(obs, state)

    def _step(
        self, obs: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        no_reset = torch.zeros_like(state[:, 0], dtype=torch.bool).unsqueeze(0)
        outputs, values, states = self.model.forward_sequence(obs.unsqueeze(0), state, no_reset)
        return outputs[0], self.actions.mode(outputs[0]), values[0], states[0]


class PrevActionRewardGraph(RecurrentGraph):
    def forward(  # type: ignore[override]  # two inputs more, by design
        self,
        obs: torch.Tensor,
        state: torch.Tensor,
        prev_action: torch.Tensor,
        prev_reward: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._step(obs, self.model.carry(state, prev_action, prev_reward))


def policy_graph(policy: LoadedPolicy) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The module to export (a frozen copy of the policy's network: outputs that need no
    gradients) and example inputs by name (a batch of 2, zeros)."""
    model, dist = copy.deepcopy(policy.model).requires_grad_(False), policy.actions
    obs = torch.zeros(2, *policy.obs_shape, dtype=_torch_dtype(policy.obs_dtype))
    if not model.state_size:
        return FeedForwardGraph(model, dist).eval(), {"obs": obs}
    inputs = {"obs": obs, "state": model.initial_state(2)}
    if not model.uses_prev_action_reward:
        return RecurrentGraph(model, dist).eval(), inputs
    prev_action = torch.zeros(2, *dist.action_shape, dtype=_torch_dtype(dist.action_dtype))
    inputs |= {"prev_action": prev_action, "prev_reward": torch.zeros(2)}
    return PrevActionRewardGraph(model, dist).eval(), inputs


def _torch_dtype(dtype: Any) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype


def output_names(policy: LoadedPolicy) -> list[str]:
    names = ["action_inputs", "action", "value"]
    return [*names, "state_out"] if policy.model.state_size else names


def export_policy(policy: LoadedPolicy, fmt: Format, path: Path) -> Path:
    """Write the policy to `path` in `fmt` and its sidecar to `path` + `.json`; returns the
    sidecar's path."""
    graph, inputs = policy_graph(policy)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        if fmt == "torchscript":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TorchScript's maintenance-mode notices
                traced = torch.jit.trace(graph, tuple(inputs.values()), check_trace=False)  # type: ignore[no-untyped-call]
            traced.save(str(path))
        elif fmt == "onnx":
            _export_onnx(graph, inputs, output_names(policy), path)
        else:
            raise ValueError(f"format must be one of {FORMATS}, not {fmt!r}")
    sidecar = path.with_name(path.name + ".json")
    sidecar.write_text(json.dumps(policy_metadata(policy, fmt, inputs), indent=2) + "\n")
    return sidecar


def _export_onnx(
    graph: nn.Module, inputs: dict[str, torch.Tensor], outputs: list[str], path: Path
) -> None:
    batch = torch.export.Dim("batch", min=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            graph,
            tuple(inputs.values()),
            dynamo=True,
            input_names=list(inputs),
            output_names=outputs,
            opset_version=OPSET,
            dynamic_shapes={name: {0: batch} for name in inputs},
            external_data=False,
            verbose=False,
        )
    assert program is not None
    program.save(str(path))


def _action_metadata(dist: ActionDistribution) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "space": dist.space_name,
        "distribution": type(dist).__name__,
        "inputs_per_row": dist.num_inputs,
        "stored_shape": list(dist.action_shape),
    }
    if isinstance(dist, Categorical):
        meta["greedy"] = "argmax of action_inputs"
    elif isinstance(dist, MultiCategorical):
        meta["greedy"] = "argmax of each component's slice of action_inputs"
        meta["components"] = list(dist.nvec)
        meta["env_shape"] = list(dist.env_shape)
    elif isinstance(dist, SquashedGaussian):
        meta["greedy"] = (
            "the `action` output: tanh of the mean, action_inputs[:, :dim], scaled into [low, high]"
        )
        meta["sampling"] = (
            "low + (tanh(mean + exp(clamp(log_std, -20, 2)) * N(0, 1)) + 1) / 2 * (high - low), "
            "log_std the second half"
        )
        meta["low"] = dist.low.tolist()
        meta["high"] = dist.high.tolist()
        meta["env_shape"] = list(dist.env_shape)
    elif isinstance(dist, DiagGaussian):
        meta["greedy"] = "the mean, action_inputs[:, :dim], clipped to [low, high] at the env"
        meta["sampling"] = "mean + exp(clamp(log_std, -20, 2)) * N(0, 1), log_std the second half"
        meta["low"] = dist.low.tolist()
        meta["high"] = dist.high.tolist()
        meta["env_shape"] = list(dist.env_shape)
    return meta


def _observation_metadata(policy: LoadedPolicy) -> dict[str, Any]:
    env = policy.job.spec.env
    meta: dict[str, Any] = {
        "env_id": env.name,
        "shape": list(policy.obs_shape),
        "dtype": str(policy.obs_dtype),
        "scaling": (
            "uint8 frames are passed unscaled: the graph divides by 255"
            if policy.obs_dtype.kind == "u"
            else "none: observations as the env returns them"
        ),
        "wrappers": [w.model_dump(by_alias=True) for w in env.wrappers],
        "env_kwargs": env.kwargs,
    }
    meta["policy"] = policy.policy
    if env.is_pettingzoo:
        meta["multi_agent"] = (
            "the observation of an agent mapped to this policy; an observation Dict with an "
            "action_mask is fed without it (its other entries, or its `observation`), and the "
            "masked actions' action_inputs set to -inf before the argmax"
        )
    if env.is_atari:
        meta["atari_preprocessing"] = {
            "wrapper": "gymnasium AtariPreprocessing + FrameStackObservation",
            "frame_skip": env.frame_skip,
            "max_pool_last_two_frames": True,
            "noop_max": 30,
            "screen_size": 84,
            "grayscale": True,
            "terminal_on_life_loss": False,
            "frame_stack": env.stacked_frames,
            "repeat_action_probability": env.kwargs.get("repeat_action_probability", 0.25),
        }
    return meta


def policy_metadata(
    policy: LoadedPolicy, fmt: Format, inputs: dict[str, torch.Tensor]
) -> dict[str, Any]:
    """The sidecar: everything needed to feed the graph and read an action off it."""
    model, dist = policy.model, policy.actions
    shapes = {
        "action_inputs": ["N", dist.num_inputs],
        "action": ["N", *dist.action_shape],
        "value": ["N"],
        "state_out": ["N", model.state_size],
    }
    recurrent = None
    if model.state_size:
        recurrent = {
            "state_size": model.state_size,
            "initial_state": "zeros, and again wherever an episode ends",
            "prev_action_reward": model.uses_prev_action_reward,
        }
    return {
        "format": fmt,
        "opset": OPSET if fmt == "onnx" else None,
        "producer": f"impalajob {impala_trainer.__version__}",
        "job": policy.job.metadata.name,
        "checkpoint": policy.checkpoint.name,
        "policy_version": policy.policy_version,
        "global_timestep": policy.global_timestep,
        "inputs": [
            {"name": k, "shape": ["N", *v.shape[1:]], "dtype": str(v.dtype).removeprefix("torch.")}
            for k, v in inputs.items()
        ],
        "outputs": [{"name": k, "shape": shapes[k]} for k in output_names(policy)],
        "observation": _observation_metadata(policy),
        "action": _action_metadata(dist),
        "recurrent": recurrent,
    }
