"""The `Learner`: one policy's model, optimiser(s) and schedules on one device (the data-parallel
`MultiDeviceLearner` of `towers` builds on it).

It owns the model, the optimiser(s) and the schedules; the learner threads drive them. They are
plain objects (no Ray), so tests and the A3C mode use them directly.
"""

from __future__ import annotations

import pickle
import threading
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from impala_api.spec import ImpalaJobSpec, LearnerSpec, ModelSpec, TrainingSpec
from impala_trainer.batches import TrainBatch
from impala_trainer.learning import optimizers, popart
from impala_trainer.learning.collective import Collective, GradientReducer
from impala_trainer.learning.distributions import ActionDistribution, as_distribution
from impala_trainer.learning.losses import (
    STAT_NAMES,
    BatchTensors,
    LossCoefficients,
    LossOutput,
    backward,
    impala_loss,
    model_inputs,
)
from impala_trainer.learning.model_factory import build_model
from impala_trainer.learning.models import ActorCritic
from impala_trainer.learning.precision import autocast_dtype
from impala_trainer.learning.schedules import make_schedule

# Batches from Ray's object store are read-only numpy; the learner never writes to them, so
# torch.from_numpy's zero-copy view is safe and its warning is noise.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

_FIELDS = BatchTensors._fields


def batch_to_tensors(batch: TrainBatch, device: torch.device) -> BatchTensors:
    """TrainBatch -> tensors on `device`: zero-copy on CPU; pinned, non-blocking copies to CUDA."""
    arrays = {name: getattr(batch, name) for name in _FIELDS}
    actions = arrays["actions"]
    if actions.dtype.kind in "iub" and actions.dtype != np.int64:  # gather indexes with int64
        arrays["actions"] = actions.astype(np.int64)
    if device.type == "cpu":
        return BatchTensors(**{k: torch.from_numpy(a) for k, a in arrays.items()})
    return BatchTensors(
        **{
            k: torch.from_numpy(np.ascontiguousarray(a)).pin_memory().to(device, non_blocking=True)
            for k, a in arrays.items()
        }
    )


