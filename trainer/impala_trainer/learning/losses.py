"""The IMPALA loss: V-trace policy gradient + baseline + entropy bonus, as RLlib's torch policy.

All terms are means over the [T, B] steps, so averaging the gradients of equal column shards
(one per tower) equals the gradient of the whole batch.
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
    truncation_values: torch.Tensor  # [T, B]
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
    """Scalar to backpropagate."""
    stats: torch.Tensor
    """[6] detached: policy_loss, vf_loss, entropy, total_loss, vf_explained_var, mean_rho.
    One tensor so a GPU learner syncs once for all of them."""


STAT_NAMES = ("policy_loss", "vf_loss", "entropy", "total_loss", "vf_explained_var", "mean_rho")


def impala_loss(
    model: torch.nn.Module, batch: BatchTensors, coeffs: LossCoefficients
) -> LossOutput:
    """Forward the model over the batch and build the V-trace loss."""
    T, B = batch.actions.shape
    # One forward over the T*B observations and the B bootstrap observations together.
    obs = torch.cat([batch.obs.reshape(T * B, *batch.obs.shape[2:]), batch.bootstrap_obs])
    logits_all, values_all = model(obs)
    dtype = values_all.dtype
    logits = logits_all[: T * B].view(T, B, -1)  # [T, B, A]
    values = values_all[: T * B].view(T, B)  # [T, B]
    bootstrap_value = values_all[T * B :]  # [B]

    # Time limits are not terminal: fold gamma * V(final obs) into the reward and cut the trace.
    truncated = batch.truncateds.to(dtype)
    rewards = batch.rewards.to(dtype) + coeffs.gamma * truncated * batch.truncation_values.to(dtype)
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

    policy_loss = -(target_logp * returns.pg_advantages).mean()
    value_error = returns.vs - values
    vf_loss = 0.5 * value_error.pow(2).mean()
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    total_loss = policy_loss + coeffs.vf_loss_coeff * vf_loss - coeffs.entropy_coeff * entropy

    with torch.no_grad():
        explained_var = 1.0 - (returns.vs - values).var() / returns.vs.var().clamp(min=1e-8)
        stats = torch.stack(
            [
                policy_loss.detach(),
                vf_loss.detach(),
                entropy.detach(),
                total_loss.detach(),
                explained_var.clamp(min=-1.0),
                log_rhos.exp().mean(),
            ]
        )
    return LossOutput(total_loss=total_loss, stats=stats)
