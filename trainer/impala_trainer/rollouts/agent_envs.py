"""PettingZoo envs (spec.env.pettingzoo): made from the manifest, their agents mapped to
policies, their observations made the model's, stepped one turn at a time.

PettingZoo is the native API, both of its kinds behind one `AgentEnv`:

- a `ParallelEnv` (MPE's `parallel_env()`): every live agent acts at each step;
- an `AECEnv` (the classic games' `env()`): one agent acts at a time, `agent_selection`, and
  collects, when its turn comes round again, the rewards of everything that happened since it
  last acted (PettingZoo's `last()`); a finished agent's turn is a `step(None)`.

Either way a turn is "these agents see these observations and must act", and an agent's action
is completed by the next `Outcome` of that agent: its reward, whether its episode ended, and the
observation it would act on next. `rollouts.lanes` turns these into fragments.

An observation `Dict` with an `action_mask` (PettingZoo's classic games) is a mask, not an
input: the model sees the rest (its `observation` entry, or the other entries flattened) and the
acting distribution never samples a masked action.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from impala_api.spec import DEFAULT_POLICY, EnvSpec, ImpalaJobSpec, MultiAgentSpec
from impala_trainer.rollouts.envs import UnsupportedSpaceError, check_spaces, env_spaces
from impala_trainer.user_code import UserCodeError, import_module, resolve, wrapper_factories

if TYPE_CHECKING:
    from impala_trainer.learning.distributions import ActionDistribution

MASK_KEY = "action_mask"


class MappingError(ValueError):
    """An agent maps to no policy, or to one that does not exist; `field` is under spec."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def make_pettingzoo(env: EnvSpec, render: bool = False) -> Any:
    """A new env of spec.env.pettingzoo, called with spec.env.kwargs, inside spec.env.wrappers;
    with `render`, made with `render_mode="rgb_array"` (its `render()` then returns the frame).

    A module names PettingZoo's own layout: `parallel_env()` where the module has it, else
    `env()` (an AEC env); `module:constructor` names the callable."""
    from pettingzoo.utils.env import AECEnv, ParallelEnv

    assert env.pettingzoo is not None
    if ":" in env.pettingzoo:
        make = resolve(env.pettingzoo, "pettingzoo")
    else:
        module = import_module(env.pettingzoo, "pettingzoo")
        make = getattr(module, "parallel_env", None) or getattr(module, "env", None)
        if make is None:
            raise UserCodeError(
                "pettingzoo",
                f"module {env.pettingzoo!r} has neither parallel_env nor env: name its "
                "constructor as module:function",
            )
    if not callable(make):
        raise UserCodeError("pettingzoo", f"{env.pettingzoo} is not callable")
    try:
        made = make(**{**env.kwargs, **({"render_mode": "rgb_array"} if render else {})})
    except TypeError as err:
        if not render or "render_mode" not in str(err):
            raise
        raise UserCodeError(
            "evaluation.video",
            f"{env.pettingzoo} takes no render_mode: a video needs an env made with "
            "render_mode='rgb_array' whose render() returns its frame; drop evaluation.video",
        ) from None
    for wrap in wrapper_factories(env):
        made = wrap(made)
    if not isinstance(made, ParallelEnv | AECEnv):
        raise UserCodeError(
            "pettingzoo",
            f"{env.pettingzoo} made a {type(made).__name__}, not a PettingZoo ParallelEnv or "
            "AECEnv",
        )
    return made


def policy_mapping(agents: MultiAgentSpec) -> Callable[[str], str]:
    """agent id -> policy name, by policyMapping's first matching rule or policyMappingFn;
    MappingError naming the field when an agent maps to nothing or to an unknown policy."""
    if agents.policy_mapping_fn is not None:
        fn = resolve(agents.policy_mapping_fn, "policyMappingFn")
        where = "multiAgent.policyMappingFn"

        def by_function(agent: str) -> str:
            policy = fn(agent)
            if policy not in agents.policies:
                raise MappingError(
                    where, f"{agents.policy_mapping_fn} mapped agent {agent!r} to {policy!r}, "
                    f"which spec.multiAgent.policies does not define ({', '.join(agents.policies)})"
                )  # fmt: skip
            return str(policy)

        return by_function
    rules = agents.rules

    def by_rules(agent: str) -> str:
        for rule in rules:
            if fnmatch.fnmatchcase(agent, rule.agents):
                return rule.policy
        raise MappingError(
            "multiAgent.policyMapping",
            f"no rule maps agent {agent!r}: add a rule whose agents pattern matches it "
            "(agents: '*' catches every agent)",
        )

    return by_rules


