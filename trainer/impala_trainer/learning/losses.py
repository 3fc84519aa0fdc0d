"""The IMPALA loss: V-trace policy gradient + baseline + entropy bonus, as RLlib's torch policy.

Every term is a sum over the [T, B] steps, as in the paper's implementation (scalable_agent) and
RLlib's IMPALA policy (the old API stack that LearnerThread and MultiGPULearnerThread belong to):
with sums, RLlib's `gradClip: 40` engages as it does there, and RMSProp's `epsilon: 0.1` is small
against the squared gradients, as the paper's Atari settings intend. (A mean would divide the
gradient by T*B: clipping then never engages and RMSProp turns into tiny SGD steps; that is what
kept a Pong policy uniform for 1.3M steps.) Summing also makes data-parallel towers exact: the
gradient of the whole batch is the sum of the shards' gradients.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from impala_trainer.learning import vtrace


class BatchTensors(NamedTuple):
    """A TrainBatch as tensors on one device (see sample_batch.TrainBatch for the fields)."""

    obs: torch.Tensor  # [T, B, *obs_shape]
    actions: torch.Tensor  # [T, B] int64
    behaviour_logits: torch.Tensor  # [T, B, A]
    rewards: torch.Tensor  # [T, B]
    terminateds: torch.Tensor  # [T, B] bool
    truncateds: torch.Tensor  # [T, B] bool
    final_obs: torch.Tensor  # [K, *obs_shape] where K episodes were cut by a time limit
    final_steps: torch.Tensor  # [K, 2] int64 (t, b) of each final_obs row
    bootstrap_obs: torch.Tensor  # [B, *obs_shape]

    @property
    def env_steps(self) -> int:
        return int(self.actions.shape[0] * self.actions.shape[1])


class LossCoefficients(NamedTuple):
    gamma: float
    vf_loss_coeff: float
    entropy_coeff: float
    clip_rho_threshold: float | None
    clip_pg_rho_threshold: float | None


class LossOutput(NamedTuple):
    total_loss: torch.Tensor
    """policy_loss + vfLossCoeff * vf_loss: what one optimiser backpropagates."""
    policy_total: torch.Tensor
    """policy_loss - entropyCoeff * entropy: the policy optimiser's loss when the value
    function has its own optimiser (`separateVfOptimizer`), which then steps on `vf_loss` alone."""
    vf_loss: torch.Tensor
    stats: torch.Tensor
    """[6] detached: policy_loss, vf_loss (sums), entropy (mean per step), total_loss,
    vf_explained_var, mean_rho. One tensor so a GPU learner syncs once for all of them."""


STAT_NAMES = ("policy_loss", "vf_loss", "entropy", "total_loss", "vf_explained_var", "mean_rho")
SUMMED_STATS = (True, True, False, True, False, False)
"""Which stats add up over column shards (the others are per-step means)."""


def impala_loss(
    model: torch.nn.Module, batch: BatchTensors, coeffs: LossCoefficients
) -> LossOutput:
    """Forward the model over the batch and build the V-trace loss."""
    T, B = batch.actions.shape
    # One forward over the T*B observations, the B bootstrap observations and the K final
    # observations of time-limited episodes together.
    obs = torch.cat(
        [batch.obs.reshape(T * B, *batch.obs.shape[2:]), batch.bootstrap_obs, batch.final_obs]
    )
    logits_all, values_all = model(obs)
    dtype = values_all.dtype
    logits = logits_all[: T * B].view(T, B, -1)  # [T, B, A]
    values = values_all[: T * B].view(T, B)  # [T, B]
    bootstrap_value = values_all[T * B : T * B + B]  # [B]

    # Time limits are not terminal: fold gamma * V(final obs) into the reward and cut the trace.
    # V is the current value function, as at fragment ends, not the one that sampled the data:
    # a value the behaviour policy computed would go stale over SGD passes and replays.
    rewards = batch.rewards.to(dtype)
    if batch.final_steps.shape[0]:
        t, b = batch.final_steps.unbind(1)
        final_values = values_all[T * B + B :].detach()
        rewards = rewards.index_put((t, b), coeffs.gamma * final_values, accumulate=True)
    done = torch.logical_or(batch.terminateds, batch.truncateds)
    discounts = (~done).to(dtype) * coeffs.gamma

    log_probs = F.log_softmax(logits, dim=-1)  # [T, B, A]
    target_logp = log_probs.gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)  # [T, B]
    behaviour_logp = vtrace.action_log_probs(batch.behaviour_logits.to(dtype), batch.actions)
    log_rhos = target_logp.detach() - behaviour_logp
    returns = vtrace.from_importance_weights(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values.detach(),
        bootstrap_value=bootstrap_value.detach(),
        clip_rho_threshold=coeffs.clip_rho_threshold,
        clip_pg_rho_threshold=coeffs.clip_pg_rho_threshold,
    )

    policy_loss = -(target_logp * returns.pg_advantages).sum()
    value_error = returns.vs - values
    vf_loss = 0.5 * value_error.pow(2).sum()
    entropy_sum = -(log_probs.exp() * log_probs).sum()
    policy_total = policy_loss - coeffs.entropy_coeff * entropy_sum
    total_loss = policy_total + coeffs.vf_loss_coeff * vf_loss

    with torch.no_grad():
        explained_var = 1.0 - (returns.vs - values).var() / returns.vs.var().clamp(min=1e-8)
        stats = torch.stack(
            [
                policy_loss.detach(),
                vf_loss.detach(),
                entropy_sum.detach() / (T * B),
                total_loss.detach(),
                explained_var.clamp(min=-1.0),
                log_rhos.exp().mean(),
            ]
        )
    return LossOutput(total_loss, policy_total, vf_loss, stats)


def backward(model: torch.nn.Module, out: LossOutput, separate_vf_optimizer: bool) -> None:
    """Backpropagate `out` into `model`'s parameters as the optimiser(s) will step on them.

    With a separate value optimiser (RLlib's `_separate_vf_optimizer`) the value parameters get
    the gradient of `vf_loss` alone and every other parameter that of `policy_total` alone, so a
    trunk shared with the value head (the CNN) is shaped by the policy loss only, as in RLlib.
    """
    if not separate_vf_optimizer:
        out.total_loss.backward()  # type: ignore[no-untyped-call]
        return
    vf_params = list(model.value_function_parameters())  # type: ignore[operator]
    out.vf_loss.backward(inputs=vf_params, retain_graph=True)  # type: ignore[no-untyped-call]
    out.policy_total.backward()  # type: ignore[no-untyped-call]
