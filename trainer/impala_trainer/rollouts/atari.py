"""Atari for rollout workers: ale-py's C++ `AtariVectorEnv`, or the Python wrapper stack.

Both give the same observations: `[stack, 84, 84]` uint8, grayscale, frame skip with max-pooling
over the last two frames, random no-op frames at each reset (the C++ env plays 0..noop_max-1,
AtariPreprocessing 1..noop_max: the one difference), sticky actions, no episodic
life, no FIRE at reset, unclipped rewards, truncation at the game's frame limit, and same-step
autoreset with the final observation in `infos`. Given the same seeds, actions, no sticky actions
and no no-ops, the two are bit-identical (tests/unit/trainer/test_atari.py); with them, each draws
its no-op counts and sticky repeats from its own random stream.

`AtariVectorEnv` (a thread pool derived from EnvPool) does the emulation and all preprocessing in
C++, with no Python per env step: the rollout worker's fast path. The wrapper stack stays for
what the vector env cannot do: the job's own wrappers (they wrap single envs), rendering the full
RGB screen (evaluation videos), and ALE options it does not take (`mode`, `difficulty`, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

from impala_api.spec import EnvSpec

NOOP_MAX = 30
"""No-op frames at most at each reset (the DQN/IMPALA papers' random starts)."""

STICKY = 0.25
"""ALE v5's sticky-action probability, the default unless env.kwargs sets one."""

VECTOR_KWARGS = frozenset(
    {"repeat_action_probability", "full_action_space", "max_num_frames_per_episode", "frameskip"}
)
"""env.kwargs the C++ vector env takes (`frameskip` is ignored: spec.env.frameSkip decides)."""


def register() -> None:
    """Register the ALE/ ids with gymnasium (idempotent)."""
    import ale_py

    gym.register_envs(ale_py)


def game_options(env: EnvSpec) -> dict[str, Any]:
    """The ALE options the job runs with: the registered id's defaults, then env.kwargs, with
    sticky actions at `STICKY` unless the job sets them."""
    register()
    options = {**gym.spec(env.registered_id).kwargs, "repeat_action_probability": STICKY}
    return {**options, **env.kwargs}


def uses_vector_env(env: EnvSpec, render: bool = False) -> bool:
    """Whether `env` runs on the C++ vector env (see the module docstring for when it cannot)."""
    return env.is_atari and not env.wrappers and not render and set(env.kwargs) <= VECTOR_KWARGS


class SameStepAtari(VectorWrapper):  # type: ignore[misc]  # gymnasium is untyped here
    """`AtariVectorEnv` in SAME_STEP mode, made to look exactly like the wrapper stack.

    What it changes: after a reset the C++ stack holds zeros where no frame exists yet, while
    gymnasium's `FrameStackObservation` repeats the reset frame there (its default padding), so
    the first `stack - 1` observations of every episode (and a final observation of an episode
    shorter than that) get those slots filled with the oldest real frame; rewards become float32;
    `infos` carries only `final_obs` / `_final_obs`, as the worker reads them.
    """

    def __init__(self, env: VectorEnv, stack: int) -> None:
        super().__init__(env)
        self.metadata = {**env.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}
        self._stack = stack
        self._age = np.zeros(env.num_envs, np.int64)
        """Steps each env has taken since its reset, capped at stack - 1."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        obs, _ = self.env.reset(seed=seed, options=options)
        if options and "reset_mask" in options:
            self._age[options["reset_mask"]] = 0
        else:
            self._age[:] = 0
        self._pad(obs)
        return obs, {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        np.minimum(self._age + 1, self._stack - 1, out=self._age)
        done = terminated | truncated
        infos: dict[str, Any] = {}
        if done.any():
            final = info["final_obs"]
            self._pad(final)
            infos = {"final_obs": final, "_final_obs": done}
            self._age[done] = 0
        self._pad(obs)
        return obs, rewards.astype(np.float32), terminated, truncated, infos

    def _pad(self, obs: np.ndarray) -> None:
        """Fill the slots before each young episode's first frame with that frame."""
        for i in np.flatnonzero(self._age < self._stack - 1):
            first = self._stack - 1 - int(self._age[i])
            obs[i, :first] = obs[i, first]


def vector_env(env: EnvSpec, num_envs: int, *, noop_max: int = NOOP_MAX) -> VectorEnv:
    """`num_envs` copies of `env` on the C++ vector env, stepped by one thread of this process
    (a rollout worker owns about one core; more threads would only contend)."""
    from ale_py.vector_env import AtariVectorEnv

    options = game_options(env)
    inner = AtariVectorEnv(
        options["game"],
        num_envs,
        num_threads=1,
        repeat_action_probability=float(options["repeat_action_probability"]),
        full_action_space=bool(options.get("full_action_space", False)),
        max_num_frames_per_episode=int(options.get("max_num_frames_per_episode", 108_000)),
        autoreset_mode=AutoresetMode.SAME_STEP,
        frameskip=env.frame_skip,
        stack_num=env.stacked_frames,
        img_height=84,
        img_width=84,
        grayscale=True,
        maxpool=True,
        noop_max=noop_max,
        episodic_life=False,
        reward_clipping=False,  # the worker clips what the learner sees; returns stay the game's
        use_fire_reset=False,
    )
    return SameStepAtari(inner, env.stacked_frames)


def env_thunk(
    env: EnvSpec,
    make: Callable[..., gym.Env],
    extra: Mapping[str, Any] | None = None,
    *,
    noop_max: int = NOOP_MAX,
) -> Callable[[], gym.Env]:
    """A maker of one env of the wrapper stack: `make(**kwargs)` (the game inside the job's
    wrappers, `extra` added to its kwargs) under AtariPreprocessing and frame stacking."""

    def thunk() -> gym.Env:
        from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

        # AtariPreprocessing does the frame skipping (with max-pooling over the last two frames),
        # so the ALE env itself must not skip.
        kwargs = {"repeat_action_probability": STICKY, **env.kwargs, **(extra or {})}
        kwargs["frameskip"] = 1
        base = AtariPreprocessing(
            make(**kwargs),
            noop_max=noop_max,
            frame_skip=env.frame_skip,
            screen_size=84,
            terminal_on_life_loss=False,
            grayscale_obs=True,
            scale_obs=False,
        )
        return FrameStackObservation(base, env.stacked_frames)

    return thunk


def wrapper_stack(
    env: EnvSpec,
    num_envs: int,
    make: Callable[..., gym.Env],
    extra: Mapping[str, Any] | None = None,
    *,
    noop_max: int = NOOP_MAX,
) -> VectorEnv:
    """`num_envs` envs of the wrapper stack (see `env_thunk`) in a same-step SyncVectorEnv."""
    register()
    return gym.vector.SyncVectorEnv(
        [env_thunk(env, make, extra, noop_max=noop_max) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
