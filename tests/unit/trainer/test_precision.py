"""learner.precision: which dtype each setting resolves to, and the bfloat16 learner against the
float32 one on the same weights and batches (MLP, CNN, LSTM, the multi-device learner)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from impala_api.manifest import ManifestError
from impala_trainer.learning.learner import (
    Learner,
    LearnerConfig,
    batch_to_tensors,
)
from impala_trainer.learning.losses import impala_loss, model_inputs
from impala_trainer.learning.precision import acting_dtype, autocast_dtype, cpu_flags, native_bf16
from impala_trainer.learning.towers import MultiDeviceLearner
from tests.support.jobs import make_spec
from tests.support.learner import make_batch, one_torch_thread

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


# -- resolving the setting ------------------------------------------------------------------------


def test_float32_and_bfloat16_are_taken_as_written() -> None:
    assert autocast_dtype("float32", CPU, flags={"avx512_bf16"}) is None
    assert autocast_dtype("bfloat16", CPU, flags=set()) is torch.bfloat16


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"avx2", "avx512f", "avx512_bf16"}, torch.bfloat16),  # Zen 4, Cooper Lake
        ({"avx2", "avx512f", "amx_bf16", "amx_tile"}, torch.bfloat16),  # Sapphire Rapids
        ({"avx2", "avx512f", "avx512_vnni"}, None),  # Cascade Lake: bf16 emulated, slower
        (set(), None),
    ],
)
def test_auto_takes_bfloat16_only_where_the_cpu_computes_it(
    flags: set[str], expected: torch.dtype | None
) -> None:
    assert autocast_dtype("auto", CPU, flags=flags) is expected


def test_auto_on_a_device_that_is_neither_cpu_nor_cuda_stays_float32() -> None:
    assert not native_bf16(torch.device("meta"), flags={"avx512_bf16"})
    assert autocast_dtype("auto", torch.device("meta"), flags={"avx512_bf16"}) is None


@pytest.mark.parametrize(
    ("precision", "flags", "expected"),
    [
        ("auto", {"avx512_bf16"}, torch.bfloat16),
        ("bfloat16", {"amx_bf16"}, torch.bfloat16),
        ("float32", {"avx512_bf16"}, None),  # a float32 learner: its workers act in float32
        ("auto", {"avx512f"}, None),  # no bf16 in this CPU's hardware
        ("bfloat16", set(), None),  # a bf16 learner on a GPU, workers on such a CPU
    ],
)
def test_workers_act_in_bfloat16_where_the_learner_does_and_their_own_cpu_computes_it(
    precision: str, flags: set[str], expected: torch.dtype | None
) -> None:
    assert acting_dtype(precision, flags=flags) is expected


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match=r"learner\.precision"):
        autocast_dtype("float16", CPU)


def test_cpu_flags_reads_x86_and_arm_cpuinfo(tmp_path: Path) -> None:
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse avx512_bf16\n\nprocessor\t: 1\nflags\t: x\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_flags(x86) == {"fpu", "sse", "avx512_bf16"}
    assert cpu_flags(arm) == {"fp", "asimd", "bf16"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_the_spec_field_names_its_values() -> None:
    assert make_spec(learner={"precision": "auto"}).learner.precision == "auto"
    assert make_spec().learner.precision == "float32"
    with pytest.raises(ManifestError, match="precision"):
        make_spec(learner={"precision": "fp16"})


# -- the bfloat16 learner -------------------------------------------------------------------------

MODELS: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {
    "mlp": ({"hidden": [32, 32]}, (4,)),
    "cnn": ({"type": "cnn", "hidden": [64]}, (4, 84, 84)),
    "lstm": ({"hidden": [16], "useLstm": True, "lstmCellSize": 8}, (4,)),
}


def _learner(
    model: dict[str, Any], obs_shape: tuple[int, ...], precision: str, **kw: Any
) -> Learner:
    torch.manual_seed(0)
    spec = make_spec(
        {"model": model},
        training={"lr": 1e-3, "optimizer": {"type": "adam"}},
        learner={"precision": precision, **kw},
    )
    cls = MultiDeviceLearner if kw else Learner
    return cls(LearnerConfig.of(spec), obs_shape, 3)


def _uint8_frames(batch_obs: np.ndarray) -> np.ndarray:
    return (np.abs(batch_obs) * 60).clip(0, 255).astype(np.uint8)


def _batch(name: str, seed: int = 0) -> Any:
    obs_shape = MODELS[name][1]
    batch = make_batch(T=8, B=4, obs_shape=obs_shape, A=3, seed=seed)
    if name == "lstm":  # each column's starting (h, c), as the worker recorded it
        state = np.random.default_rng(seed).standard_normal((4, 16)).astype(np.float32)
        batch = dataclasses.replace(batch, state_in=0.1 * state)
    if len(obs_shape) == 3:  # Atari frames arrive as uint8, as the CNN takes them
        batch = dataclasses.replace(
            batch,
            obs=_uint8_frames(batch.obs),
            final_obs=_uint8_frames(batch.final_obs),
            bootstrap_obs=_uint8_frames(batch.bootstrap_obs),
        )
    return batch


@pytest.mark.parametrize("name", list(MODELS))
def test_bfloat16_matches_float32_and_keeps_float32_state(name: str) -> None:
    """Same weights, same batch: the first update's loss and gradient norm agree to bf16's
    precision, and the weights, gradients and optimiser state stay float32 (autocast casts
    copies for the forward only)."""
    model, obs_shape = MODELS[name]
    full, mixed = _learner(model, obs_shape, "float32"), _learner(model, obs_shape, "bfloat16")
    assert full.autocast_dtype is None and mixed.autocast_dtype is torch.bfloat16
    batch = _batch(name)
    a, b = full.learn_on_batch(batch), mixed.learn_on_batch(batch)
    for key in ("total_loss", "vf_loss", "policy_loss", "grad_gnorm"):
        assert b[key] == pytest.approx(a[key], rel=0.05, abs=0.05), key
    assert b["entropy"] == pytest.approx(a["entropy"], rel=0.01)
    for p in mixed.model.parameters():
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
    for state in mixed.optimizers[0].state.values():
        assert all(v.dtype == torch.float32 for v in state.values() if v.is_floating_point())


@pytest.mark.parametrize("name", list(MODELS))
def test_bfloat16_learner_fits_a_batch_as_float32_does(name: str) -> None:
    """60 updates on one batch: the value loss falls under both precisions to the same end."""
    model, obs_shape = MODELS[name]
    batch = _batch(name, seed=1)
    curves = {}
    for precision in ("float32", "bfloat16"):
        learner = _learner(model, obs_shape, precision)
        curves[precision] = [learner.learn_on_batch(batch)["vf_loss"] for _ in range(60)]
    full, mixed = curves["float32"], curves["bfloat16"]
    assert full[-1] < 0.85 * full[0] and mixed[-1] < 0.85 * mixed[0]
    assert mixed[-1] == pytest.approx(full[-1], rel=0.2, abs=0.05)


def test_the_multi_device_learner_runs_each_tower_in_bfloat16() -> None:
    model, obs_shape = MODELS["cnn"]
    single = _learner(model, obs_shape, "bfloat16")
    towers = _learner(model, obs_shape, "bfloat16", fakeDevices=2)
    assert isinstance(towers, MultiDeviceLearner) and towers.autocast_dtype is torch.bfloat16
    batch = _batch("cnn")
    a, b = single.learn_on_batch(batch), towers.learn_on_batch(batch)
    # Two shards of two columns each sum to the whole batch's loss (bf16 rounding per shard).
    assert b["total_loss"] == pytest.approx(a["total_loss"], rel=0.02, abs=0.02)
    assert all(p.dtype == torch.float32 for t in towers.towers for p in t.parameters())


FRAME_MODELS = {
    "cnn": {"type": "cnn", "hidden": [32]},
    "resnet": {"type": "resnet", "hidden": [32]},
    "cnn-lstm": {"type": "cnn", "hidden": [32], "useLstm": True, "lstmCellSize": 8},
}


@pytest.mark.parametrize("name", list(FRAME_MODELS))
def test_a_bfloat16_learner_prepares_frames_in_bfloat16_with_the_same_gradients(
    name: str,
) -> None:
    """Under autocast the convolutional models prepare frames in bf16, the dtype their first
    convolution computes in: the batch's SGD passes share one cast and keep half the bytes. The
    loss and its gradients are bit for bit those of float32 inputs cast at that convolution."""
    learner = _learner(FRAME_MODELS[name], (4, 84, 84), "bfloat16")
    model = learner.model
    batch = make_batch(T=3, B=2, obs_shape=(4, 84, 84), A=3)
    batch = dataclasses.replace(
        batch,
        obs=_uint8_frames(batch.obs),
        final_obs=_uint8_frames(batch.final_obs),
        bootstrap_obs=_uint8_frames(batch.bootstrap_obs),
        state_in=np.zeros((2, model.state_size), np.float32),
    )
    tensors = batch_to_tensors(batch, learner.device)
    as_float32 = model_inputs(model, tensors)
    as_bfloat16 = model_inputs(model, tensors, torch.bfloat16)
    assert as_float32.dtype == torch.float32 and as_bfloat16.dtype == torch.bfloat16
    torch.testing.assert_close(as_bfloat16.float(), as_float32, rtol=2**-8, atol=0)
    runs = []
    for inputs in (as_float32, as_bfloat16):
        model.zero_grad()
        out = impala_loss(
            model, tensors, learner.coefficients(), learner.dist, torch.bfloat16, inputs
        )
        out.total_loss.backward()
        runs.append([out.total_loss, *(p.grad for p in model.parameters())])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_float64_learners_ignore_the_setting() -> None:
    """Tests and gradient checks build float64 learners: autocast would silently drop them to
    bf16, so a non-float32 learner never autocasts."""
    spec = make_spec({"model": {"hidden": [8]}}, learner={"precision": "bfloat16"})
    assert Learner(LearnerConfig.of(spec), (4,), 2, dtype=torch.float64).autocast_dtype is None
