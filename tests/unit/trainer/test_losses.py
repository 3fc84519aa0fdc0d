"""The IMPALA loss: gradient directions, truncation handling, sum reduction, the separate value
optimiser's gradients."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from impala_api.spec import ModelSpec
from impala_trainer.batches import TrainBatch, slice_columns
from impala_trainer.learning.learner import batch_to_tensors
from impala_trainer.learning.losses import (
    STAT_NAMES,
    SUMMED_STATS,
    BatchTensors,
    LossCoefficients,
    backward,
    impala_loss,
    losses_disjoint,
    parameters_reached,
)
from impala_trainer.learning.model_factory import build_model
from impala_trainer.learning.models import ActorCritic
from tests.support.learner import make_batch, one_torch_thread

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    """Tiny tensors: intra-op threads only add contention on a shared machine."""
    with one_torch_thread():
        yield


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
    batch.rewards[:] = 10.0  # every step of action 0 pays far above any value: positive advantages
    batch.behaviour_logits[:] = 0.0
    m = model()
    tensors = batch_to_tensors(batch, CPU)
    obs = tensors.obs.reshape(-1, 4)
    before = m(obs)[0].log_softmax(-1)[:, 0]
    sgd_step(m, loss_of(m, batch, coeffs(vf=0.0, ent=0.0)), lr=0.01)
    after = m(obs)[0].log_softmax(-1)[:, 0]
    # A gradient step raises the advantage-weighted sum of log-probs (the loss it descends);
    # single rows may move the other way through the shared weights.
    assert after.mean() > before.mean() + 0.01


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


def _one_truncation(batch: TrainBatch, final_obs: np.ndarray | None) -> TrainBatch:
    """`batch` with no episode end but step (2, 1), cut by a time limit in `final_obs` if given,
    else terminated there."""
    batch.terminateds[:] = False
    batch.truncateds[:] = False
    if final_obs is None:
        batch.terminateds[2, 1] = True
        batch.final_obs, batch.final_steps = batch.final_obs[:0], batch.final_steps[:0]
    else:
        batch.truncateds[2, 1] = True
        batch.final_obs, batch.final_steps = final_obs[None], np.array([[2, 1]], np.int64)
    return batch


def test_truncation_bootstraps_from_the_current_value_of_the_final_obs() -> None:
    """A truncated step equals a terminated step whose reward includes gamma * V(final obs), with
    V the network being trained: after a change of weights the bootstrap follows them (it is not
    a value frozen at sampling time, which would go stale over SGD passes and replays)."""
    gamma = 0.9
    final = np.random.default_rng(9).standard_normal(4).astype(np.float32)
    c = coeffs(gamma=gamma)
    for seed in (0, 1):  # two different networks: each bootstraps from its own value
        m = model(seed)
        value = float(m(torch.from_numpy(final).double()[None])[1].detach())
        truncated = _one_truncation(make_batch(T=5, B=3, seed=3), final)
        terminated = _one_truncation(make_batch(T=5, B=3, seed=3), None)
        terminated.rewards[2, 1] += gamma * value
        torch.testing.assert_close(loss_of(m, truncated, c), loss_of(m, terminated, c))
        # ...and differs from ignoring the truncation value.
        ignored = _one_truncation(make_batch(T=5, B=3, seed=3), None)
        assert not torch.allclose(loss_of(m, truncated, c), loss_of(m, ignored, c))


def test_final_obs_follow_their_columns_through_concat_and_slices() -> None:
    """concat_fragments shifts each fragment's final_steps columns; slice_columns keeps a shard's
    own rows renumbered, so every tower bootstraps the right step."""
    batch = make_batch(T=6, B=8, seed=7)
    batch.truncateds[:] = batch.terminateds[:] = False
    cut = [(0, 1), (3, 5), (5, 6), (2, 7)]
    for t, b in cut:
        batch.truncateds[t, b] = True
    batch.final_steps = np.array(cut, np.int64)
    batch.final_obs = np.arange(4 * 4, dtype=np.float32).reshape(4, 4)
    shard = slice_columns(batch, 4, 8)
    np.testing.assert_array_equal(shard.final_steps, [[3, 1], [5, 2], [2, 3]])
    np.testing.assert_array_equal(shard.final_obs, batch.final_obs[1:])
    assert slice_columns(batch, 2, 4).final_steps.shape == (0, 2)


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
            name: np.concatenate(
                [getattr(batch, name)] * 2,
                axis=0 if name in ("bootstrap_obs", "policy_versions") else 1,
            )
            for name in (
                "obs",
                "actions",
                "behaviour_logits",
                "rewards",
                "terminateds",
                "truncateds",
                "bootstrap_obs",
                "policy_versions",
            )
        },
        final_obs=np.concatenate([batch.final_obs] * 2),
        final_steps=np.concatenate(
            [batch.final_steps, batch.final_steps + np.array([0, batch.num_columns])]
        ),
    )
    assert len(batch.final_steps) > 0, "the batch should exercise time-limit bootstraps"
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
    vf_names = {
        n for n, p in m.named_parameters() if any(p is q for q in m.value_function_parameters())
    }
    m.zero_grad()
    impala_loss(m, batch, c).vf_loss.backward()
    vf_grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    impala_loss(m, batch, c).policy_total.backward()
    pi_grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    assert vf_names and set(got) == vf_names | set(pi_grads)
    for name, grad in got.items():
        torch.testing.assert_close(grad, vf_grads[name] if name in vf_names else pi_grads[name])


class PolicyReadsValueFeatures(ActorCritic):
    """A custom model whose policy head reads the value tower's features: the policy loss
    reaches value parameters, so the separate optimiser must not take one pass over the sum."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.value_trunk = torch.nn.Linear(4, 8)
        self.value_head = torch.nn.Linear(8, 1)
        self.policy_head = torch.nn.Linear(8, 2)

    def value_function_parameters(self) -> Iterator[torch.nn.Parameter]:
        yield from self.value_trunk.parameters()
        yield from self.value_head.parameters()

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.tanh(self.value_trunk(obs.to(self.value_head.weight.dtype)))
        return self.policy_head(features), self.value_head(features).squeeze(-1)


