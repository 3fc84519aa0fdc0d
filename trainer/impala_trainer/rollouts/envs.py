"""Vector environments for rollout workers, all with same-step autoreset.

Every vector env returned here follows one contract (gymnasium's `AutoresetMode.SAME_STEP`): when
sub-env `i` ends at a step, that step already returns the *reset* observation for `i`, and
`infos["final_obs"][i]` / `infos["_final_obs"][i]` carry the observation the episode ended in.
The rollout worker relies on it: every recorded transition is a real one (no dummy step after a
reset) and time-limit truncations can be bootstrapped from the true final observation.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

from impala_api.spec import EnvSpec
from impala_trainer.rollouts import atari

if TYPE_CHECKING:
    from impala_trainer.learning.distributions import ActionDistribution
from impala_trainer.user_code import UserCodeError, import_env_module, wrapper_factories


class SameStepCartPole(VectorWrapper):  # type: ignore[misc]  # gymnasium is untyped here
    """gymnasium's numpy-vectorised CartPole with same-step autoreset, stepped in one pass.

    `CartPoleVectorEnv` (about 10x faster than a SyncVectorEnv of CartPoles) only offers next-step
    autoreset: the step after an episode ends ignores the action and returns the reset
    observation with reward 0. Recording that dummy transition would feed the learner an action
    that had no effect, so this wrapper resets finished sub-envs within the same step instead,
    with the draw `CartPoleVectorEnv` itself would make one step later, and reports the final
    observations in `infos` the way SyncVectorEnv does in SAME_STEP mode.

    `step` runs the inner env's physics itself, term for term as `CartPoleVectorEnv.step` (so
    states are bit-identical; tests/unit/trainer/test_envs.py checks it), without what same-step
    reset makes dead weight: the action-space check (rollout workers act by argmax over the
    logits, always in range) and the next-step reset pass. 32 envs, wrapper included: ~45 -> ~30
    us per step, i.e. ~0.5 us of a CartPole worker's ~4 us of CPU per env step.
    """

    def __init__(self, env: CartPoleVectorEnv) -> None:
        super().__init__(env)
        self.metadata = {**env.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}
        self._cartpole: CartPoleVectorEnv = env.unwrapped
        e = self._cartpole
        if e.kinematics_integrator != "euler":
            raise ValueError("SameStepCartPole implements CartPole's default euler integrator")
        self._forces = np.array([-e.force_mag, e.force_mag])  # np.sign(action - 0.5) * force_mag

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        e = self._cartpole
        x, x_dot, theta, theta_dot = e.state
        force = self._forces[actions]
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        temp = (force + e.polemass_length * np.square(theta_dot) * sintheta) / e.total_mass
        thetaacc = (e.gravity * sintheta - costheta * temp) / (
            e.length * (4.0 / 3.0 - e.masspole * np.square(costheta) / e.total_mass)
        )
        xacc = temp - e.polemass_length * thetaacc * costheta / e.total_mass
        state = np.stack(
            (
                x + e.tau * x_dot,
                x_dot + e.tau * xacc,
                theta + e.tau * theta_dot,
                theta_dot + e.tau * thetaacc,
            )
        )
        x, theta = state[0], state[2]
        terminated = (
            (x < -e.x_threshold)
            | (x > e.x_threshold)
            | (theta < -e.theta_threshold_radians)
            | (theta > e.theta_threshold_radians)
        )
        e.steps += 1
        truncated = e.steps >= e.max_episode_steps
        if e._sutton_barto_reward:
            rewards = -terminated.astype(np.float32)
        else:
            rewards = np.ones(e.num_envs, np.float32)
        obs = state.T.astype(np.float32)
        done = terminated | truncated
        infos: dict[str, Any] = {}
        if done.any():
            infos = {"final_obs": obs.copy(), "_final_obs": done}
            state[:, done] = e.np_random.uniform(low=e.low, high=e.high, size=(4, int(done.sum())))
            e.steps[done] = 0
            obs[done] = state[:, done].T
        e.state = state
        return obs, rewards, terminated, truncated, infos


class UnsupportedSpaceError(ValueError):
    """The env's observation or action space is one the trainer cannot (yet) learn from."""


# Observation spaces the trainer flattens into one float vector, as RLlib's default preprocessor
# does: Discrete one-hot, MultiDiscrete/MultiBinary as their one-hots/bits, Dict/Tuple their
# parts flattened and concatenated (gymnasium's `flatten_space`, Dict keys in their order).
FLATTENED = (
    gym.spaces.Discrete
    | gym.spaces.MultiDiscrete
    | gym.spaces.MultiBinary
    | gym.spaces.Dict
    | gym.spaces.Tuple
)


def check_spaces(observation: gym.Space[Any], action: gym.Space[Any]) -> None:
    """Raise UnsupportedSpaceError naming the space the trainer cannot take."""
    _check_action(action)
    _check_observation(observation)


def _check_action(space: gym.Space[Any]) -> None:
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        if np.any(space.start != 0):
            raise UnsupportedSpaceError(
                f"action space {space} does not start at 0: wrap the env to shift its actions"
            )
        return
    if isinstance(space, gym.spaces.MultiBinary):
        return
    if isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating):
        return
    raise UnsupportedSpaceError(
        f"action space {space} is not supported: actions must be Discrete, MultiDiscrete, "
        "MultiBinary or a float Box (Dict and Tuple actions: flatten them in a wrapper)"
    )


def _check_observation(space: gym.Space[Any]) -> None:
    if isinstance(space, gym.spaces.Dict):
        parts = list(space.spaces.values())
    elif isinstance(space, gym.spaces.Tuple):
        parts = list(space.spaces)
    elif isinstance(space, gym.spaces.Box | FLATTENED):
        return
    else:
        raise UnsupportedSpaceError(
            f"observation space {space} is not supported: observations must be Box, "
            "Discrete, MultiDiscrete, MultiBinary, or a Dict/Tuple of them"
        )
    for part in parts:
        _check_observation(part)


