"""Models: output shapes, uint8 scaling, auto selection, initialisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from impala_api.spec import ModelSpec
from impala_trainer.learning.inference import CastPolicy, NumpyPolicy, WeightLoader, acting_policy
from impala_trainer.learning.model_factory import build_model
from impala_trainer.learning.models import (
    ActorCritic,
    ImpalaShallowCNN,
    MLPActorCritic,
    _channels_last,
)


@pytest.mark.parametrize("obs_shape", [(4,), (3, 2)])
def test_mlp_shapes(obs_shape: tuple[int, ...]) -> None:
    model = build_model(ModelSpec(hidden=[64, 64]), obs_shape, 3)
    assert isinstance(model, MLPActorCritic)
    logits, values = model(torch.randn(10, *obs_shape))
    assert logits.shape == (10, 3) and values.shape == (10,)


def test_cnn_shapes_and_uint8_scaling() -> None:
    model = build_model(ModelSpec(hidden=[256]), (4, 84, 84), 6)
    assert isinstance(model, ImpalaShallowCNN)
    frames = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    logits, values = model(frames)
    assert logits.shape == (5, 6) and values.shape == (5,)
    scaled_logits, scaled_values = model(frames.float() / 255.0)
    torch.testing.assert_close(logits, scaled_logits)
    torch.testing.assert_close(values, scaled_values)
    # conv 16x8x8/4 -> 20x20, conv 32x4x4/2 -> 9x9: 2592 features into the fc layer
    assert model.fc[0].in_features == 32 * 9 * 9


@pytest.mark.parametrize(
    ("model_spec", "obs"),
    [
        (ModelSpec(hidden=[32, 32]), torch.randn(7, 4)),
        (ModelSpec(hidden=[64]), torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)),
    ],
)
def test_policy_logits_are_the_forward_logits(model_spec: ModelSpec, obs: torch.Tensor) -> None:
    model = build_model(model_spec, tuple(obs.shape[1:]), 5)
    logits, _ = model(obs)
    torch.testing.assert_close(model.policy_logits(obs), logits, rtol=0, atol=0)


def _arrays(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """A model's weights as a broadcast carries them."""
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(("kind", "obs_shape"), [("mlp", (4,)), ("cnn", (4, 84, 84))])
def test_weights_are_written_into_the_models_own_tensors(
    kind: str, obs_shape: tuple[int, ...]
) -> None:
    spec = ModelSpec(type=kind, hidden=[16])
    model, other = build_model(spec, obs_shape, 3), build_model(spec, obs_shape, 3)
    tensors = {k: (v.data_ptr(), v._version) for k, v in model.state_dict().items()}
    load = WeightLoader(model)
    load(_arrays(other))
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, other.state_dict()[k], rtol=0, atol=0)
        assert v.data_ptr() == tensors[k][0]  # in place: numpy views of them stay live
        assert v._version > tensors[k][1]  # counted, so a CastPolicy recasts
    # What load_state_dict refuses is refused, with its message.
    weights = _arrays(model)
    missing = dict(weights)
    missing.pop("value_head.bias")
    with pytest.raises(RuntimeError, match=r'Missing key.*"value_head\.bias"'):
        load(missing)
    resized = {**weights, "value_head.weight": np.zeros((1, 3), np.float32)}
    with pytest.raises(RuntimeError, match=r"size mismatch for value_head\.weight"):
        load(resized)
    extra = {**weights, "head.scale": np.ones(1, np.float32)}
    with pytest.raises(RuntimeError, match=r'Unexpected key.*"head\.scale"'):
        load(extra)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("obs_shape", [(4,), (3, 2)])
