"""Learner: stats, optimiser steps, weights/checkpoints, A3C gradients, a tiny learning problem."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from impala_trainer.batches import TrainBatch
from impala_trainer.learning import learner as learner_module
from impala_trainer.learning.learner import Learner, LearnerConfig, clip_grad_norms
from impala_trainer.learning.losses import model_inputs
from impala_trainer.learning.models import ActorCritic
from tests.support.jobs import make_spec
from tests.support.learner import acting_weights, learner_spec, make_batch, one_torch_thread

STAT_KEYS = {
    "policy_loss",
    "vf_loss",
    "entropy",
    "total_loss",
    "grad_gnorm",
    "cur_lr",
    "entropy_coeff",
    "vf_explained_var",
    "mean_rho",
}


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    """Tiny tensors: intra-op threads only add contention on a shared machine."""
    with one_torch_thread():
        yield


def params_of(learner: Learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.model.parameters()]


def test_learn_on_batch_steps_and_reports() -> None:
    torch.manual_seed(0)
    learner = Learner(LearnerConfig.of(learner_spec()), (4,), 2)
    before = params_of(learner)
    stats = learner.learn_on_batch(make_batch())
    assert set(stats) == STAT_KEYS
    assert all(isinstance(v, float) and np.isfinite(v) for v in stats.values())
    assert learner.policy_version == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, params_of(learner), strict=True))
    assert stats["cur_lr"] == 5e-4 and stats["entropy_coeff"] == 0.01


def test_schedules_follow_global_timestep() -> None:
    learner = Learner(
        LearnerConfig.of(learner_spec(
            lrSchedule=[[0, 1e-3], [1000, 1e-4]], entropyCoeffSchedule=[[0, 0.1], [100, 0.0]]
        )),
        (4,),
        2,
    )
    learner.global_timestep = 500
    stats = learner.learn_on_batch(make_batch())
    assert stats["cur_lr"] == pytest.approx(5.5e-4)
    assert stats["entropy_coeff"] == 0.0


def test_optimizer_settings() -> None:
    adam = Learner(LearnerConfig.of(learner_spec()), (4,), 2).optimizers
    assert len(adam) == 1 and isinstance(adam[0], torch.optim.Adam)
    assert adam[0].defaults["eps"] == 1e-8
    rmsprop = learner_spec(optimizer={"type": "rmsprop", "decay": 0.9, "momentum": 0.5})
    rms = Learner(LearnerConfig.of(rmsprop), (4,), 2).optimizers[0]
    assert isinstance(rms, torch.optim.RMSprop)
    assert (rms.defaults["alpha"], rms.defaults["momentum"], rms.defaults["eps"]) == (0.9, 0.5, 0.1)


def test_separate_vf_optimizer_trains_value_params_at_lr_vf() -> None:
    torch.manual_seed(0)
    learner = Learner(LearnerConfig.of(learner_spec(separateVfOptimizer=True, lrVf=1e-12,
                                                    lr=1e-2)), (4,), 2)  # fmt: skip
    assert len(learner.optimizers) == 2
    vf_ids = {id(p) for p in learner.model.value_function_parameters()}
    before = {id(p): p.detach().clone() for p in learner.model.parameters()}
    learner.learn_on_batch(make_batch())
    for p in learner.model.parameters():
        moved = (p.detach() - before[id(p)]).abs().max().item()
        if id(p) in vf_ids:
            assert moved < 1e-9
        elif p.dim() == 2:  # weights (biases of near-uniform heads may barely move)
            assert moved > 1e-4


def test_gradient_clipping() -> None:
    torch.manual_seed(0)
    batch = make_batch(seed=3)
    clipped = Learner(LearnerConfig.of(learner_spec(gradClip=1e-3)), (4,), 2)
    grads, stats = clipped.compute_gradients(batch)
    norm = float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads)))
    assert stats["grad_gnorm"] > 1e-3 and norm == pytest.approx(1e-3, rel=1e-3)
    unclipped = Learner(LearnerConfig.of(learner_spec(gradClip=None)), (4,), 2)
    grads, stats = unclipped.compute_gradients(batch)
    norm = float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads)))
    assert norm == pytest.approx(stats["grad_gnorm"], rel=1e-4)


@pytest.mark.parametrize("clip", [None, 0.5, 40.0])
@pytest.mark.parametrize("sizes", [[3], [3, 2], [2, 0]])
def test_clip_grad_norms_is_torchs_clip_per_group(clip: float | None, sizes: list[int]) -> None:
    """One foreach norm over every gradient, the same arithmetic as a clip_grad_norm_ per group
    (the two optimisers of separateVfOptimizer each clip their own), an empty group ignored."""
    gen = torch.Generator().manual_seed(len(sizes) * 10 + int(clip or 0))
    groups = [[torch.randn(4, 5, generator=gen) * 3 for _ in range(n)] for n in sizes]
    expect = [[g.clone() for g in group] for group in groups]
    norms = []
    for group in expect:
        if not group:
            continue
        if clip is None:
            norms.append(torch.nn.utils.get_total_norm(group))
        else:
            params = [torch.nn.Parameter(torch.zeros_like(g)) for g in group]
            for p, g in zip(params, group, strict=True):
                p.grad = g
            norms.append(torch.nn.utils.clip_grad_norm_(params, clip))
    total = clip_grad_norms(groups, clip)
    want = norms[0] if len(norms) == 1 else torch.stack(norms).norm()
    torch.testing.assert_close(total, want)
    for got_group, want_group in zip(groups, expect, strict=True):
        for got, w in zip(got_group, want_group, strict=True):
            torch.testing.assert_close(got, w)
    if clip == 0.5:  # engaged: each group ends at norm 0.5
        for group in groups:
            if group:
                assert float(torch.stack([g.norm() for g in group]).norm()) == pytest.approx(0.5)


def test_compute_then_apply_gradients_equals_learn_on_batch() -> None:
    spec, batch = learner_spec(), make_batch(seed=4)
    torch.manual_seed(1)
    a = Learner(LearnerConfig.of(spec), (4,), 2, dtype=torch.float64)
    b = Learner(LearnerConfig.of(spec), (4,), 2, dtype=torch.float64)
    b.set_weights(a.get_weights())
    a.learn_on_batch(batch)
    grads, stats = b.compute_gradients(batch)
    assert stats["batch_count"] == batch.env_steps
    b.apply_gradients(grads)
    assert b.policy_version == a.policy_version == 1
    for pa, pb in zip(params_of(a), params_of(b), strict=True):
        torch.testing.assert_close(pa, pb)


def test_weights_are_copies_and_round_trip() -> None:
    torch.manual_seed(0)
    a, b = Learner(LearnerConfig.of(learner_spec()), (4,),
                   2), Learner(LearnerConfig.of(learner_spec()), (4,), 2)  # fmt: skip
    weights = a.get_weights()
    assert all(isinstance(v, np.ndarray) for v in weights.values())
    snapshot = {k: v.copy() for k, v in weights.items()}
    a.learn_on_batch(make_batch())
    assert all(np.array_equal(weights[k], snapshot[k]) for k in weights)  # not a live view
    b.set_weights(weights)
    obs = torch.randn(5, 4)
    a.set_weights(weights)
    torch.testing.assert_close(a.model(obs), b.model(obs))


def test_state_dict_restores_optimizer_and_version() -> None:
    spec = learner_spec(optimizer={"type": "rmsprop", "momentum": 0.9})
    torch.manual_seed(0)
    a = Learner(LearnerConfig.of(spec), (4,), 2)
    for seed in range(3):
        a.learn_on_batch(make_batch(seed=seed))
    a.global_timestep = 1234
    state = a.state_dict()
    b = Learner(LearnerConfig.of(spec), (4,), 2)
    b.load_state_dict(state)
    assert (b.policy_version, b.global_timestep) == (3, 1234)
    # Same next update only if the optimiser state (momentum buffers) came along too.
    a.learn_on_batch(make_batch(seed=9))
    b.learn_on_batch(make_batch(seed=9))
    for pa, pb in zip(params_of(a), params_of(b), strict=True):
        torch.testing.assert_close(pa, pb)


def test_fits_a_contextual_bandit() -> None:
    """Context k in {0, 1} (one-hot); action k pays 1, the other 0; episodes last one step.

    Behaviour is uniform random, so this also exercises the off-policy correction.
    """
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    learner = Learner(LearnerConfig.of(learner_spec(lr=3e-3, entropyCoeff=0.0)), (2,), 2)
    T, B = 4, 64
    first = last = None
    for _ in range(150):
        contexts = rng.integers(0, 2, (T, B))
        actions = rng.integers(0, 2, (T, B))
        batch = TrainBatch(
            obs=np.eye(2, dtype=np.float32)[contexts],
            actions=actions,
            behaviour_logits=np.zeros((T, B, 2), np.float32),
            rewards=(actions == contexts).astype(np.float32),
            terminateds=np.ones((T, B), bool),
            truncateds=np.zeros((T, B), bool),
            final_obs=np.zeros((0, 2), np.float32),
            final_steps=np.zeros((0, 2), np.int64),
            bootstrap_obs=np.eye(2, dtype=np.float32)[rng.integers(0, 2, B)],
            policy_versions=np.zeros(B, np.int64),
        )
        stats = learner.learn_on_batch(batch)
        first = stats["vf_loss"] if first is None else first
        last = stats["vf_loss"]
    with torch.no_grad():
        logits, values = learner.model(torch.eye(2))
    probs = logits.softmax(-1)
    assert probs[0, 0] > 0.9 and probs[1, 1] > 0.9
    assert last < first
    assert values.min() > 0.5  # the value of acting well approaches 1


def test_gradient_clipping_engages_at_rllibs_settings_on_real_samples() -> None:
    """RLlib's gradClip 40 on a real 1,024-step CartPole batch at initial weights: the summed
    loss's gradient is far above 40, so clipping shapes every early update (with a mean loss it
    was ~1000x smaller and the clip never engaged)."""
    from impala_trainer.batches import concat_fragments
    from impala_trainer.rollouts.worker import RolloutWorker

    spec = make_spec(
        {"model": {"hidden": [64, 64]}},
        env={"numEnvsPerWorker": 32},
        training={"rolloutFragmentLength": 32, "trainBatchSize": 1024, "gradClip": 40},
    )
    torch.manual_seed(0)
    worker = RolloutWorker(spec, "w", seed=0)
    batch = concat_fragments([worker.sample()])
    learner = Learner(LearnerConfig.of(spec), worker.models["default"].obs_shape,
                      worker.models["default"].actions)  # fmt: skip
    learner.set_weights(acting_weights(worker))
    grads, stats = learner.compute_gradients(batch)
    assert stats["grad_gnorm"] > 40.0
    norm = float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads)))
    assert norm == pytest.approx(40.0, rel=1e-3)


def test_the_lr_schedule_scales_the_value_optimisers_rate_too() -> None:
    learner = Learner(
        LearnerConfig.of(learner_spec(
            separateVfOptimizer=True, lr=1e-3, lrVf=1e-2, lrSchedule=[[0, 1e-3], [1000, 1e-4]]
        )),
        (4,),
        2,
    )
    learner.global_timestep = 1000
    learner.learn_on_batch(make_batch())
    rates = [opt.param_groups[0]["lr"] for opt in learner.optimizers]
    assert rates == pytest.approx([1e-4, 1e-3])


@pytest.mark.parametrize(
    ("scaling", "factor"), [("none", 1.0), ("sqrt", 2.0), ("linear", 4.0)]
)
def test_lr_scaling_multiplies_every_rate_by_its_factor_of_the_learners(
    scaling: str, factor: float
) -> None:
    """Four learners make a quarter of one learner's updates per env step: learner.lrScaling
    sqrt doubles the rate (lr, lrVf, the schedule's points), linear quadruples it."""
    spec = learner_spec(
        learner={"replicas": 4, "lrScaling": scaling}, separateVfOptimizer=True, lr=1e-3,
        lrVf=1e-2, lrSchedule=[[0, 1e-3], [1000, 1e-4]],
    )  # fmt: skip
    learner = Learner(LearnerConfig.of(spec), (4,), 2)
    learner.global_timestep = 1000
    stats = learner.learn_on_batch(make_batch())
    rates = [opt.param_groups[0]["lr"] for opt in learner.optimizers]
    assert rates == pytest.approx([1e-4 * factor, 1e-3 * factor])
    assert stats["cur_lr"] == pytest.approx(1e-4 * factor)
    one = learner_spec(learner={"lrScaling": scaling})
    assert one.learner.lr_factor == 1.0  # one learner: every choice the same


def _frames(batch: TrainBatch, seed: int) -> TrainBatch:
    """The batch with uint8 84x84 frame stacks for observations (the CNN's input)."""
    rng = np.random.default_rng(seed)

    def frames(a: np.ndarray) -> np.ndarray:
        return rng.integers(0, 256, (*a.shape[:-1], 4, 84, 84), dtype=np.uint8)

    return dataclasses.replace(
        batch,
        obs=frames(batch.obs),
        final_obs=frames(batch.final_obs),
        bootstrap_obs=frames(batch.bootstrap_obs),
    )


KEPT_MODELS = {
    "mlp": ({"hidden": [32, 32]}, (4,)),
    "cnn": ({"type": "cnn", "hidden": [32]}, (4, 84, 84)),
    "lstm": ({"hidden": [16], "useLstm": True, "lstmCellSize": 8}, (4,)),
}


@pytest.mark.parametrize("kind", list(KEPT_MODELS))
def test_passes_over_a_kept_batch_learn_exactly_as_fresh_ones(kind: str) -> None:
    """numSgdIter passes reuse the batch's tensors and prepared observations (`keep`): the
    weights after them are bit for bit those of preparing every pass afresh."""
    model, obs_shape = KEPT_MODELS[kind]
    spec = make_spec({"model": model}, training={"numSgdIter": 3})
    learners = []
    for _ in range(2):
        torch.manual_seed(0)
        learners.append(Learner(LearnerConfig.of(spec), obs_shape, 6))
    kept, fresh = learners
    for seed in range(2):
        batch = make_batch(T=4, B=3, A=6, seed=seed)
        if len(obs_shape) == 3:
            batch = _frames(batch, seed)
        state = np.random.default_rng(seed).standard_normal((3, kept.model.state_size))
        batch = dataclasses.replace(batch, state_in=state.astype(np.float32))
        for n in range(3):
            a = kept.learn_on_batch(batch, keep=n < 2)
            b = fresh.learn_on_batch(batch)
            assert a == b
    for pk, pf in zip(kept.model.parameters(), fresh.model.parameters(), strict=True):
        assert torch.equal(pk, pf)


def test_a_kept_batch_is_prepared_once_and_let_go_after_its_last_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prepared: list[int] = []

    def counting(
        model: torch.nn.Module, tensors: Any, autocast_dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        prepared.append(tensors.env_steps)
        return model_inputs(model, tensors, autocast_dtype)  # type: ignore[arg-type]

    monkeypatch.setattr(learner_module, "model_inputs", counting)
    learner = Learner(LearnerConfig.of(learner_spec(numSgdIter=3)), (4,), 2)
    a, b = make_batch(T=4, B=2), make_batch(T=5, B=2)
    for keep in (True, True, False):
        learner.learn_on_batch(a, keep=keep)
    assert prepared == [8]
    learner.learn_on_batch(b, keep=True)
    learner.learn_on_batch(a)  # let go after its last pass: prepared again
    learner.learn_on_batch(b)  # still kept
    assert prepared == [8, 10, 8]


class ScaledInput(ActorCritic):
    """A model whose preparation reads a parameter (a learned input scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))
        self.policy_head = torch.nn.Linear(4, 2)
        self.value_head = torch.nn.Linear(4, 1)

    def prepare_observations(self, obs: torch.Tensor) -> torch.Tensor:
        return obs * self.scale

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.tanh(obs)
        return self.policy_head(x), self.value_head(x).squeeze(-1)


def test_a_preparation_that_reads_parameters_is_made_every_pass() -> None:
    """Its graph is freed by each backward, so it cannot be kept; keep falls back to fresh."""
    learners = []
    for _ in range(2):
        torch.manual_seed(0)
        learner = Learner(LearnerConfig.of(learner_spec(numSgdIter=3)), (4,), 2)
        learner.model = ScaledInput()
        learner.params = list(learner.model.parameters())
        learner.param_groups = [learner.params]
        learner.optimizers = [torch.optim.Adam(learner.params, lr=0.01)]
        learners.append(learner)
    kept, fresh = learners
    batch = make_batch()
    for n in range(3):
        kept.learn_on_batch(batch, keep=n < 2)
        fresh.learn_on_batch(batch)
    assert kept.model.scale.grad is not None and not torch.equal(kept.model.scale, torch.ones(4))
    for pk, pf in zip(kept.model.parameters(), fresh.model.parameters(), strict=True):
        assert torch.equal(pk, pf)
