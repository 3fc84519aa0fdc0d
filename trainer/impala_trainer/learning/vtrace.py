"""V-trace off-policy targets (Espeholt et al. 2018, "IMPALA", section 4.1).

Pure functions on time-major tensors: T is the fragment length, B the batch (environments),
A the number of actions. All inputs share one dtype and device; outputs keep them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class VTraceReturns(NamedTuple):
    vs: torch.Tensor
    """[T, B] V-trace value targets v_s."""
    pg_advantages: torch.Tensor
    """[T, B] advantages for the policy gradient: rho_pg_t * (r_t + gamma_t * v_{t+1} - V(x_t))."""


class VTraceFromLogitsReturns(NamedTuple):
    vs: torch.Tensor
    pg_advantages: torch.Tensor
    log_rhos: torch.Tensor
    """[T, B] log pi(a_t|x_t) - log mu(a_t|x_t)."""
    behaviour_action_log_probs: torch.Tensor
    """[T, B] log mu(a_t|x_t)."""
    target_action_log_probs: torch.Tensor
    """[T, B] log pi(a_t|x_t); keeps its graph so a loss can differentiate through it."""


def action_log_probs(policy_logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log softmax(policy_logits)[actions]: [T, B, A] logits and [T, B] actions -> [T, B]."""
    log_probs = F.log_softmax(policy_logits, dim=-1)
    return log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)


def from_logits(
    behaviour_policy_logits: torch.Tensor,
    target_policy_logits: torch.Tensor,
    actions: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
) -> VTraceFromLogitsReturns:
    """V-trace for softmax policies given behaviour and target logits ([T, B, A]).

    The targets themselves carry no gradient; `target_action_log_probs` does (the policy-gradient
    term of the loss is built from it).
    """
    target_action_log_probs = action_log_probs(target_policy_logits, actions)
    behaviour_action_log_probs = action_log_probs(behaviour_policy_logits, actions)
    log_rhos = (target_action_log_probs - behaviour_action_log_probs).detach()
    vtrace_returns = from_importance_weights(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
    )
    return VTraceFromLogitsReturns(
        vs=vtrace_returns.vs,
        pg_advantages=vtrace_returns.pg_advantages,
        log_rhos=log_rhos,
        behaviour_action_log_probs=behaviour_action_log_probs,
        target_action_log_probs=target_action_log_probs,
    )


@torch.no_grad()
def from_importance_weights(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
) -> VTraceReturns:
    """V-trace targets from log importance weights log(pi/mu) of the actions taken.

    Args:
        log_rhos: [T, B] log pi(a_t|x_t) - log mu(a_t|x_t).
        discounts: [T, B] gamma_t; 0 where the episode ended at step t (cuts the trace).
        rewards: [T, B] r_t.
        values: [T, B] V(x_t) under the current value function.
        bootstrap_value: [B] V(x_T), the state after the last step.
        clip_rho_threshold: rho-bar (clip of rho_t in the value target); None disables it.
        clip_pg_rho_threshold: clip of rho_t in the policy-gradient advantage; None disables it.
    """
    if log_rhos.dim() != 2:
        raise ValueError(f"log_rhos must be [T, B], got shape {tuple(log_rhos.shape)}")
    rhos = torch.exp(log_rhos)
    clipped_rhos = rhos if clip_rho_threshold is None else rhos.clamp(max=clip_rho_threshold)
    cs = rhos.clamp(max=1.0)  # c_t = lambda * min(1, rho_t) with lambda = 1

    # [T, B]: V(x_{t+1}), with V(x_T) = bootstrap_value.
    values_t_plus_1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)  # delta_t V

    # v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1})): one fused multiply-add per
    # time step on [B] rows, written straight into the output. The rows come from one unbind
    # each, not an index per step (CartPole's 16 steps: 62 -> 45 us, the same values).
    decay = discounts * cs
    vs_minus_v = torch.empty_like(deltas)
    acc = torch.zeros_like(bootstrap_value)
    for delta, c, out in zip(
        reversed(deltas.unbind(0)),
        reversed(decay.unbind(0)),
        reversed(vs_minus_v.unbind(0)),
        strict=True,
    ):
        acc = torch.addcmul(delta, c, acc, out=out)
    vs = vs_minus_v + values

    vs_t_plus_1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    clipped_pg_rhos = (
        rhos if clip_pg_rho_threshold is None else rhos.clamp(max=clip_pg_rho_threshold)
    )
    pg_advantages = clipped_pg_rhos * (rewards + discounts * vs_t_plus_1 - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)
