"""RolloutWorker: fragment layout, final observations of time limits, episode stats, weights."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch

from impala_api.spec import DEFAULT_POLICY
from impala_trainer.batches import policy_layout
from impala_trainer.learners.policies import PolicySetState
from impala_trainer.learning import precision as precision_module
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.rollouts.worker import RolloutWorker
from tests.support.jobs import make_spec
from tests.support.learner import acting_weights

CARTPOLE: dict[str, Any] = {
    "env": {"id": "CartPole-v1", "numEnvsPerWorker": 6},
    "model": {"hidden": [16]},
    "training": {"rolloutFragmentLength": 20},
}
"""The workers' spec: six CartPole envs, 20-step fragments, a small MLP."""


def test_fragment_shapes_and_dtypes() -> None:
    w = RolloutWorker(make_spec(CARTPOLE), "w0", seed=0)
    f = w.sample()
    built = w.models["default"]
    assert (built.obs_shape, built.actions.num_inputs) == ((4,), 2)
    assert f.obs.shape == (20, 6, 4) and f.obs.dtype == np.float32
    assert f.actions.shape == (20, 6) and f.actions.dtype == np.int64
    assert f.behaviour_logits.shape == (20, 6, 2) and f.behaviour_logits.dtype == np.float32
    for name in ("rewards", "terminateds", "truncateds"):
        assert getattr(f, name).shape == (20, 6)
    assert f.bootstrap_obs.shape == (6, 4)
    assert f.env_steps == 120 and f.worker_id == "w0" and f.policy_version == 0
    assert set(np.unique(f.actions)) <= {0, 1}


def test_behaviour_logits_are_the_models_logits_for_the_recorded_obs() -> None:
    w = RolloutWorker(make_spec(CARTPOLE), "w0", seed=3)
    f = w.sample()
    with torch.no_grad():
        logits, _ = w.policies["default"].model(torch.from_numpy(f.obs.reshape(-1, 4)))
    actual = f.behaviour_logits.reshape(-1, 2)
    np.testing.assert_allclose(actual, logits.numpy(), rtol=1e-5, atol=1e-9)


def test_consecutive_fragments_continue_the_trajectory() -> None:
    w = RolloutWorker(make_spec(CARTPOLE), "w0", seed=1)
    first, second = w.sample(), w.sample()
    np.testing.assert_array_equal(first.bootstrap_obs, second.obs[0])


def test_episode_stats_match_done_flags() -> None:
    w = RolloutWorker(make_spec(CARTPOLE), "w0", seed=2)
    returns: list[float] = []
    lengths: list[int] = []
    dones = 0
    for _ in range(5):
        f = w.sample()
        returns += f.episode_returns
        lengths += f.episode_lengths
        dones += int((f.terminateds | f.truncateds).sum())
    assert len(returns) == len(lengths) == dones > 0
    # CartPole pays 1 per step, so a return equals its episode's length.
    assert returns == [float(n) for n in lengths]


def test_fragment_carries_the_final_obs_of_each_time_limited_episode() -> None:
    w = RolloutWorker(make_spec(CARTPOLE, env={"kwargs": {"max_episode_steps": 7}}), "w0", seed=4)
    captured: list[np.ndarray] = []
    step = w.sampler.env.step

    def recording_step(actions: np.ndarray) -> Any:
        out = step(actions)
        term, trunc, infos = out[2], out[3], out[4]
        cut = trunc & ~term
        if cut.any():
            captured.append(np.stack(list(infos["final_obs"][cut])))
        return out

    w.sampler.env.step = recording_step  # type: ignore[method-assign]
    f = w.sample()
    cut = f.truncateds & ~f.terminateds
    assert cut.any(), "episodes of 7 steps must be truncated inside a 20-step fragment"
    # One row per cut step, in (t, b) order, holding the observation the episode ended in (the
    # learner values it with its own, current network).
    np.testing.assert_array_equal(f.final_steps, np.argwhere(cut))
    np.testing.assert_array_equal(f.final_obs, np.concatenate(captured))
    assert f.final_steps.dtype == np.int64 and f.final_obs.dtype == f.obs.dtype


