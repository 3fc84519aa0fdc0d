"""PopArt: the value head's outputs survive every move of its statistics exactly, the loss is the
same at any reward scale, and the statistics live in the model's state (checkpoints, towers,
broadcast weights)."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from impala_api.spec import ModelSpec
from impala_trainer.learning import popart
from impala_trainer.learning.distributions import Categorical
from impala_trainer.learning.learner import (
    Learner,
    LearnerConfig,
    batch_to_tensors,
)
from impala_trainer.learning.losses import LossCoefficients, impala_loss
from impala_trainer.learning.model_factory import build_model, model_problem
from impala_trainer.learning.towers import MultiDeviceLearner
from tests.support.jobs import make_spec
from tests.support.learner import make_batch, one_torch_thread

CPU = torch.device("cpu")
COEFFS = LossCoefficients(0.99, 0.5, 0.01, 1.0, 1.0)


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _model(seed: int = 0, **model: object) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelSpec(hidden=[16], popart=True, **model), (4,), 2).double()


def test_outputs_are_preserved_exactly_when_the_statistics_move() -> None:
    m = _model()
    head = popart.head_of(m)
    assert head is not None
    obs = torch.randn(32, 4, dtype=torch.float64)
    before = m(obs)[1]
    for mean, square in [(-50.0, 2600.0), (3.0, 10.0), (1e4, 2e8)]:
        head.update(torch.tensor(mean).double(), torch.tensor(square).double())
        torch.testing.assert_close(m(obs)[1], before, rtol=1e-10, atol=1e-9)
    assert int(head.updates) == 3
    # The first batch sets the statistics; later ones move them by beta.
    assert float(head.sigma()) > 0 and float(head.mu) != pytest.approx(1e4)


def test_the_loss_is_the_same_at_any_reward_scale() -> None:
    """Rewards times k, with the statistics times k: every gradient is the unscaled run's (the
    value error and the advantages are in units of sigma). Without PopArt the gradients scale
    with the rewards."""
    k = 1000.0
    batch = make_batch(T=6, B=4, seed=3)
    batch.rewards[:] = np.round(batch.rewards * 8) / 8  # eighths: exact in float32 times 1000
    scaled = copy.deepcopy(batch)
    scaled.rewards *= k
    grads = []
    for b, scale in ((batch, 1.0), (scaled, k)):
        m = _model(seed=1)
        head = popart.head_of(m)
        assert head is not None
        with torch.no_grad():  # statistics (mu, sigma) = scale * (-2, 5)
            head.mu.fill_(-2.0 * scale)
            head.nu.fill_((4.0 + 25.0) * scale**2)
            head.updates.fill_(1)
        out = impala_loss(m, batch_to_tensors(b, CPU), COEFFS)
        out.total_loss.backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    for g1, gk in zip(*grads, strict=True):
        torch.testing.assert_close(g1, gk, rtol=1e-9, atol=1e-12)
    plain = []
    for b in (batch, scaled):
        torch.manual_seed(1)
        m = build_model(ModelSpec(hidden=[16]), (4,), 2).double()
        impala_loss(m, batch_to_tensors(b, CPU), COEFFS).total_loss.backward()
        plain.append(torch.cat([p.grad.reshape(-1) for p in m.parameters()]).norm())
    assert float(plain[1] / plain[0]) > 100.0


def test_the_learner_moves_the_statistics_and_checkpoints_them() -> None:
    spec = make_spec(model={"hidden": [16], "popart": True})
    learner = Learner(LearnerConfig.of(spec), (4,), 2)
    batch = make_batch(T=8, B=4, seed=4)
    batch.rewards *= 100.0
    obs = batch_to_tensors(batch, CPU).obs.reshape(-1, 4)
    learner.learn_on_batch(batch)
    head = popart.head_of(learner.model)
    assert head is not None and int(head.updates) == 1
    sigma = float(head.sigma())
    assert sigma > 10.0  # the targets' scale, learned from the first batch
    state = learner.state_dict()
    other = Learner(LearnerConfig.of(spec), (4,), 2)
    other.load_state_dict(state)
    torch.testing.assert_close(other.model(obs)[1], learner.model(obs)[1])
    other_head = popart.head_of(other.model)
    assert other_head is not None and float(other_head.sigma()) == pytest.approx(sigma)
    # Broadcast weights carry the statistics: a worker's model values states as the learner's.
    worker_model = build_model(spec.model, (4,), 2)
    worker_model.load_state_dict({k: torch.from_numpy(v) for k, v in learner.get_weights().items()})
    torch.testing.assert_close(worker_model(obs)[1], learner.model(obs)[1])


def test_towers_keep_the_masters_statistics() -> None:
    spec = make_spec(model={"hidden": [16], "popart": True}, learner={"fakeDevices": 2})
    learner = MultiDeviceLearner(LearnerConfig.of(spec), (4,), 2)
    batch = make_batch(T=8, B=4, seed=5)
    batch.rewards *= 10.0
    learner.learn_on_batch(batch)
    heads = [popart.head_of(t) for t in learner.towers]
    assert all(h is not None and int(h.updates) == 1 for h in heads)
    assert float(heads[1].sigma()) == float(heads[0].sigma())  # type: ignore[union-attr]


def test_a_model_without_a_linear_value_head_is_refused_naming_the_field() -> None:
    spec = ModelSpec.model_validate(
        {"type": "custom", "popart": True, "import": "tests.support.custom_models:NoValueHead"}
    )
    problem = model_problem(spec, (4,), np.dtype(np.float32), Categorical(2))
    assert problem is not None and problem[0] == "model.popart", problem
    assert "value_head" in problem[1]