@dataclass(frozen=True)
class AgentSpaces:
    """What one agent observes and does, as its policy's model sees it."""

    observation: gym.Space[Any]
    """The env's observation space for the agent (a Dict with its action_mask included)."""
    action: gym.Space[Any]
    model_observation: gym.spaces.Box
    """What the model takes: the observation without its mask, flattened to float32 unless it
    is a Box already."""
    masked: bool
    """The observation carries an action_mask."""


def agent_spaces(observation: gym.Space[Any], action: gym.Space[Any]) -> AgentSpaces:
    """An agent's spaces, checked as a single-agent env's are; UnsupportedSpaceError."""
    masked = isinstance(observation, gym.spaces.Dict) and MASK_KEY in observation.spaces
    inner = _unmasked(observation) if masked else observation
    check_spaces(inner, action)
    if masked:
        n = int(np.prod(observation[MASK_KEY].shape))
        if not isinstance(action, gym.spaces.Discrete) or int(action.n) != n:
            raise UnsupportedSpaceError(
                f"an action_mask of {n} entries needs a Discrete({n}) action space, not {action}"
            )
    if isinstance(inner, gym.spaces.Box):
        box = inner
    else:
        flat = gym.spaces.flatten_space(inner)
        box = gym.spaces.Box(flat.low.astype(np.float32), flat.high.astype(np.float32))
    return AgentSpaces(observation, action, box, masked)


def _unmasked(space: gym.spaces.Dict) -> gym.Space[Any]:
    rest = {k: v for k, v in space.spaces.items() if k != MASK_KEY}
    if list(rest) == ["observation"]:
        return rest["observation"]
    return gym.spaces.Dict(rest)


class ObservationAdapter:
    """An agent's observation as its model's input (and its action mask)."""

    def __init__(self, spaces: AgentSpaces) -> None:
        self.spaces = spaces
        inner = _unmasked(spaces.observation) if spaces.masked else spaces.observation
        self._inner = inner
        self._box = isinstance(inner, gym.spaces.Box)
        self.shape: tuple[int, ...] = tuple(spaces.model_observation.shape)
        self.dtype = np.dtype(inner.dtype) if self._box else np.dtype(np.float32)

    def model_input(self, obs: Any) -> np.ndarray:
        if self.spaces.masked:
            obs = {k: v for k, v in obs.items() if k != MASK_KEY}
            if list(obs) == ["observation"]:
                obs = obs["observation"]
        if self._box:
            return np.asarray(obs, self.dtype)
        return np.asarray(gym.spaces.flatten(self._inner, obs), np.float32)

    def mask(self, obs: Any) -> np.ndarray:
        """The actions `obs` allows (its action_mask: `spaces.masked` must hold)."""
        return np.asarray(obs[MASK_KEY], np.bool_).reshape(-1)


@dataclass
class Outcome:
    """What became of an agent's last action."""

    agent: str
    reward: float
    terminated: bool
    truncated: bool
    final_obs: Any = None
    """The observation a truncated (not terminated) agent's episode ended in."""


@dataclass
class Turn:
    """Who acts now, on what; and what became of the actions before."""

    acting: dict[str, Any] = field(default_factory=dict)
    """agent -> the observation it acts on."""
    outcomes: list[Outcome] = field(default_factory=list)
    episode_over: bool = False
    """Every agent is done: the env was reset and `acting` is the new episode's first turn."""


