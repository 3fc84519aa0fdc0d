"""The IMPALA loss: V-trace policy gradient + baseline + entropy bonus, as RLlib's torch policy.

Every term is a sum over the [T, B] steps, as in the paper's implementation (scalable_agent) and
RLlib's IMPALA policy (the old API stack that LearnerThread and MultiGPULearnerThread belong to):
with sums, RLlib's `gradClip: 40` engages as it does there, and RMSProp's `epsilon: 0.1` is small
against the squared gradients, as the paper's Atari settings intend. (A mean would divide the
gradient by T*B: clipping then never engages and RMSProp turns into tiny SGD steps, and a Pong
policy trained so is still uniform after 1.3M steps.) Summing also makes data-parallel towers
exact: the gradient of the whole batch is the sum of the shards' gradients.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch

from impala_trainer.learning import popart, vtrace
from impala_trainer.learning.distributions import MASKED_LOGIT, ActionDistribution, Categorical
from impala_trainer.learning.models import ActorCritic
from impala_trainer.learning.precision import autocast


class BatchTensors(NamedTuple):
    """A TrainBatch as tensors on one device (see sample_batch.TrainBatch for the fields)."""

    obs: torch.Tensor  # [T, B, *obs_shape]
    actions: torch.Tensor  # [T, B, *action_shape]
    behaviour_logits: torch.Tensor  # [T, B, D] the acting policy's distribution inputs
    rewards: torch.Tensor  # [T, B]
    terminateds: torch.Tensor  # [T, B] bool
    truncateds: torch.Tensor  # [T, B] bool
    final_obs: torch.Tensor  # [K, *obs_shape] where K episodes were cut by a time limit
    final_steps: torch.Tensor  # [K, 2] int64 (t, b) of each final_obs row
    bootstrap_obs: torch.Tensor  # [B, *obs_shape]
    state_in: torch.Tensor  # [B, S] recurrent state at each column's first step (S = 0)
    action_mask: torch.Tensor = torch.zeros((0, 0, 0), dtype=torch.bool)
    """[T, B, A] the actions each step allowed; empty where the env masks none."""

    @property
    def env_steps(self) -> int:
        return int(self.rewards.shape[0] * self.rewards.shape[1])


class LossCoefficients(NamedTuple):
    gamma: float
    vf_loss_coeff: float
    entropy_coeff: float
    clip_rho_threshold: float | None
    clip_pg_rho_threshold: float | None
    surrogate_clip: float | None = None
    """training.surrogateClip: the policy loss as APPO's clipped surrogate (None: V-trace's)."""


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
    target_moments: torch.Tensor | None
    """[2] detached: the mean and the mean square of the batch's V-trace targets (what a
    PopArt head's statistics move towards); None for a model without one."""


STAT_NAMES = ("policy_loss", "vf_loss", "entropy", "total_loss", "vf_explained_var", "mean_rho")
SUMMED_STATS = (True, True, False, True, False, False)
"""Which stats add up over column shards (the others are per-step means)."""


class _Forward(NamedTuple):
    outputs: torch.Tensor  # [T, B, D]
    values: torch.Tensor  # [T, B]
    bootstrap_value: torch.Tensor  # [B]
    final_values: torch.Tensor  # [K], detached