def test_numpy_acting_policy_equals_the_torch_logits_and_follows_loaded_weights(
    activation: str, obs_shape: tuple[int, ...]
) -> None:
    spec = ModelSpec(hidden=[64, 64], activation=activation)
    model = build_model(spec, obs_shape, 3)
    act = acting_policy(model)
    assert isinstance(act, NumpyPolicy)
    obs = np.random.default_rng(0).normal(size=(32, *obs_shape)).astype(np.float32) * 3
    with torch.no_grad():
        expected = model.policy_logits(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(act(obs), expected, rtol=1e-5, atol=1e-6)
    # New weights loaded the way a rollout worker loads a broadcast: the numpy views follow.
    WeightLoader(model)(_arrays(build_model(spec, obs_shape, 3)))
    with torch.no_grad():
        reloaded = model.policy_logits(torch.from_numpy(obs)).numpy()
    assert not np.allclose(reloaded, expected)
    np.testing.assert_allclose(act(obs), reloaded, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(act(obs[:5]), reloaded[:5], rtol=1e-5, atol=1e-6)


def test_the_cnn_acts_through_torch() -> None:
    model = build_model(ModelSpec(hidden=[64]), (4, 84, 84), 6)
    act = acting_policy(model)
    assert not isinstance(act, NumpyPolicy)
    frames = np.random.default_rng(0).integers(0, 256, (3, 4, 84, 84), dtype=np.uint8)
    with torch.no_grad():
        expected = model.policy_logits(torch.from_numpy(frames)).numpy()
    np.testing.assert_allclose(act(frames), expected, rtol=1e-6)


@pytest.mark.parametrize("kind", ["cnn", "resnet"])
def test_bfloat16_acting_is_the_learners_autocast_forward_and_follows_loaded_weights(
    kind: str,
) -> None:
    """A worker of a bf16 learner acts through a bf16 copy of the model: the same arithmetic as
    the learner's forward under autocast, bit for bit, and never on weights older than the
    model's."""
    spec = ModelSpec(type=kind, hidden=[32])
    model = build_model(spec, (4, 84, 84), 6)
    act = acting_policy(model, torch.bfloat16)
    assert isinstance(act, CastPolicy)
    frames = np.random.default_rng(0).integers(0, 256, (5, 4, 84, 84), dtype=np.uint8)

    def learners() -> np.ndarray:
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            return model.policy_logits(torch.from_numpy(frames)).float().numpy()

    first = learners()
    got = act(frames)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, first)
    WeightLoader(model)(_arrays(build_model(spec, (4, 84, 84), 6)))  # as a worker loads a broadcast
    reloaded = learners()
    assert not np.array_equal(reloaded, first)
    np.testing.assert_array_equal(act(frames), reloaded)


class _OwnModel(ActorCritic):
    """A model of a user's own: it never said it runs in bf16."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 3)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.net(obs.float())
        return out, out[:, 0]


def test_only_the_built_in_convolutional_models_act_in_bfloat16() -> None:
    mlp = build_model(ModelSpec(hidden=[8]), (4,), 2)
    assert isinstance(acting_policy(mlp, torch.bfloat16), NumpyPolicy)
    own = _OwnModel()
    obs = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    act = acting_policy(own, torch.bfloat16)
    assert not isinstance(act, CastPolicy)
    with torch.no_grad():
        np.testing.assert_array_equal(act(obs), own.policy_logits(torch.from_numpy(obs)).numpy())
    assert not isinstance(acting_policy(build_model(ModelSpec(), (4, 84, 84), 6)), CastPolicy)


@pytest.mark.parametrize("channels", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_frames_become_the_channels_last_floats_of_torchs_own_copy(
    channels: int, dtype: torch.dtype
) -> None:
    frames = torch.randint(0, 256, (3, channels, 12, 10), dtype=torch.uint8)
    got = _channels_last(frames, dtype)
    expected = frames.to(dtype, memory_format=torch.channels_last).mul_(1.0 / 255.0)
    assert got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last)
    assert got.shape == frames.shape and got.stride() == expected.stride()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_explicit_type_and_errors() -> None:
    assert isinstance(
        build_model(ModelSpec(type="mlp", hidden=[8]), (4, 84, 84), 2), MLPActorCritic
    )
    with pytest.raises(ValueError, match="cnn"):
        build_model(ModelSpec(type="cnn"), (4,), 2)


def test_initial_policy_is_near_uniform() -> None:
    torch.manual_seed(0)
    model = build_model(ModelSpec(hidden=[64, 64]), (4,), 2)
    logits, _ = model(torch.randn(256, 4) * 3)
    probs = logits.softmax(-1)
    assert (probs - 0.5).abs().max() < 0.05


def test_value_function_parameters_are_disjoint_from_the_policy() -> None:
    for model in (
        build_model(ModelSpec(hidden=[8]), (4,), 2),
        build_model(ModelSpec(hidden=[8]), (4, 84, 84), 2),
    ):
        vf = {id(p) for p in model.value_function_parameters()}
        assert vf and id(model.policy_head.weight) not in vf
        assert id(model.value_head.weight) in vf
        # The policy output does not depend on value-only parameters.
        obs = torch.randn(3, *((4,) if isinstance(model, MLPActorCritic) else (4, 84, 84)))
        logits, _ = model(obs)
        grads = torch.autograd.grad(
            logits.sum(), list(model.value_function_parameters()), allow_unused=True
        )
        assert all(g is None or torch.count_nonzero(g) == 0 for g in grads)


FRAMES = torch.randint(0, 256, (6, 4, 84, 84), dtype=torch.uint8)


@pytest.mark.parametrize(
    ("model_spec", "obs"),
    [
        (ModelSpec(hidden=[32, 32]), torch.randn(6, 4)),
        (ModelSpec(hidden=[64]), FRAMES),
        (ModelSpec(type="resnet", hidden=[32]), FRAMES),
        (ModelSpec(type="cnn", hidden=[32], useLstm=True, lstmCellSize=8), FRAMES),
        (ModelSpec(hidden=[16], useLstm=True, lstmCellSize=8), torch.randn(6, 4)),
    ],
    ids=["mlp", "cnn", "resnet", "cnn-lstm", "mlp-lstm"],
)
def test_prepared_observations_pass_through_the_model_unchanged(
    model_spec: ModelSpec, obs: torch.Tensor
) -> None:
    """What the learner prepares once per batch (for frames: float, scaled, channels-last) the
    model takes as it is: preparing again is the same tensor, and the outputs are the raw
    observations' outputs."""
    torch.manual_seed(0)
    model = build_model(model_spec, tuple(obs.shape[1:]), 5)
    prepared = model.prepare_observations(obs)
    assert prepared.dtype == torch.float32
    assert model.prepare_observations(prepared) is prepared
    if obs.dtype == torch.uint8:
        assert prepared.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(prepared, obs.float() / 255.0)
    if model.state_size:
        state, resets = model.initial_state(3), torch.zeros(2, 3, dtype=torch.bool)
        raw = model.forward_sequence(obs.view(2, 3, *obs.shape[1:]), state, resets)
        again = model.forward_sequence(prepared.view(2, 3, *obs.shape[1:]), state, resets)
    else:
        raw, again = model(obs), model(prepared)
    for a, b in zip(raw, again, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
