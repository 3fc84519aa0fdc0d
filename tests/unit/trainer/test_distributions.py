"""Action distributions against torch.distributions, the workers' sampling, and Box/MultiDiscrete
actions end to end through a worker (clipped at the env only) and the loss."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical as TorchCategorical
from torch.distributions import Normal

from impala_trainer.batches import concat_fragments
from impala_trainer.learning.distributions import (
    Categorical,
    DiagGaussian,
    MultiCategorical,
    SquashedGaussian,
    action_distribution,
)
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.rollouts.worker import RolloutWorker
from tests.support.jobs import make_spec
from tests.support.learner import acting_weights

RNG = np.random.default_rng(0)


def test_categorical_matches_torch() -> None:
    logits = torch.randn(5, 7, 4, dtype=torch.float64)
    actions = torch.randint(0, 4, (5, 7))
    ref = TorchCategorical(logits=logits)
    dist = Categorical(4)
    torch.testing.assert_close(dist.log_prob(logits, actions), ref.log_prob(actions))
    torch.testing.assert_close(dist.entropy(logits), ref.entropy())
    logp, entropy = dist.log_prob_and_entropy(logits, actions)  # the loss's one-pass form
    torch.testing.assert_close(logp, ref.log_prob(actions))
    torch.testing.assert_close(entropy, ref.entropy())


def test_multi_categorical_sums_its_components() -> None:
    dist = MultiCategorical([3, 2], (2,), "int64")
    inputs = torch.randn(6, 5, dtype=torch.float64)
    actions = torch.stack([torch.randint(0, 3, (6,)), torch.randint(0, 2, (6,))], -1)
    a, b = TorchCategorical(logits=inputs[:, :3]), TorchCategorical(logits=inputs[:, 3:])
    expected = a.log_prob(actions[:, 0]) + b.log_prob(actions[:, 1])
    torch.testing.assert_close(dist.log_prob(inputs, actions), expected)
    torch.testing.assert_close(dist.entropy(inputs), a.entropy() + b.entropy())
    assert (
        dist.greedy(inputs.numpy()).tolist()
        == torch.stack([inputs[:, :3].argmax(-1), inputs[:, 3:].argmax(-1)], -1).tolist()
    )


def test_actions_encode_as_a_recurrent_core_input() -> None:
    """lstmUsePrevActionReward's previous-action input: one-hot per component, Box as sampled."""
    assert Categorical(3).encode(torch.tensor([[2, 0]])).tolist() == [[[0, 0, 1], [1, 0, 0]]]
    multi = MultiCategorical([3, 2], (2,), "int64")
    assert multi.encoded_size == 5
    assert multi.encode(torch.tensor([[1, 1]])).tolist() == [[0, 1, 0, 0, 1]]
    box = DiagGaussian(np.full(2, -1.0), np.full(2, 1.0))
    assert box.encoded_size == 2
    assert box.encode(torch.tensor([[3.0, -0.5]])).tolist() == [[3.0, -0.5]]  # unclipped