def model_inputs(
    model: ActorCritic, batch: BatchTensors, autocast_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The observations one forward over `batch` reads, in one tensor, as the model prepares them
    (`ActorCritic.prepare_observations`): feed-forward, the T*B steps, the B bootstrap
    observations and the K final ones of time-limited episodes, [T*B + B + K, *obs_shape];
    recurrent, [T + 1, B, *obs_shape] with the bootstrap step last (the final observations go
    through the model on their own).

    The concatenation and the preparation (for frames a uint8 -> float channels-last copy) are
    the same on every SGD pass over a batch, so the learner makes this once per batch. It is
    made under the forward's autocast (`autocast_dtype`), so a model may prepare its input in
    the dtype its first layer computes in (the built-in convolutional ones do)."""
    T, B = batch.rewards.shape
    shape = batch.obs.shape[2:]
    with autocast(batch.rewards.device, autocast_dtype):
        if model.state_size:
            obs = torch.cat([batch.obs, batch.bootstrap_obs.unsqueeze(0)])
            prepared = model.prepare_observations(obs.reshape((T + 1) * B, *shape))
            return prepared.reshape(T + 1, B, *shape)
        obs = torch.cat([batch.obs.reshape(T * B, *shape), batch.bootstrap_obs, batch.final_obs])
        return model.prepare_observations(obs)


def _feed_forward(model: ActorCritic, batch: BatchTensors, inputs: torch.Tensor) -> _Forward:
    T, B = batch.rewards.shape
    # One forward over the T*B observations, the B bootstrap observations and the K final
    # observations of time-limited episodes together.
    outputs, values = model(inputs)
    return _Forward(
        outputs[: T * B].view(T, B, -1),
        values[: T * B].view(T, B),
        values[T * B : T * B + B],
        values[T * B + B :].detach(),
    )


def _recurrent(model: ActorCritic, batch: BatchTensors, inputs: torch.Tensor) -> _Forward:
    T, B = batch.rewards.shape
    # Unroll T + 1 steps (the bootstrap observation last) from each column's first state,
    # zeroing the state after every step that ended an episode, as the worker did.
    done = torch.logical_or(batch.terminateds, batch.truncateds)
    resets = torch.cat([done.new_zeros(1, B), done])
    if model.uses_prev_action_reward:
        # The state after step t carries action t and reward t, as the worker's `carry` wrote.
        outputs, values, states = model.forward_sequence(
            inputs, batch.state_in, resets, batch.actions, batch.rewards
        )
    else:
        outputs, values, states = model.forward_sequence(inputs, batch.state_in, resets)
    final_values = values.new_zeros(0)
    if batch.final_steps.shape[0]:
        # A cut episode's final observation is scored from the state its last step left.
        t, b = batch.final_steps.unbind(1)
        k = batch.final_obs.shape[0]
        with torch.no_grad():
            _, final, _ = model.forward_sequence(
                batch.final_obs.unsqueeze(0), states[t, b], done.new_zeros(1, k)
            )
        final_values = final[0]
    return _Forward(outputs[:T], values[:T], values[T], final_values)


def impala_loss(
    model: ActorCritic,
    batch: BatchTensors,
    coeffs: LossCoefficients,
    dist: ActionDistribution | None = None,
    autocast_dtype: torch.dtype | None = None,
    inputs: torch.Tensor | None = None,
) -> LossOutput:
    """Forward the model over the batch and build the V-trace loss (`dist`: Categorical over the
    model's outputs when omitted; `inputs`: `model_inputs(model, batch)`, made here when omitted).

    With `autocast_dtype` (learner.precision) only the model's forward runs under autocast; its
    outputs come back to float32 before the log-probabilities, V-trace and the loss, whose sums
    over a batch bf16's 8-bit mantissa would round away."""
    T, B = batch.rewards.shape
    if inputs is None:
        inputs = model_inputs(model, batch, autocast_dtype)
    with autocast(batch.rewards.device, autocast_dtype):
        forward = _recurrent if model.state_size else _feed_forward
        fwd = forward(model, batch, inputs)
    if autocast_dtype is not None:
        fwd = _Forward(*(t.float() for t in fwd))
    fwd = _masked(fwd, batch.action_mask)
    dist = dist or Categorical(fwd.outputs.shape[-1])
    values = fwd.values
    dtype = values.dtype

    # Time limits are not terminal: fold gamma * V(final obs) into the reward and cut the trace.
    # V is the current value function, as at fragment ends, not the one that sampled the data:
    # a value the behaviour policy computed would go stale over SGD passes and replays.
    rewards = batch.rewards.to(dtype)
    if batch.final_steps.shape[0]:
        t, b = batch.final_steps.unbind(1)
        rewards = rewards.index_put((t, b), coeffs.gamma * fwd.final_values, accumulate=True)
    done = torch.logical_or(batch.terminateds, batch.truncateds)
    discounts = (~done).to(dtype) * coeffs.gamma

    # V-trace needs only the joint log-probability of the action taken, whatever the space.
    behaviour_inputs = batch.behaviour_logits.to(dtype)
    target_logp, entropy = dist.log_prob_and_entropy(  # [T, B] each
        fwd.outputs, batch.actions, behaviour_inputs
    )
    behaviour_logp = dist.log_prob(behaviour_inputs, batch.actions)
    log_rhos = target_logp.detach() - behaviour_logp
    returns = vtrace.from_importance_weights(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values.detach(),
        bootstrap_value=fwd.bootstrap_value.detach(),
        clip_rho_threshold=coeffs.clip_rho_threshold,
        clip_pg_rho_threshold=coeffs.clip_pg_rho_threshold,
    )

    # PopArt: the value error and the advantages in units of the targets' running scale.
    sigma = popart.scale(model)
    policy_loss = _policy_loss(target_logp, behaviour_logp, returns, rewards, discounts,
                               values.detach(), fwd, coeffs, sigma)  # fmt: skip
    value_error = returns.vs - values
    vf_loss = 0.5 * (value_error if sigma is None else value_error / sigma).pow(2).sum()
    entropy_sum = entropy.sum()
    policy_total = policy_loss - coeffs.entropy_coeff * entropy_sum
    total_loss = policy_total + coeffs.vf_loss_coeff * vf_loss

    with torch.no_grad():
        explained_var = 1.0 - (returns.vs - values).var() / returns.vs.var().clamp(min=1e-8)
        target_moments = (
            None if sigma is None else torch.stack([returns.vs.mean(), returns.vs.square().mean()])
        )
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
    return LossOutput(total_loss, policy_total, vf_loss, stats, target_moments)


def _masked(fwd: _Forward, mask: torch.Tensor) -> _Forward:
    """The forward's logits with the actions `mask` forbids at -1e9: the acting policy never gave
    a masked action any probability, nor does this one, in the log-probabilities of the actions
    taken and in the entropy. Unchanged where the env masks none (an empty mask)."""
    if not mask.numel():
        return fwd
    return fwd._replace(outputs=fwd.outputs.masked_fill(~mask, MASKED_LOGIT))


def _policy_loss(
    target_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    returns: vtrace.VTraceReturns,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    values: torch.Tensor,
    fwd: _Forward,
    coeffs: LossCoefficients,
    sigma: torch.Tensor | None,
) -> torch.Tensor:
    """V-trace's policy-gradient loss, or with `coeffs.surrogate_clip` APPO's clipped surrogate
    on the V-trace advantage r_t + gamma v_{t+1} - V(x_t) without its importance weight (the
    surrogate's ratio is that weight); advantages in units of PopArt's sigma where there is
    one. `values` detached."""
    if coeffs.surrogate_clip is None:
        pg_advantages = returns.pg_advantages if sigma is None else returns.pg_advantages / sigma
        return -(target_logp * pg_advantages).sum()
    vs_t_plus_1 = torch.cat([returns.vs[1:], fwd.bootstrap_value.detach().unsqueeze(0)], dim=0)
    advantages = rewards + discounts * vs_t_plus_1 - values
    if sigma is not None:
        advantages = advantages / sigma
    ratio = torch.exp(target_logp - behaviour_logp)
    return -_clipped_surrogate(ratio, advantages, coeffs.surrogate_clip).sum()


def _clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, clip: float) -> torch.Tensor:
    """APPO's surrogate min(r A, clip(r, 1 - clip, 1 + clip) A), r = pi/mu the ratio to the
    behaviour policy. Past the clip in the advantage's direction its gradient is zero: a batch
    that a learner several updates ahead of its actors trains on stops pushing the policy
    further from the one that acted, where V-trace's truncated weight min(1, r) keeps pushing."""
    return torch.minimum(ratio * advantages, ratio.clamp(1.0 - clip, 1.0 + clip) * advantages)


_DISJOINT: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()
"""Per model: whether its policy and value losses reach disjoint parameters (decided on the
model's first batch; a model's graph has the same shape on every batch)."""


def parameters_reached(loss: torch.Tensor) -> set[int]:
    """ids of the leaf tensors (parameters) whose .grad `loss.backward()` would accumulate into:
    a walk of the autograd graph, no computation."""
    reached: set[int] = set()
    seen: set[object] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: a leaf's gradient
        if variable is not None:
            reached.add(id(variable))
        stack.extend(child for child, _ in node.next_functions)
    return reached


def losses_disjoint(model: torch.nn.Module, out: LossOutput) -> bool:
    """Whether the value loss reaches only the value parameters and the policy loss none of
    them (separate towers, as the MLP's), so one backward pass over their sum gives every
    parameter exactly the gradient of its own loss (cached per model)."""
    known = _DISJOINT.get(model)
    if known is None:
        vf_ids = {id(p) for p in model.value_function_parameters()}  # type: ignore[operator]
        known = parameters_reached(out.vf_loss) <= vf_ids and not (
            parameters_reached(out.policy_total) & vf_ids
        )
        _DISJOINT[model] = known
    return known


def backward(model: torch.nn.Module, out: LossOutput, separate_vf_optimizer: bool) -> None:
    """Backpropagate `out` into `model`'s parameters as the optimiser(s) will step on them.

    With a separate value optimiser (RLlib's `_separate_vf_optimizer`) the value parameters get
    the gradient of `vf_loss` alone and every other parameter that of `policy_total` alone, so a
    trunk shared with the value head (the CNN) is shaped by the policy loss only, as in RLlib.
    Where neither loss reaches the other's parameters (the MLP's separate towers) that is one
    pass over their sum: a second backward call cost a CartPole update ~0.1 of its ~1.5 ms.
    """
    if not separate_vf_optimizer:
        out.total_loss.backward()  # type: ignore[no-untyped-call]
        return
    if losses_disjoint(model, out):
        (out.policy_total + out.vf_loss).backward()  # type: ignore[no-untyped-call]
        return
    vf_params = list(model.value_function_parameters())  # type: ignore[operator]
    vf_ids = {id(p) for p in vf_params}
    # `inputs` on both: a policy that reads value features must not add its gradient to them.
    policy_params = [p for p in model.parameters() if id(p) not in vf_ids]
    out.vf_loss.backward(inputs=vf_params, retain_graph=True)  # type: ignore[no-untyped-call]
    out.policy_total.backward(inputs=policy_params)  # type: ignore[no-untyped-call]