def test_fragment_without_time_limits_has_no_final_obs() -> None:
    f = RolloutWorker(make_spec(CARTPOLE), "w0", seed=4).sample()
    assert f.final_obs.shape == (0, 4) and f.final_steps.shape == (0, 2)


def test_set_weights_changes_policy_and_version() -> None:
    a = RolloutWorker(make_spec(CARTPOLE), "a", seed=0)
    b = RolloutWorker(make_spec(CARTPOLE), "b", seed=1)
    weights = {k: v * 3.0 for k, v in acting_weights(b).items()}
    a.set_weights(policy_layout(DEFAULT_POLICY, weights, 9), policy_version=9)
    for k, v in acting_weights(a).items():
        np.testing.assert_array_equal(v, weights[k])
    assert a.sample().policy_version == 9


def test_set_weights_takes_the_learners_pickled_broadcast() -> None:
    """Small broadcasts arrive pickled (`PolicySetState.pickled_weights`): the same weights as
    the dict, at their policy's version."""
    spec = make_spec(CARTPOLE)
    worker = RolloutWorker(spec, "a", seed=0)
    learner = Learner(LearnerConfig.of(spec), worker.models["default"].obs_shape,
                      worker.models["default"].actions)  # fmt: skip
    learner.policy_version = 4
    worker.set_weights(PolicySetState({DEFAULT_POLICY: learner}).pickled_weights(), 4)
    got, want = acting_weights(worker), learner.get_weights()
    assert got.keys() == want.keys()
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v)
    assert worker.policy_version == 4
    assert learner.weights_nbytes() == sum(v.nbytes for v in want.values())


def test_a_fragment_carries_the_seconds_its_worker_spent_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """busy_seconds: the sampling, plus weights loaded since the last fragment, once."""
    worker = RolloutWorker(make_spec(CARTPOLE), "a", seed=0)
    start = time.perf_counter()
    first = worker.sample()
    assert 0.0 < first.busy_seconds <= time.perf_counter() - start
    assert first.meta().busy_seconds == first.busy_seconds

    load = worker.policies["default"].load

    def slow_load(arrays: Any) -> None:
        time.sleep(0.05)
        load(arrays)

    monkeypatch.setattr(worker.policies["default"], "load", slow_load)
    start = time.perf_counter()
    worker.set_weights(worker.get_weights(), policy_version=1)
    loading = time.perf_counter() - start
    time.sleep(0.05)  # idle: waiting for a request is not work
    start = time.perf_counter()
    loaded = worker.sample()
    sampling = time.perf_counter() - start
    assert 0.05 <= loaded.busy_seconds <= loading + sampling
    start = time.perf_counter()
    after = worker.sample()
    assert after.busy_seconds <= time.perf_counter() - start  # the loading counted once


def test_same_seed_same_fragment() -> None:
    f1 = RolloutWorker(make_spec(CARTPOLE), "a", seed=5).sample()
    f2 = RolloutWorker(make_spec(CARTPOLE), "a", seed=5).sample()
    np.testing.assert_array_equal(f1.actions, f2.actions)
    np.testing.assert_array_equal(f1.obs, f2.obs)


def test_atari_worker_fragment_is_uint8_frames() -> None:
    spec = make_spec(
        env={"id": "ALE/Pong-v5", "numEnvsPerWorker": 2},
        model={"hidden": [32]},
        training={"rolloutFragmentLength": 4},
    )
    w = RolloutWorker(spec, "p", seed=0)
    f = w.sample()
    assert f.obs.shape == (4, 2, 4, 84, 84) and f.obs.dtype == np.uint8
    assert f.behaviour_logits.shape == (4, 2, 6)
    assert f.bootstrap_obs.shape == (2, 4, 84, 84)