def test_diag_gaussian_matches_torch() -> None:
    dist = DiagGaussian(np.full(3, -2.0), np.full(3, 2.0))
    inputs = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    inputs[:, 3:] = inputs[:, 3:].clamp(-1.5, 1.5)  # inside the log-std clamp, as torch has none
    actions = torch.randn(4, 3, dtype=torch.float64) * 3  # outside the bounds too: unclipped
    ref = Normal(inputs[:, :3], inputs[:, 3:].exp())
    torch.testing.assert_close(dist.log_prob(inputs, actions), ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(dist.entropy(inputs), ref.entropy().sum(-1))


@pytest.mark.parametrize(
    "dist",
    [
        Categorical(3),
        MultiCategorical([2, 4], (2,), "int64"),
        DiagGaussian(np.zeros(2) - 1, np.ones(2)),
    ],
    ids=["categorical", "multi", "gaussian"],
)
def test_workers_sample_from_the_distribution(dist) -> None:  # type: ignore[no-untyped-def]
    """The numpy sampling the workers use has the distribution's own statistics."""
    inputs = np.tile(RNG.standard_normal(dist.num_inputs).astype(np.float32), (20000, 1))
    noise = dist.noise(np.random.default_rng(1), 1, 20000)[0]
    out = np.empty((20000, *dist.action_shape), dist.action_dtype)
    dist.sample(inputs, noise, out)
    logp = dist.log_prob(torch.from_numpy(inputs).double(), torch.from_numpy(out))
    # The mean log-probability of samples estimates minus the entropy.
    entropy = float(dist.entropy(torch.from_numpy(inputs[:1]).double()))
    assert float(logp.mean()) == pytest.approx(-entropy, abs=0.03)


def test_spaces_map_to_their_distributions() -> None:
    assert action_distribution(gym.spaces.Discrete(5)) == Categorical(5)
    multi = action_distribution(gym.spaces.MultiDiscrete([[2, 3], [4, 5]]))
    assert (multi.num_inputs, multi.action_shape) == (14, (4,))
    assert multi.to_env(np.zeros((3, 4), np.int64)).shape == (3, 2, 2)
    binary = action_distribution(gym.spaces.MultiBinary(3))
    assert (binary.num_inputs, binary.to_env(np.ones((2, 3), np.int64)).dtype) == (6, np.int8)
    bounded = gym.spaces.Box(-1.0, 2.0, (2, 2), np.float32)
    assert type(action_distribution(bounded)) is SquashedGaussian  # finite bounds: squashed
    box = action_distribution(bounded, squash=False)
    assert type(box) is DiagGaussian
    assert (box.num_inputs, box.action_shape) == (8, (4,))
    clipped = box.to_env(np.array([[-5.0, 0.5, 3.0, 1.0]], np.float32))
    np.testing.assert_array_equal(clipped, [[[-1.0, 0.5], [2.0, 1.0]]])
    unbounded = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    assert type(action_distribution(unbounded)) is DiagGaussian
    with pytest.raises(ValueError, match="finite bounds"):
        action_distribution(unbounded, squash=True)


def test_box_actions_are_clipped_at_the_env_and_learned_unclipped() -> None:
    spec = make_spec(env={"id": "Pendulum-v1", "numEnvsPerWorker": 3},
                     model={"hidden": [16], "squashActions": False},
                     training={"rolloutFragmentLength": 10})  # fmt: skip
    worker = RolloutWorker(spec, "w", seed=0)
    # A wide policy: many samples fall outside Pendulum's [-2, 2] torque.
    worker.policies["default"].model.policy_head.bias.data[1:] = 1.5
    f = worker.sample()
    assert f.actions.shape == (10, 3, 1) and f.actions.dtype == np.float32
    assert f.behaviour_logits.shape == (10, 3, 2)
    assert np.abs(f.actions).max() > 2.0  # stored as sampled: the log-prob is of this action
    learner = Learner(LearnerConfig.of(spec), worker.models["default"].obs_shape,
                      worker.models["default"].actions)  # fmt: skip
    learner.set_weights(acting_weights(worker))
    stats = learner.learn_on_batch(concat_fragments([f]))
    assert stats["mean_rho"] == pytest.approx(1.0, abs=1e-5)  # same policy: every ratio is 1
    assert np.isfinite(stats["total_loss"])


def test_free_log_std_is_state_independent_and_trained() -> None:
    spec = make_spec(env={"id": "Pendulum-v1", "numEnvsPerWorker": 2},
                     model={"hidden": [16], "freeLogStd": True})  # fmt: skip
    worker = RolloutWorker(spec, "w", seed=0)
    f = worker.sample()
    np.testing.assert_array_equal(f.behaviour_logits[..., 1], 0.0)  # log-std parameter: 0
    learner = Learner(LearnerConfig.of(spec), worker.models["default"].obs_shape,
                      worker.models["default"].actions)  # fmt: skip
    learner.learn_on_batch(concat_fragments([f]))
    assert learner.model.log_std is not None and learner.model.log_std.grad is not None


def test_squashed_gaussian_scores_the_sample_and_its_entropy_is_the_squashed_actions() -> None:
    """Against torch's tanh-transformed Normal scaled into the bounds: the learner's log-prob is
    the Gaussian's at the stored sample (the Jacobian cancels in every ratio), the env gets the
    transform of it, and the entropy estimate at the behaviour's own noise averages to the
    squashed action's entropy, E[-log p(a)]."""
    from torch.distributions import AffineTransform, TanhTransform, TransformedDistribution

    low, high = np.array([-2.0, 0.0]), np.array([2.0, 1.0])
    dist = SquashedGaussian(low, high)
    inputs = torch.tensor([[0.3, -1.0, -0.5, 0.2]], dtype=torch.float64).expand(50_000, 4)
    normal = Normal(inputs[:, :2], inputs[:, 2:].exp())
    squashed = TransformedDistribution(normal, [
        TanhTransform(),
        AffineTransform(torch.tensor((high + low) / 2), torch.tensor((high - low) / 2)),
    ])  # fmt: skip
    u = normal.sample()
    logp, entropy = dist.log_prob_and_entropy(inputs, u, inputs)  # the behaviour is the learner
    torch.testing.assert_close(logp, normal.log_prob(u).sum(-1))
    env = torch.from_numpy(dist.to_env(u.float().numpy()).astype(np.float64))
    assert (env >= torch.tensor(low)).all() and (env <= torch.tensor(high)).all()
    a = squashed.transforms[1](squashed.transforms[0](u))
    torch.testing.assert_close(env, a, atol=1e-5, rtol=1e-5)
    truth = -squashed.log_prob(a.clamp(torch.tensor(low) + 1e-9, torch.tensor(high) - 1e-9))
    assert float(entropy.mean()) == pytest.approx(float(truth.sum(-1).mean()), abs=0.02)
    # The greedy action the export gives is the squashed mean.
    greedy = squashed.transforms[1](torch.tanh(inputs[:1, :2]))
    torch.testing.assert_close(dist.mode(inputs[:1]), greedy)