def separately(
    m: torch.nn.Module, batch: BatchTensors, c: LossCoefficients
) -> dict[str, torch.Tensor]:
    """What the separate optimisers want, one loss at a time: d(vf_loss) for the value
    parameters, d(policy_total) for the rest."""
    vf_ids = {id(p) for p in m.value_function_parameters()}
    m.zero_grad()
    impala_loss(m, batch, c).vf_loss.backward()
    want = {n: p.grad.clone() for n, p in m.named_parameters() if id(p) in vf_ids}
    m.zero_grad()
    impala_loss(m, batch, c).policy_total.backward()
    want |= {
        n: p.grad.clone()
        for n, p in m.named_parameters()
        if id(p) not in vf_ids and p.grad is not None
    }
    m.zero_grad()
    return want


@pytest.mark.parametrize(
    ("name", "disjoint"),
    [("mlp", True), ("cnn", False), ("policy reads value features", False)],
)
def test_separate_optimisers_get_each_loss_alone_in_one_pass_or_two(
    name: str, disjoint: bool
) -> None:
    """The MLP's towers are disjoint: one backward over the sum. A trunk shared with the value
    head (the CNN), or a policy reading value features, keeps two passes; each parameter gets
    exactly its own loss's gradient either way."""
    if name == "cnn":
        torch.manual_seed(0)
        m = build_model(ModelSpec(type="cnn"), (4, 84, 84), 6)
        batch = batch_to_tensors(make_batch(T=3, B=2, obs_shape=(4, 84, 84), A=6), CPU)
    else:
        m = model() if name == "mlp" else PolicyReadsValueFeatures().double()
        batch = batch_to_tensors(make_batch(seed=6), CPU)
    c = coeffs(vf=0.5)
    out = impala_loss(m, batch, c)
    assert losses_disjoint(m, out) is disjoint
    want = separately(m, batch, c)
    backward(m, impala_loss(m, batch, c), separate_vf_optimizer=True)
    got = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
    assert set(got) == set(want)
    for n, grad in got.items():
        torch.testing.assert_close(grad, want[n], msg=n)


def test_parameters_reached_walks_the_graph_without_computing() -> None:
    m = model()
    out = impala_loss(m, batch_to_tensors(make_batch(), CPU), coeffs())
    vf_ids = {id(p) for p in m.value_function_parameters()}
    assert parameters_reached(out.vf_loss) == vf_ids
    assert parameters_reached(out.total_loss) == {id(p) for p in m.parameters()}
    assert all(p.grad is None for p in m.parameters())
    assert parameters_reached(out.stats) == set()  # detached: no graph


def test_stats_are_finite_and_named() -> None:
    out = impala_loss(model(), batch_to_tensors(make_batch(), CPU), coeffs())
    assert out.stats.shape == (len(STAT_NAMES),)
    assert torch.isfinite(out.stats).all()
    stats = dict(zip(STAT_NAMES, out.stats.tolist(), strict=True))
    assert stats["total_loss"] == np.float64(out.total_loss.item())
    assert 0.0 < stats["entropy"] <= np.log(2) + 1e-9
