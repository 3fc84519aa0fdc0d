"""The wrappers the trainer ships for `env.wrappers`: StatelessCartPole's two, and ScaleRewards."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

from impala_trainer.rollouts.wrappers import KeepObservations, RescaleObservations, ScaleRewards


def test_keep_observations_keeps_the_listed_entries_and_their_bounds() -> None:
    full = gym.make("CartPole-v1")
    kept = KeepObservations(gym.make("CartPole-v1"), [0, 2])
    obs, _ = kept.reset(seed=3)
    np.testing.assert_array_equal(obs, full.reset(seed=3)[0][[0, 2]])
    assert kept.observation_space.shape == (2,)
    assert kept.observation_space.high.tolist() == pytest.approx([4.8, 0.41887903])
    with pytest.raises(ValueError, match="within"):
        KeepObservations(gym.make("CartPole-v1"), [4])


def test_rescale_observations_maps_the_bounds_to_the_unit_box_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # gymnasium's own, given floats, warns on float64 bounds
        env = RescaleObservations(KeepObservations(gym.make("CartPole-v1"), [0, 2]))
    space = env.observation_space
    assert space.dtype == np.float32 and space.low.tolist() == [-1, -1]
    obs, _ = env.reset(seed=0)
    raw = KeepObservations(gym.make("CartPole-v1"), [0, 2]).reset(seed=0)[0]
    np.testing.assert_allclose(obs, raw / np.array([4.8, 0.41887903]), rtol=1e-5)
    with pytest.raises(ValueError, match="finite bounds"):
        RescaleObservations(gym.make("CartPole-v1"))  # the velocities are unbounded


def test_scale_rewards_multiplies_every_reward() -> None:
    env = ScaleRewards(gym.make("CartPole-v1"), 1000.0)
    env.reset(seed=0)
    _, reward, *_ = env.step(0)
    assert reward == 1000.0
