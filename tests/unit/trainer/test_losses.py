"""The IMPALA loss: gradient directions, truncation handling, sum reduction, the separate value
optimiser's gradients."""

from __future__ import annotations

import numpy as np
import torch

from impala_trainer.job.spec import ModelSpec
from impala_trainer.learning.learner import batch_to_tensors
from impala_trainer.learning.losses import (
    STAT_NAMES,
    SUMMED_STATS,
    LossCoefficients,
    backward,
    impala_loss,
)
from impala_trainer.learning.models import build_model
from impala_trainer.rollouts.batches import TrainBatch, slice_columns
from tests.unit.trainer.test_learner import make_batch, single_torch_thread  # noqa: F401

CPU = torch.device("cpu")


def coeffs(vf: float = 0.5, ent: float = 0.01, gamma: float = 0.99) -> LossCoefficients:
    return LossCoefficients(gamma, vf, ent, 1.0, 1.0)


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelSpec(hidden=[16]), (4,), 2).double()


def loss_of(m: torch.nn.Module, batch: TrainBatch, c: LossCoefficients) -> torch.Tensor:
    return impala_loss(m, batch_to_tensors(batch, CPU), c).total_loss


def sgd_step(m: torch.nn.Module, loss: torch.Tensor, lr: float) -> None:
    m.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in m.parameters():
            if p.grad is not None:
                p -= lr * p.grad


def test_policy_gradient_raises_log_prob_of_advantaged_action() -> None:
    batch = make_batch(T=6, B=8, seed=1)
    batch.actions[:] = 0
    batch.rewards[:] = 1.0  # every step of action 0 pays: positive advantages
    batch.behaviour_logits[:] = 0.0
    m = model()
    tensors = batch_to_tensors(batch, CPU)
    obs = tensors.obs.reshape(-1, 4)
    before = m(obs)[0].log_softmax(-1)[:, 0]
    sgd_step(m, loss_of(m, batch, coeffs(vf=0.0, ent=0.0)), lr=0.1)
    after = m(obs)[0].log_softmax(-1)[:, 0]
    assert (after > before).all()


def test_entropy_bonus_raises_entropy() -> None:
    batch = make_batch(seed=2)
    batch.rewards[:] = 0.0
    m = model()
    with torch.no_grad():
        m.policy_head.weight.mul_(300)  # start from a peaked policy

    def entropy() -> float:
        logp = m(batch_to_tensors(batch, CPU).obs.reshape(-1, 4))[0].log_softmax(-1)
        return float(-(logp.exp() * logp).sum(-1).mean().detach())

    before = entropy()
    c = LossCoefficients(0.99, 0.0, 1.0, 1.0, 1.0)
    out = impala_loss(m, batch_to_tensors(batch, CPU), c)
    m.zero_grad()
    (out.total_loss - out.stats[0]).backward()  # the entropy term only (policy loss detached)
    with torch.no_grad():
        for p in m.parameters():
            if p.grad is not None:
                p -= 0.01 * p.grad
    assert entropy() > before


def test_truncation_bootstraps_from_the_truncation_value() -> None:
    """A truncated step equals a terminated step whose reward includes gamma * V(final obs)."""
    gamma = 0.9
    truncated = make_batch(T=5, B=3, seed=3)
    truncated.terminateds[:] = False
    truncated.truncateds[:] = False
    truncated.truncateds[2, 1] = True
    truncated.truncation_values[:] = 0.0
    truncated.truncation_values[2, 1] = 7.0
    terminated = make_batch(T=5, B=3, seed=3)
    terminated.terminateds[:] = False
    terminated.truncateds[:] = False
    terminated.terminateds[2, 1] = True
    terminated.rewards[2, 1] += gamma * 7.0
    m = model()
    c = coeffs(gamma=gamma)
    torch.testing.assert_close(loss_of(m, truncated, c), loss_of(m, terminated, c))
    # ...and differs from ignoring the truncation value.
    ignored = make_batch(T=5, B=3, seed=3)
    ignored.terminateds[:] = False
    ignored.truncateds[:] = False
    ignored.terminateds[2, 1] = True
    assert not torch.allclose(loss_of(m, truncated, c), loss_of(m, ignored, c))


def test_loss_is_the_sum_over_column_shards() -> None:
    """Sum reduction (RLlib's IMPALA policy, the paper): batch loss = sum of its shards' losses."""
    batch = make_batch(T=7, B=6, seed=4)
    m = model()
    c = coeffs()
    whole = loss_of(m, batch, c)
    shards = [loss_of(m, slice_columns(batch, i, i + 2), c) for i in (0, 2, 4)]
    torch.testing.assert_close(whole, sum(shards))


def test_loss_terms_are_sums_over_steps() -> None:
    """Doubling the batch (the same columns twice) doubles every summed term."""
    batch = make_batch(T=5, B=3, seed=5)
    doubled = TrainBatch(
        **{
            name: np.concatenate([getattr(batch, name)] * 2, axis=0 if name in (
                "bootstrap_obs", "policy_versions") else 1)
            for name in ("obs", "actions", "behaviour_logits", "rewards", "terminateds",
                         "truncateds", "truncation_values", "bootstrap_obs", "policy_versions")
        }
    )
    m = model()
    one = impala_loss(m, batch_to_tensors(batch, CPU), coeffs()).stats
    two = impala_loss(m, batch_to_tensors(doubled, CPU), coeffs()).stats
    for name, summed, a, b in zip(STAT_NAMES, SUMMED_STATS, one, two, strict=True):
        torch.testing.assert_close(b, 2 * a if summed else a, msg=name)


def test_separate_value_optimiser_backprops_each_loss_into_its_own_parameters() -> None:
    """RLlib's _separate_vf_optimizer: the value parameters get d(vf_loss) alone (no
    vfLossCoeff), the others d(policy loss - entropy) alone."""
    batch = batch_to_tensors(make_batch(seed=6), CPU)
    m = model()
    c = coeffs(vf=0.5)
    backward(m, impala_loss(m, batch, c), separate_vf_optimizer=True)
    got = {name: p.grad.clone() for name, p in m.named_parameters()}
    vf_names = {n for n, p in m.named_parameters() if any(p is q for q in
                m.value_function_parameters())}
    m.zero_grad()
    impala_loss(m, batch, c).vf_loss.backward()
    vf_grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    impala_loss(m, batch, c).policy_total.backward()
    pi_grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    assert vf_names and set(got) == vf_names | set(pi_grads)
    for name, grad in got.items():
        torch.testing.assert_close(grad, vf_grads[name] if name in vf_names else pi_grads[name])


def test_stats_are_finite_and_named() -> None:
    out = impala_loss(model(), batch_to_tensors(make_batch(), CPU), coeffs())
    assert out.stats.shape == (len(STAT_NAMES),)
    assert torch.isfinite(out.stats).all()
    stats = dict(zip(STAT_NAMES, out.stats.tolist(), strict=True))
    assert stats["total_loss"] == np.float64(out.total_loss.item())
    assert 0.0 < stats["entropy"] <= np.log(2) + 1e-9
