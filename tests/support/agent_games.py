"""Small PettingZoo envs whose every step says whose it was: for the multi-agent tests.

Each observation is `[agent index, step of the agent in its episode, episode number]`, so a
fragment column can be checked to be one agent's own trajectory, in order. Rewards are the
agent's index + 1 at every step, so a policy's batch shows which agents' steps it holds.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils import AgentSelector


def _obs_space() -> spaces.Box:
    return spaces.Box(0.0, 1e6, (3,), np.float32)


class Relay(ParallelEnv):  # type: ignore[misc]  # pettingzoo is untyped here
    """Parallel: agents `a_0`, `a_1` and `b_0`; `a_1` is done after `short` steps, the others
    after `long` (all of them terminated, or truncated when `truncate`)."""

    metadata: ClassVar[dict[str, Any]] = {"name": "relay_v0"}

    def __init__(self, short: int = 3, long: int = 7, truncate: bool = False) -> None:
        self.possible_agents = ["a_0", "a_1", "b_0"]
        self.short, self.long, self.truncate = short, long, truncate
        self.episode = -1

    def observation_space(self, agent: str) -> spaces.Box:
        return _obs_space()

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def _obs(self, agent: str) -> np.ndarray:
        index = self.possible_agents.index(agent)
        return np.array([index, self.steps[agent], self.episode], np.float32)

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        self.agents = list(self.possible_agents)
        self.steps = dict.fromkeys(self.agents, 0)
        self.episode += 1
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        obs, rewards, terms, truncs = {}, {}, {}, {}
        for agent in actions:
            self.steps[agent] += 1
            limit = self.short if agent == "a_1" else self.long
            done = self.steps[agent] >= limit
            rewards[agent] = float(self.possible_agents.index(agent) + 1)
            terms[agent] = done and not self.truncate
            truncs[agent] = done and self.truncate
            obs[agent] = self._obs(agent)
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, {a: {} for a in actions}


def relay(**kwargs: Any) -> Relay:
    return Relay(**kwargs)


class Turns(AECEnv):  # type: ignore[misc]
    """AEC: `first` and `second` move in turn; the game ends after `moves` moves in all (so with
    an odd count the first mover has one move more), the mover of the last move rewarded 1 and
    the other -1, every other move rewarded 0.1 to its mover."""

    metadata: ClassVar[dict[str, Any]] = {"name": "turns_v0"}

    def __init__(self, moves: int = 5, render_mode: str | None = None) -> None:
        super().__init__()
        self.possible_agents = ["first", "second"]
        self.moves = moves
        self.episode = -1
        self.render_mode = render_mode

    def render(self) -> np.ndarray | None:
        """An rgb_array frame whose brightness is the moves made so far (a film of the game)."""
        if self.render_mode != "rgb_array":
            return None
        return np.full((16, 24, 3), 40 * self.made, np.uint8)

    def observation_space(self, agent: str) -> spaces.Box:
        return _obs_space()

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def observe(self, agent: str) -> np.ndarray:
        index = self.possible_agents.index(agent)
        return np.array([index, self.own[agent], self.episode], np.float32)

    def reset(self, seed: int | None = None, options: Any = None) -> None:
        self.agents = list(self.possible_agents)
        self.own = dict.fromkeys(self.agents, 0)
        self.made = 0
        self.episode += 1
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.next()

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self.own[agent] += 1
        self.made += 1
        if self.made >= self.moves:
            other = next(a for a in self.agents if a != agent)
            self.rewards[agent], self.rewards[other] = 1.0, -1.0
            self.terminations = dict.fromkeys(self.agents, True)
        else:
            self.rewards[agent] = 0.1
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()


def turns(**kwargs: Any) -> Turns:
    return Turns(**kwargs)