def _made(env: EnvSpec, wrappers: list[Any], **kwargs: Any) -> gym.Env:
    """gymnasium's env for `env.id`, inside the job's own wrappers (innermost first), its
    observations flattened to one vector unless they are a Box already."""
    made = gym.make(env.id, **kwargs)
    for wrap in wrappers:
        made = wrap(made)
    check_spaces(made.observation_space, made.action_space)
    if isinstance(made.observation_space, FLATTENED):
        # float32, as a Box of the model's own: gymnasium's flattening widens mixed parts
        # (one-hots are int64) to float64, twice the bytes every fragment ships.
        made = gym.wrappers.FlattenObservation(made)
        flat = made.observation_space
        space = gym.spaces.Box(flat.low.astype(np.float32), flat.high.astype(np.float32))
        made = gym.wrappers.TransformObservation(made, lambda o: o.astype(np.float32), space)
    return made


def _single_thunk(env: EnvSpec, wrappers: list[Any], **extra: Any) -> Any:
    def make() -> gym.Env:
        return _made(env, wrappers, **{**env.kwargs, **extra})

    return make


def _has_numpy_cartpole(env: EnvSpec) -> bool:
    if env.wrappers:  # the wrappers wrap single envs: no vector fast path under them
        return False
    try:
        spec = gym.spec(env.registered_id)
    except gym.error.Error:
        return False
    entry = spec.vector_entry_point
    return isinstance(entry, str) and entry.endswith(":CartPoleVectorEnv")


def make_vector_env(env: EnvSpec, num_envs: int, seed: int, render: bool = False) -> VectorEnv:
    """A same-step-autoreset vector env of `num_envs` copies of `env`, reset with `seed`.

    CartPole uses gymnasium's numpy-vectorised implementation; Atari (`ALE/...`) gives uint8
    observations `[stack, 84, 84]` (84x84 grayscale, frame skip from the spec), from ale-py's C++
    `AtariVectorEnv` where it can, else from the same preprocessing as Python wrappers in a
    SyncVectorEnv (`atari.py` says when and how the two agree); anything else is a SyncVectorEnv.
    Sync beats AsyncVectorEnv for the Python stack on a worker that owns about one core
    (measured: ~570 vs ~300 env steps/s for 8 Pong envs): the subprocess hand-off costs more than
    it overlaps.

    `render`: every env made with `render_mode="rgb_array"` in a SyncVectorEnv, so
    `vec.envs[i].render()` gives env i's frame as the user would see it (the full RGB screen of
    an Atari game, not the 84x84 observation); for evaluation videos.
    """
    import_env_module(env)
    wrappers = wrapper_factories(env)
    extra = {"render_mode": "rgb_array"} if render else {}
    vec: VectorEnv
    if atari.uses_vector_env(env, render):
        vec = atari.vector_env(env, num_envs)
    elif env.is_atari:
        vec = atari.wrapper_stack(env, num_envs, functools.partial(_made, env, wrappers), extra)
    elif _has_numpy_cartpole(env) and not render:
        inner = gym.make_vec(
            env.id, num_envs=num_envs, vectorization_mode="vector_entry_point", **env.kwargs
        )
        vec = SameStepCartPole(inner)
    else:
        vec = gym.vector.SyncVectorEnv(
            [_single_thunk(env, wrappers, **extra) for _ in range(num_envs)],
            autoreset_mode=AutoresetMode.SAME_STEP,
        )
    vec.reset(seed=seed)
    return vec


def env_problem(env: EnvSpec) -> tuple[str, str] | None:
    """Why `env` cannot be made, as (its field under spec.env, the reason): a module of the id
    or a wrapper that does not import, an unknown id, a missing ROM package; None when it can."""
    try:
        import_env_module(env)
        wrapper_factories(env)
        if env.is_atari:
            atari.register()
        gym.spec(env.registered_id)
    except UserCodeError as err:
        return err.field, str(err)
    except (gym.error.Error, ImportError) as err:
        return "id", str(err)
    if env.is_atari:  # ALE's spaces are known; making one costs a ROM load
        return None
    try:
        _single_thunk(env, wrapper_factories(env))().close()
    except UnsupportedSpaceError as err:
        return "id", str(err)
    except Exception as err:  # the user's env or wrapper may raise anything while it is made
        where = "kwargs" if env.kwargs else "id"
        return where, f"making {env.id} failed: {type(err).__name__}: {err}"
    return None


def final_observations(infos: dict[str, Any], mask: np.ndarray) -> np.ndarray:
    """Stack the final observations of the sub-envs selected by `mask` (from a same-step info)."""
    rows = infos["final_obs"][mask]
    return np.stack(list(rows))


class EnvSpaces(NamedTuple):
    """What the learner's model is built for."""

    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    actions: ActionDistribution
    action_space: gym.Space[Any]


def env_spaces(env: EnvSpec, squash_actions: bool | None = None) -> EnvSpaces:
    """The observation shape and dtype and the action distribution of `env`, from a throwaway
    instance (`squash_actions`: spec.model.squashActions, for a Box)."""
    # Here, not at the top: `impalajob validate` imports this module and must not load torch.
    from impala_trainer.learning.distributions import action_distribution

    vec = make_vector_env(env, 1, seed=0)
    try:
        obs, space = vec.single_observation_space, vec.single_action_space
        check_spaces(obs, space)
        assert obs.shape is not None
        actions = action_distribution(space, squash_actions)
        return EnvSpaces(tuple(obs.shape), np.dtype(obs.dtype), actions, space)
    finally:
        vec.close()
