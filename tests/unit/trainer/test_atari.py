"""Atari on ale-py's C++ AtariVectorEnv against the Python wrapper stack it replaces.

Same seeds, same actions, no sticky actions and no no-op starts: the two must agree bit for bit
(observations with their frame-stack padding, rewards, terminations, truncations, final
observations). What each randomises on its own (no-op counts, sticky repeats) is checked apart.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from impala_api.spec import EnvSpec
from impala_trainer.rollouts import atari
from impala_trainer.rollouts.envs import _made, final_observations, make_vector_env
from impala_trainer.rollouts.worker import RolloutWorker
from tests.support.jobs import make_spec

# 400 frames = 100 agent steps: truncations come quickly. A random Breakout player loses its
# five lives (a termination) in ~180 steps; a random Pong player needs ~840.
SHORT = {"max_num_frames_per_episode": 400}
NAMES = ("obs", "reward", "terminated", "truncated")


def both(env: EnvSpec, num_envs: int, *, noop_max: int = 0) -> tuple[Any, Any]:
    """(the C++ vector env, the wrapper stack) for `env`, reset with the same seed."""
    fast = atari.vector_env(env, num_envs, noop_max=noop_max)
    slow = atari.wrapper_stack(env, num_envs, functools.partial(_made, env, []), noop_max=noop_max)
    return fast, slow


@pytest.mark.parametrize(
    "game,kwargs,steps",
    [("Pong", SHORT, 220), ("Breakout", {}, 260)],
    ids=["pong-truncations", "breakout-terminations"],
)
def test_the_vector_env_is_the_wrapper_stack_bit_for_bit(
    game: str, kwargs: dict, steps: int
) -> None:
    env = EnvSpec(id=f"ALE/{game}-v5", kwargs={"repeat_action_probability": 0.0, **kwargs})
    fast, slow = both(env, 2)
    o_fast, _ = fast.reset(seed=7)
    o_slow, _ = slow.reset(seed=7)
    np.testing.assert_array_equal(o_fast, o_slow)
    assert o_fast[:, 0].any()  # the padding slots hold the reset frame, not zeros
    rng = np.random.default_rng(0)
    ends = {"terminated": 0, "truncated": 0}
    for t in range(steps):
        actions = rng.integers(0, fast.single_action_space.n, 2)
        r_fast, r_slow = fast.step(actions), slow.step(actions)
        for name, a, b in zip(NAMES, r_fast[:4], r_slow[:4], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{name} at step {t}")
        assert r_fast[1].dtype == np.float32
        done = r_fast[2] | r_fast[3]
        if done.any():
            np.testing.assert_array_equal(
                final_observations(r_fast[4], done), final_observations(r_slow[4], done)
            )
            ends["terminated"] += int(r_fast[2].sum())
            ends["truncated"] += int(r_fast[3].sum())
    key = "truncated" if kwargs else "terminated"
    assert ends[key] >= 2, ends


def test_an_episode_shorter_than_the_stack_is_padded_in_its_final_observation() -> None:
    env = EnvSpec(id="ALE/Pong-v5", kwargs={"repeat_action_probability": 0.0,
                                          "max_num_frames_per_episode": 8})  # fmt: skip
    fast, slow = both(env, 2)
    fast.reset(seed=1)
    slow.reset(seed=1)
    for _ in range(5):  # episodes of 2 steps: every final and reset stack is a young one
        actions = np.array([2, 3])
        r_fast, r_slow = fast.step(actions), slow.step(actions)
        np.testing.assert_array_equal(r_fast[0], r_slow[0])
        if r_fast[3].any():
            np.testing.assert_array_equal(
                final_observations(r_fast[4], r_fast[3]), final_observations(r_slow[4], r_slow[3])
            )


def test_no_op_starts_are_drawn_per_env_one_frame_earlier_than_the_wrapper() -> None:
    """The one documented difference: 0..noop_max-1 no-op frames (AtariPreprocessing: 1..noop_max),
    read back from the engine's own frame counter."""
    vec = atari.vector_env(EnvSpec(id="ALE/Pong-v5"), 4)
    vec.reset(seed=0)  # seeded once (a seeded reset reloads the ROM: slow), so the same 200
    # draws on every run: no flake.
    frames = np.concatenate([vec.env.reset()[1]["episode_frame_number"] for _ in range(50)])
    assert frames.min() == 0 and frames.max() == atari.NOOP_MAX - 1
    assert len(set(frames.tolist())) > 20  # drawn per env, about uniformly


def test_the_options_follow_the_registered_id_and_the_jobs_kwargs() -> None:
    pong = atari.game_options(EnvSpec(id="ALE/Pong-v5"))
    assert pong["game"] == "pong" and pong["repeat_action_probability"] == atari.STICKY
    assert pong["full_action_space"] is False and pong["max_num_frames_per_episode"] == 108_000
    own = atari.game_options(
        EnvSpec(id="ALE/Breakout-v5",
                kwargs={"repeat_action_probability": 0.0, "full_action_space": True})
    )  # fmt: skip
    assert (own["game"], own["repeat_action_probability"], own["full_action_space"]) == (
        "breakout", 0.0, True,
    )  # fmt: skip
    assert make_vector_env(EnvSpec(id="ALE/Breakout-v5", kwargs={"full_action_space": True}),
                           1, seed=0).single_action_space.n == 18  # fmt: skip


def test_what_the_vector_env_cannot_do_goes_to_the_wrapper_stack() -> None:
    pong = EnvSpec(id="ALE/Pong-v5")
    assert isinstance(make_vector_env(pong, 2, seed=0), atari.SameStepAtari)
    assert atari.uses_vector_env(pong) and not atari.uses_vector_env(pong, render=True)
    stats = {"import": "gymnasium.wrappers:RecordEpisodeStatistics"}
    own_wrapper = EnvSpec(id="ALE/Pong-v5", wrappers=[stats])
    assert not atari.uses_vector_env(own_wrapper)
    mode = EnvSpec(id="ALE/Pong-v5", kwargs={"mode": 1})
    assert not atari.uses_vector_env(mode)
    assert isinstance(make_vector_env(mode, 1, seed=0), gym.vector.SyncVectorEnv)
    rendered = make_vector_env(pong, 1, seed=0, render=True)
    assert rendered.envs[0].render().shape == (210, 160, 3)


def test_returns_are_the_games_and_the_learner_sees_them_clipped() -> None:
    """Space Invaders scores 5-30 per alien: clipped rewards and unclipped returns differ."""
    spec = make_spec(
        {"env": {"id": "ALE/SpaceInvaders-v5", "numEnvsPerWorker": 4},
         "model": {"type": "cnn"}},
        training={"rolloutFragmentLength": 50, "trainBatchSize": 200},
    )  # fmt: skip
    worker = RolloutWorker(spec, "w0", seed=0)
    assert isinstance(worker.sampler.env, atari.SameStepAtari)
    rewards, returns = [], []
    while len(returns) < 2:
        fragment = worker.sample()
        rewards.append(fragment.rewards)
        returns.extend(fragment.episode_returns)
    seen = np.unique(np.concatenate(rewards))
    assert set(seen.tolist()) <= {0.0, 1.0} and 1.0 in seen
    assert max(returns) > 20 and all(r == int(r) for r in returns)