def _grads(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The parameters' gradients, after a backward pass has given every one of them one."""
    grads = [p.grad for p in params]
    if any(g is None for g in grads):
        raise RuntimeError("a parameter has no gradient: was backward() run on this model?")
    return grads  # type: ignore[return-value]


def clip_grad_norms(groups: list[list[torch.Tensor]], clip: float | None) -> torch.Tensor:
    """Scale each group's gradients in place to a global norm of at most `clip` (torch's
    `clip_grad_norm_` per group, same arithmetic); returns the norm over all groups, unclipped.

    One `_foreach_norm` over every gradient, not a `clip_grad_norm_` per group (which groups the
    tensors by device and dtype in Python on every call): 27 against 59 us per group on the
    CartPole MLP's six tensors.
    """
    flat = [g for group in groups for g in group]
    if not flat:
        return torch.zeros(())
    norms = torch._foreach_norm(flat)
    group_norms: list[torch.Tensor] = []
    start = 0
    for group in groups:
        stop = start + len(group)
        if stop > start:
            norm: torch.Tensor = torch.linalg.vector_norm(torch.stack(norms[start:stop]))
            group_norms.append(norm)
            if clip is not None:
                coef = (clip / (norm + 1e-6)).clamp_(max=1.0)
                torch._foreach_mul_(group, coef)
        start = stop
    if len(group_norms) == 1:
        return group_norms[0]
    total: torch.Tensor = torch.linalg.vector_norm(torch.stack(group_norms))
    return total


def _make_optimizer(
    params: Iterable[torch.nn.Parameter], training: TrainingSpec, lr: float
) -> torch.optim.Optimizer:
    opt = training.optimizer
    params = list(params)
    eps = opt.epsilon_or_default
    if opt.type == "adam":
        # Fused: one kernel over all the group's tensors. On CPU the foreach path loops over them
        # op by op (with a scalar copy per op): a CartPole MLP's step took 215 us foreach against
        # 80 us fused (torch 2.15).
        return optimizers.Adam(params, lr=lr, eps=eps, fused=True)
    return optimizers.RMSprop(
        params, lr=lr, alpha=opt.decay, momentum=opt.momentum, eps=eps, foreach=True
    )


def _to_cpu(obj: Any) -> Any:
    """Deep copy of a (nested) state dict with every tensor copied to CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _reusable(inputs: torch.Tensor) -> torch.Tensor | None:
    """Model inputs that may serve several passes: not if the model's preparation read
    parameters (each backward frees that graph)."""
    return None if inputs.requires_grad else inputs


class LearnerConfig(NamedTuple):
    """What a policy's learner is built from, and nothing else of the job: the policy's model
    (spec.model, or the policy's own in spec.multiAgent), the job's training and learner
    sections."""

    model: ModelSpec
    training: TrainingSpec
    learner: LearnerSpec

    @classmethod
    def of(cls, spec: ImpalaJobSpec, policy: str | None = None) -> LearnerConfig:
        """The job's config, or (`policy`) that policy's (`ImpalaJobSpec.policy_spec`)."""
        own = spec if policy is None else spec.policy_spec(policy)
        return cls(own.model, own.training, own.learner)


class LearnerPolicy(NamedTuple):
    """A trained policy as a learner builds it: its config, its observations' shape and its
    actions."""

    config: LearnerConfig
    obs_shape: tuple[int, ...]
    actions: ActionDistribution | int


@dataclass(frozen=True)
class LearnerChange:
    """What a running learner takes before its next update (population-based training).

    `state`: another run's learner state of this policy (`Learner.state_dict`), adopted: its
    model (a PopArt head's statistics included) and optimiser state, this learner's own step
    counters kept. `training`: the training section from now on (the live fields
    `impala_api.population.paths.LIVE_FIELDS` differ; the schedules are made again from it).
    `at_version`: take it before the update that follows this policy version, so that every
    learner of a data-parallel group takes it at the same step; None: before the next update.
    """

    state: dict[str, Any] | None = None
    training: TrainingSpec | None = None
    at_version: int | None = None


class Learner:
    """Model, optimiser(s) and schedules on one device; one optimiser step per learn_on_batch."""

    def __init__(
        self,
        config: LearnerConfig,
        obs_shape: tuple[int, ...],
        actions: ActionDistribution | int,
        device: str = "cpu",
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.dist = as_distribution(actions)
        """The action distribution (an int means that many Discrete actions)."""
        self.model: ActorCritic = build_model(config.model, tuple(obs_shape), self.dist).to(
            device=self.device, dtype=dtype
        )
        precision = config.learner.precision
        self.autocast_dtype = (
            autocast_dtype(precision, self.device) if dtype == torch.float32 else None
        )
        """bfloat16 when learner.precision runs the forward and backward under autocast."""
        training = config.training
        self.lr_factor = config.learner.lr_factor
        """learner.lrScaling's factor on every learning rate (1 with one learner)."""
        self.lr_schedule = make_schedule(training.lr_schedule, training.lr)
        self.entropy_schedule = make_schedule(
            training.entropy_coeff_schedule, training.entropy_coeff_or_default
        )
        self.params = list(self.model.parameters())
        if training.separate_vf_optimizer:
            vf_ids = {id(p) for p in self.model.value_function_parameters()}
            self.param_groups = [
                [p for p in self.params if id(p) not in vf_ids],
                [p for p in self.params if id(p) in vf_ids],
            ]
            self.optimizers = [
                _make_optimizer(self.param_groups[0], training, training.lr),
                _make_optimizer(self.param_groups[1], training, training.lr_vf),
            ]
        else:
            self.param_groups = [self.params]
            self.optimizers = [_make_optimizer(self.params, training, training.lr)]
        self.global_timestep = 0
        """Env steps trained so far (RLlib's old-stack schedule clock); the driver sets it, the
        schedules read it."""
        self.policy_version = 0
        """Optimiser steps taken; stamped on broadcast weights."""
        self.collective: Collective | None = None
        """The data-parallel group this learner trains in (learner.replicas > 1; `join`)."""
        self.reducer: GradientReducer | None = None
        """Averages the gradients over `collective`'s group, overlapping backward."""
        # Held while parameters change or are read, so the driver never sees a half-applied step.
        self.lock = threading.Lock()
        # id(batch) -> (batch, its device tensors, its model inputs) while more SGD passes over
        # it are to come (learn_on_batch's `keep`); the batch is held so its id stays its own.
        self._kept: dict[int, tuple[TrainBatch, BatchTensors, torch.Tensor]] = {}
        self._change: LearnerChange | None = None
        """The change `change` queued, taken by the learner thread before an update."""

    # -- changes while it runs ------------------------------------------------------------------

    def change(self, change: LearnerChange) -> None:
        """Queue `change` for the learner's next update (or its `at_version`'s); a change not
        yet taken is replaced. Any thread; the learner thread takes it between two updates."""
        with self.lock:
            self._change = change

    def take_change(self) -> bool:
        """In the learner thread, before an update: apply the queued change when it is due;
        whether one was applied."""
        change = self._change
        if change is None or (change.at_version is not None
                              and self.policy_version < change.at_version):  # fmt: skip
            return False
        self._change = None
        if change.state is not None:
            own = {"policy_version": self.policy_version, "global_timestep": self.global_timestep}
            self.load_state_dict({**change.state, **own})
        if change.training is not None:
            self.set_training(change.training)
        return True

    def set_training(self, training: TrainingSpec) -> None:
        """Train with `training` from the next update on: its learning rates and schedules,
        entropy coefficient, loss weights, clip thresholds and optimiser epsilon. The
        optimiser's state is kept (a loaded optimiser state brings its own epsilon: this sets
        ours again)."""
        self.config = self.config._replace(training=training)
        self.lr_schedule = make_schedule(training.lr_schedule, training.lr)
        self.entropy_schedule = make_schedule(
            training.entropy_coeff_schedule, training.entropy_coeff_or_default
        )
        eps = training.optimizer.epsilon_or_default
        with self.lock:
            for opt in self.optimizers:
                for group in opt.param_groups:
                    group["eps"] = eps

    # -- one optimisation step ------------------------------------------------------------------

    def coefficients(self) -> LossCoefficients:
        """Loss coefficients at the current global_timestep."""
        t = self.config.training
        return LossCoefficients(
            gamma=t.gamma,
            vf_loss_coeff=t.vf_loss_coeff,
            entropy_coeff=self.entropy_schedule(self.global_timestep),
            clip_rho_threshold=t.vtrace_clip_rho_threshold,
            clip_pg_rho_threshold=t.vtrace_clip_pg_rho_threshold,
            surrogate_clip=t.surrogate_clip,
        )

    def join(self, collective: Collective) -> None:
        """Train in `collective`'s group from now on: rank 0's weights replace this learner's
        (DDP's broadcast at construction), and each step averages the group's gradients."""
        self.collective = collective
        self.reducer = GradientReducer(collective, self.params)
        with torch.no_grad(), self.lock:
            collective.broadcast(list(self.model.state_dict().values()))

    def leave_group(self) -> None:
        """Between steps, as the learner thread stops: its last all-reduce
        (`GradientReducer.leave`)."""
        if self.reducer is not None:
            self.reducer.leave()

    def _clip_gradients(self) -> torch.Tensor:
        """Average the gradients over the group (learner.replicas: the buckets backward did not
        start, then all of them waited for), then clip each optimiser's to gradClip (as RLlib,
        and as DDP's averaged gradients are clipped after backward); returns the global norm."""
        if self.reducer is not None:
            self.reducer.finish()
        groups = [[p.grad for p in group if p.grad is not None] for group in self.param_groups]
        return clip_grad_norms(groups, self.config.training.grad_clip)

    def _step(self) -> None:
        lr = self.lr_schedule(self.global_timestep) * self.lr_factor
        self.optimizers[0].param_groups[0]["lr"] = lr
        if len(self.optimizers) > 1:
            # The value optimiser follows the same schedule, scaled to its own lrVf: RLlib's
            # schedule sets every optimiser's rate (which would discard lrVf); a schedule that
            # decays the policy's rate to 10% decays the value function's to 10% too.
            t = self.config.training
            self.optimizers[1].param_groups[0]["lr"] = t.lr_vf * lr / t.lr
        with self.lock:
            for opt in self.optimizers:
                opt.step()
            self.policy_version += 1

    def _update_popart(self, target_moments: torch.Tensor | None) -> None:
        """After a step: a PopArt head's statistics towards the batch's targets (their means
        over the group with learner.replicas, so every learner keeps the same head)."""
        head = popart.head_of(self.model)
        if head is None or target_moments is None:
            return
        moments = target_moments.to(self.params[0].device, torch.float32).clone()
        if self.collective is not None:
            self.collective.average([moments])
        with self.lock:
            head.update(moments[0], moments[1])

    def _stats(
        self, loss_stats: torch.Tensor, gnorm: torch.Tensor, coeffs: LossCoefficients
    ) -> dict[str, float]:
        values: list[float] = torch.cat([loss_stats, gnorm.to(loss_stats).view(1)]).tolist()
        stats = dict(zip((*STAT_NAMES, "grad_gnorm"), values, strict=True))  # one sync above
        stats["cur_lr"] = float(self.optimizers[0].param_groups[0]["lr"])
        stats["entropy_coeff"] = coeffs.entropy_coeff
        return stats

    def zero_grad(self) -> None:
        """Drop gradients (set_to_none: no memset, and the next backward writes fresh)."""
        for p in self.params:
            p.grad = None

    def _inputs(self, batch: TrainBatch, keep: bool) -> tuple[BatchTensors, torch.Tensor]:
        """The batch on the device and its model inputs (`model_inputs`): made on a batch's first
        pass, kept for the next while `keep` says one is coming."""
        kept = self._kept.pop(id(batch), None)
        if kept is not None and kept[0] is batch:
            _, tensors, inputs = kept
        else:
            tensors = batch_to_tensors(batch, self.device)
            inputs = model_inputs(self.model, tensors, self.autocast_dtype)
        if keep and _reusable(inputs) is not None:
            self._kept[id(batch)] = (batch, tensors, inputs)
        return tensors, inputs

    def _backward_on(
        self, batch: TrainBatch, coeffs: LossCoefficients, keep: bool = False
    ) -> LossOutput:
        """Fresh gradients of the loss on `batch` in the parameters' .grad (in a group, their
        buckets' all-reduce started as they come: `_clip_gradients` finishes it)."""
        self.zero_grad()
        tensors, inputs = self._inputs(batch, keep)
        out = impala_loss(self.model, tensors, coeffs, self.dist, self.autocast_dtype, inputs)
        if self.reducer is not None:
            self.reducer.prepare()
        backward(self.model, out, self.config.training.separate_vf_optimizer)
        return out

    def learn_on_batch(self, batch: TrainBatch, keep: bool = False) -> dict[str, float]:
        """One optimiser step on the batch; returns the learner stats.

        `keep`: another pass over this same batch object follows (numSgdIter), so its device
        tensors and prepared observations are kept for it instead of made again."""
        self.take_change()
        coeffs = self.coefficients()
        out = self._backward_on(batch, coeffs, keep)
        gnorm = self._clip_gradients()
        self._step()
        self._update_popart(out.target_moments)
        return self._stats(out.stats, gnorm, coeffs)

    # -- A3C mode -------------------------------------------------------------------------------

    def compute_gradients(self, batch: TrainBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        """Clipped gradients of the loss on `batch` (parameter order), without stepping."""
        coeffs = self.coefficients()
        out = self._backward_on(batch, coeffs)
        gnorm = self._clip_gradients()
        grads = [
            np.zeros(tuple(p.shape), np.float32) if p.grad is None else p.grad.cpu().numpy()
            for p in self.params
        ]
        stats = self._stats(out.stats, gnorm, coeffs)
        stats["batch_count"] = float(batch.env_steps)
        return grads, stats

    def apply_gradients(self, grads: list[np.ndarray]) -> None:
        """One optimiser step with gradients from compute_gradients (of any learner copy)."""
        if len(grads) != len(self.params):
            raise ValueError(f"expected {len(self.params)} gradients, got {len(grads)}")
        for p, g in zip(self.params, grads, strict=True):
            # A copy: arrays from Ray's object store are read-only shared memory.
            p.grad = torch.from_numpy(np.asarray(g)).to(device=p.device, dtype=p.dtype, copy=True)
        self._step()

    # -- weights and checkpoints ----------------------------------------------------------------

    def get_weights(self) -> dict[str, np.ndarray]:
        """A CPU numpy copy of the model's state dict."""
        with self.lock:
            return {
                k: v.detach().to("cpu", copy=True).numpy()
                for k, v in self.model.state_dict().items()
            }

    def pickled_weights(self) -> bytes:
        """get_weights(), pickled (protocol 5) in the same single copy: a broadcast small enough
        to ride inline on the sample requests is serialised once for every rollout actor, not
        by Ray once per request. On the CartPole MLP: 74 us against 65 for get_weights plus
        45 for each request's cloudpickle."""
        with self.lock:
            arrays = {k: v.detach().cpu().numpy() for k, v in self.model.state_dict().items()}
            return pickle.dumps(arrays, protocol=5)

    def write_weights(self, out: Mapping[str, torch.Tensor]) -> int:
        """Copy the state dict into `out` (its keys, shapes and dtypes: views of a shared
        buffer); returns the policy version the copy is of."""
        with self.lock:
            for k, v in self.model.state_dict().items():
                out[k].copy_(v.detach())
            return self.policy_version

    def weights_nbytes(self) -> int:
        """Bytes of the model's state dict (what a broadcast carries)."""
        return sum(v.numel() * v.element_size() for v in self.model.state_dict().values())

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load numpy weights (as from get_weights) into the model."""
        with self.lock:
            self.model.load_state_dict(
                {k: torch.from_numpy(np.asarray(v)) for k, v in weights.items()}
            )

    def state_dict(self) -> dict[str, Any]:
        """Model, optimiser(s), policy_version and global_timestep, as CPU copies."""
        with self.lock:
            return {
                "model": _to_cpu(self.model.state_dict()),
                "optimizers": [_to_cpu(o.state_dict()) for o in self.optimizers],
                "policy_version": self.policy_version,
                "global_timestep": self.global_timestep,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned."""
        with self.lock:
            self.model.load_state_dict(state["model"])
            for opt, opt_state in zip(self.optimizers, state["optimizers"], strict=True):
                opt.load_state_dict(opt_state)
            self.policy_version = int(state["policy_version"])
            self.global_timestep = int(state.get("global_timestep", self.global_timestep))