class AgentEnv:
    """One PettingZoo env, parallel or AEC, as a sequence of turns; reset when it ends."""

    def __init__(self, made: Any, seed: int) -> None:
        from pettingzoo.utils.env import ParallelEnv

        self.env = made
        self.parallel = isinstance(made, ParallelEnv)
        self.possible_agents: list[str] = list(made.possible_agents)
        self._seed = seed
        self._episodes = 0
        self._spaces: dict[str, AgentSpaces] = {}

    def spaces(self, agent: str) -> AgentSpaces:
        # Checked once per agent: a random player asks at every move.
        if agent not in self._spaces:
            observation, action = self.env.observation_space(agent), self.env.action_space(agent)
            self._spaces[agent] = agent_spaces(observation, action)
        return self._spaces[agent]

    def reset(self) -> Turn:
        """The first turn of a new episode (each episode its own seed, from the worker's)."""
        seed = self._seed + self._episodes
        self._episodes += 1
        if self.parallel:
            obs, _ = self.env.reset(seed=seed)
            return Turn(acting={a: obs[a] for a in self.env.agents})
        self.env.reset(seed=seed)
        return self._next_turn([])

    def step(self, actions: dict[str, Any]) -> Turn:
        """Take the acting agents' actions; the next turn."""
        if self.parallel:
            return self._parallel_step(actions)
        (agent,) = actions
        self.env.step(actions[agent])
        return self._next_turn([])

    def _parallel_step(self, actions: dict[str, Any]) -> Turn:
        obs, rewards, terms, truncs, _ = self.env.step(actions)
        outcomes = []
        for agent in actions:
            term, trunc = bool(terms.get(agent, False)), bool(truncs.get(agent, False))
            final = obs.get(agent) if trunc and not term else None
            outcomes.append(Outcome(agent, float(rewards.get(agent, 0.0)), term, trunc, final))
        live = [a for a in self.env.agents if not (terms.get(a) or truncs.get(a))]
        if not live:
            turn = self.reset()
            return Turn(turn.acting, outcomes, episode_over=True)
        return Turn({a: obs[a] for a in live}, outcomes)

    def _next_turn(self, outcomes: list[Outcome]) -> Turn:
        # An AEC env: the selected agent first collects what its last action earned; a finished
        # agent's turn is a step(None), which removes it; the episode ends when none is left.
        env = self.env
        while env.agents:
            agent = env.agent_selection
            obs, reward, term, trunc, _ = env.last()
            final = obs if trunc and not term else None
            outcomes.append(Outcome(agent, float(reward), bool(term), bool(trunc), final))
            if not (term or trunc):
                return Turn({agent: obs}, outcomes)
            env.step(None)
        turn = self.reset()
        return Turn(turn.acting, outcomes, episode_over=True)

    def close(self) -> None:
        self.env.close()


def random_action(env: AgentEnv, agent: str, obs: Any, rng: np.random.Generator) -> Any:
    """A uniformly random action of `agent`: among the actions its observation allows (an
    action_mask), else of its action space. The random opponent of games and of self-play."""
    spaces = env.spaces(agent)
    if spaces.masked:
        allowed = np.flatnonzero(ObservationAdapter(spaces).mask(obs))
        return int(rng.choice(allowed))
    space = spaces.action
    space.seed(int(rng.integers(2**31)))
    return space.sample()


def policy_spaces(
    spec: ImpalaJobSpec, env: AgentEnv | None = None
) -> dict[str, tuple[list[str], AgentSpaces]]:
    """policy -> (its agents, in possible_agents' order; their common spaces), for the policies
    some agent maps to; MappingError or UnsupportedSpaceError when an agent maps to nothing or
    two agents of one policy differ in their spaces."""
    own = env is None
    env = env or AgentEnv(make_pettingzoo(spec.env), seed=0)
    try:
        policy_of = policy_mapping(spec.agents)
        out: dict[str, tuple[list[str], AgentSpaces]] = {}
        for agent in env.possible_agents:
            policy = policy_of(agent)
            spaces = env.spaces(agent)
            if policy not in out:
                out[policy] = ([agent], spaces)
                continue
            agents, first = out[policy]
            if (first.observation, first.action) != (spaces.observation, spaces.action):
                raise MappingError(
                    "multiAgent.policyMapping",
                    f"agents {agents[0]!r} and {agent!r} both act by policy {policy!r} but "
                    f"differ in their spaces ({first.observation}, {first.action} against "
                    f"{spaces.observation}, {spaces.action}): map them to policies of their own",
                )
            agents.append(agent)
        return out
    finally:
        if own:
            env.close()


@dataclass(frozen=True)
class PolicyModel:
    """What a policy's learner and acting model are built for."""

    agents: list[str]
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    actions: ActionDistribution


def policy_models(spec: ImpalaJobSpec) -> dict[str, PolicyModel]:
    """policy -> its model's spaces, for every policy an agent of the env maps to (a gymnasium
    env's one policy, `default`, for its one agent)."""
    from impala_trainer.learning.distributions import action_distribution

    if not spec.env.is_pettingzoo:
        one = env_spaces(spec.env, spec.model.squash_actions)
        return {DEFAULT_POLICY: PolicyModel([], one.obs_shape, one.obs_dtype, one.actions)}
    out = {}
    for name, (agents, spaces) in policy_spaces(spec).items():
        adapter = ObservationAdapter(spaces)
        squash = spec.policy_spec(name).model.squash_actions
        dist = action_distribution(spaces.action, squash)
        out[name] = PolicyModel(agents, adapter.shape, adapter.dtype, dist)
    return out