@pytest.mark.parametrize(("precision", "flags"), [("auto", {"avx512_bf16"}), ("auto", set())])
def test_behaviour_logits_are_the_learners_own_arithmetic(
    monkeypatch: pytest.MonkeyPatch, precision: str, flags: set[str]
) -> None:
    """Where the learner computes in bf16 (and this CPU does too) the worker acts in bf16, so a
    fragment's behaviour logits are what the learner's autocast forward gives for its frames;
    elsewhere they are the float32 model's."""
    monkeypatch.setattr(precision_module, "cpu_flags", lambda: frozenset(flags))
    spec = make_spec(
        env={"id": "ALE/Pong-v5", "numEnvsPerWorker": 2},
        model={"hidden": [32]},
        training={"rolloutFragmentLength": 3},
        learner={"precision": precision},
    )
    w = RolloutWorker(spec, "p", seed=0)
    f = w.sample()
    model = w.policies["default"].model
    bf16 = bool(flags)
    for t in range(3):
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            logits = model.policy_logits(torch.from_numpy(f.obs[t])).float().numpy()
        np.testing.assert_array_equal(f.behaviour_logits[t], logits)


def test_a3c_gradients_are_the_learner_gradients_of_the_sampled_fragment() -> None:
    from impala_trainer.batches import concat_fragments

    spec = make_spec(CARTPOLE)
    spec.training.mode = "async-gradients"
    acting = RolloutWorker(spec, "a", seed=11)
    # Same seed, same weights: the same fragment.
    twin = RolloutWorker(make_spec(CARTPOLE), "b", seed=11)
    twin.set_weights(acting.get_weights(), 0)
    gradients = acting.compute_gradients(global_timestep=0)
    grads = gradients.grads["default"]
    assert gradients.meta.env_steps == 120 and gradients.meta.policy_version == 0
    assert gradients.meta.busy_seconds > 0.0  # the sampling and the gradients
    assert set(gradients.stats) >= {"default/policy_loss", "default/vf_loss", "default/entropy"}
    built = acting.models["default"]
    learner = Learner(LearnerConfig.of(spec), built.obs_shape, built.actions)
    learner.set_weights(acting_weights(acting))
    expected, _ = learner.compute_gradients(concat_fragments([twin.sample()]))
    assert len(grads) == len(expected)
    for g, e in zip(grads, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)
    before = learner.get_weights()
    learner.apply_gradients(grads)
    assert learner.policy_version == 1
    assert any(not np.array_equal(before[k], v) for k, v in learner.get_weights().items())


def test_clipped_rewards_are_trained_on_and_unclipped_returns_reported() -> None:
    from gymnasium.vector import VectorRewardWrapper

    class Times5(VectorRewardWrapper):  # type: ignore[misc]
        def rewards(self, rewards: np.ndarray) -> np.ndarray:
            return rewards * 5.0

    for clip in (True, False):
        spec = make_spec(CARTPOLE, env={"clipRewards": clip, "numEnvsPerWorker": 4})
        worker = RolloutWorker(spec, "w", seed=1)
        worker.sampler.env = Times5(worker.sampler.env)
        fragment = worker.sample()
        while not fragment.episode_returns:
            fragment = worker.sample()
        assert set(np.unique(fragment.rewards)) == ({1.0} if clip else {5.0})
        # The report is the env's own return either way: 5 per step of the episode.
        assert fragment.episode_returns == [5.0 * n for n in fragment.episode_lengths]


def test_atari_clips_rewards_by_default_and_other_envs_do_not() -> None:
    assert make_spec(env={"id": "ALE/Pong-v5"}).env.clips_rewards
    assert not make_spec(env={"id": "CartPole-v1"}).env.clips_rewards
    assert not make_spec(env={"id": "ALE/Pong-v5", "clipRewards": False}).env.clips_rewards
