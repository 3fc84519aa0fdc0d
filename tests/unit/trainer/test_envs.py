"""Vector envs: same-step autoreset for the numpy CartPole, Atari preprocessing shapes."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from impala_api.spec import EnvSpec
from impala_trainer.learning.distributions import Categorical
from impala_trainer.rollouts.envs import (
    env_problem,
    env_spaces,
    final_observations,
    make_vector_env,
)

X_LIMIT = 2.4
THETA_LIMIT = 12 * 2 * np.pi / 360


def test_cartpole_uses_numpy_vector_env_with_same_step_autoreset() -> None:
    env = make_vector_env(EnvSpec(id="CartPole-v1"), 8, seed=0)
    assert type(env.unwrapped).__name__ == "CartPoleVectorEnv"
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP


def test_terminated_envs_reset_in_the_same_step() -> None:
    env = make_vector_env(EnvSpec(id="CartPole-v1"), 16, seed=1)
    actions = np.ones(16, np.int64)  # always push right: every episode falls within ~10 steps
    seen_done = 0
    for _ in range(60):
        obs, rewards, term, trunc, infos = env.step(actions)
        assert (rewards == 1.0).all(), "a dummy step after reset would give reward 0"
        if term.any():
            seen_done += int(term.sum())
            assert (infos["_final_obs"] == (term | trunc)).all()
            final = final_observations(infos, term)
            out = (np.abs(final[:, 0]) > X_LIMIT) | (np.abs(final[:, 2]) > THETA_LIMIT)
            assert out.all(), "final observations of terminated episodes must be out of bounds"
            # The returned observation is already the fresh reset state.
            assert (np.abs(obs[term]) <= 0.05).all()
    assert seen_done >= 16


def test_truncation_every_max_episode_steps_without_dummy_steps() -> None:
    env = make_vector_env(EnvSpec(id="CartPole-v1", kwargs={"max_episode_steps": 5}), 4, 2)
    trunc_steps = []
    for t in range(20):
        # Alternate actions so the pole stays up and only the time limit ends episodes.
        _, _, term, trunc, infos = env.step(np.full(4, t % 2, np.int64))
        assert not term.any()
        if trunc.any():
            assert trunc.all()
            assert final_observations(infos, trunc).shape == (4, 4)
            trunc_steps.append(t)
    # A next-step autoreset would make every episode after the first one step longer.
    assert trunc_steps == [4, 9, 14, 19]


@pytest.mark.parametrize("kwargs", [{}, {"sutton_barto_reward": True, "max_episode_steps": 40}])
def test_cartpole_steps_are_gymnasiums_bit_for_bit(kwargs: dict[str, object]) -> None:
    """Our one-pass step against CartPoleVectorEnv.step itself, with the same-step reset done
    after it as gymnasium would do it one step later (the same random draw)."""
    import gymnasium as gym

    n = 16
    ours = make_vector_env(EnvSpec(id="CartPole-v1", kwargs=kwargs), n, seed=3)
    ref = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point", **kwargs)
    ref.reset(seed=3)
    inner = ref.unwrapped
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(ours.unwrapped.state, inner.state)  # type: ignore[attr-defined]
    ends = 0
    for _ in range(600):
        actions = rng.integers(0, 2, n)
        obs, rewards, term, trunc, infos = ours.step(actions)
        r_obs, r_rewards, r_term, r_trunc, _ = ref.step(actions)
        np.testing.assert_array_equal(rewards, r_rewards)
        np.testing.assert_array_equal(term, r_term)
        np.testing.assert_array_equal(trunc, r_trunc)
        done = r_term | r_trunc
        if done.any():
            ends += int(done.sum())
            np.testing.assert_array_equal(infos["final_obs"][done], r_obs[done])
            inner.state[:, done] = inner.np_random.uniform(
                low=inner.low, high=inner.high, size=(4, int(done.sum()))
            )
            inner.steps[done] = 0
            inner.prev_done[done] = False
            r_obs[done] = inner.state[:, done].T
        np.testing.assert_array_equal(obs, r_obs)
        np.testing.assert_array_equal(ours.unwrapped.state, inner.state)  # type: ignore[attr-defined]
    assert ends > 100


def test_same_seed_same_trajectory() -> None:
    a = make_vector_env(EnvSpec(id="CartPole-v1"), 4, seed=7)
    b = make_vector_env(EnvSpec(id="CartPole-v1"), 4, seed=7)
    for _ in range(30):
        act = np.ones(4, np.int64)
        oa, *_ = a.step(act)
        ob, *_ = b.step(act)
        np.testing.assert_array_equal(oa, ob)


def test_other_envs_use_sync_vector_env_same_step() -> None:
    env = make_vector_env(EnvSpec(id="Acrobot-v1"), 2, seed=0)
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    spaces = env_spaces(EnvSpec(id="Acrobot-v1"))
    assert (spaces.obs_shape, spaces.actions) == ((6,), Categorical(3))


def test_atari_preprocessing_and_frame_stack() -> None:
    # ale-py and cv2 are the project's own dependencies: a missing one fails here, never skips.
    spec = EnvSpec(id="ALE/Pong-v5")
    env = make_vector_env(spec, 2, seed=0)
    obs, *_ = env.step(np.zeros(2, np.int64))
    assert obs.shape == (2, 4, 84, 84)
    assert obs.dtype == np.uint8
    spaces = env_spaces(spec)
    assert (spaces.obs_shape, spaces.obs_dtype) == ((4, 84, 84), np.uint8)
    assert spaces.actions == Categorical(6)
    env.close()


def test_env_problem_names_unknown_ids() -> None:
    assert env_problem(EnvSpec(id="CartPole-v1")) is None
    assert env_problem(EnvSpec(id="ALE/Pong-v5")) is None
    problem = env_problem(EnvSpec(id="NoSuchEnv-v0"))
    assert problem is not None and problem[0] == "id" and "NoSuchEnv" in problem[1]
