"""A multi-agent run's policy played against an opponent: whole games of its PettingZoo env,
won, drawn or lost (`impalajob evaluate --policy P --opponent random|POLICY`).

The policy takes each of its agents' seats in turn (the first mover, then the second, ...) and
every other agent acts by the opponent: `random` (a uniform choice among the actions its
observation allows), or a policy of the job, from the same checkpoint or another one (its own
earlier snapshot: `--opponent-checkpoint`). Greedy unless `explore`. A game is won when the
policy's agent ends with more reward than every other agent, drawn when it ties the best.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from impala_api.manifest import load_manifest
from impala_api.snapshot import CONFIG_FILE
from impala_api.spec import ImpalaJob
from impala_trainer.learning.acting import acting_policy
from impala_trainer.learning.distributions import (
    MASKED_LOGIT,
    ActionDistribution,
    action_distribution,
)
from impala_trainer.learning.model_factory import build_model
from impala_trainer.learning.models import ActorCritic
from impala_trainer.policy.loaded import PolicyNotFoundError, find_checkpoint
from impala_trainer.rollouts.agent_envs import (
    AgentEnv,
    ObservationAdapter,
    make_pettingzoo,
    policy_mapping,
    policy_spaces,
)
from impala_trainer.rundir.checkpoint import load_checkpoint

RANDOM = "random"


@dataclass
class GamePolicy:
    """One policy of a multi-agent run, ready to act."""

    name: str
    model: ActorCritic
    actions: ActionDistribution
    adapter: ObservationAdapter
    checkpoint: Path
    policy_version: int

    def __post_init__(self) -> None:
        self._logits = acting_policy(self.model)

    @torch.inference_mode()
    def act(self, obs: Any, rng: np.random.Generator, explore: bool) -> Any:
        logits = np.array(self._logits(self.adapter.model_input(obs)[None]), np.float32)
        if self.adapter.spaces.masked:
            logits[0, ~self.adapter.mask(obs)] = MASKED_LOGIT
        if explore:
            out = self.actions.empty_actions(1, 1)[0]
            self.actions.sample(logits, self.actions.noise(rng, 1, 1)[0], out)
        else:
            out = self.actions.greedy(logits)
        action = self.actions.to_env(out)[0]
        return action.item() if np.ndim(action) == 0 else action


def load_game_policies(run_dir: Path, checkpoint: str | None = None) -> dict[str, GamePolicy]:
    """Every policy of a multi-agent run's checkpoint (the newest, or `checkpoint`)."""
    config = run_dir / CONFIG_FILE
    if not config.is_file():
        raise PolicyNotFoundError(f"{run_dir} is not a run directory: it has no {CONFIG_FILE}")
    job = load_manifest(config)
    if not job.spec.env.multi_agent:
        raise PolicyNotFoundError(f"{run_dir} trained {job.spec.env.id}, not a PettingZoo env")
    path = find_checkpoint(run_dir, checkpoint)
    try:
        state, _ = load_checkpoint(path)
    except Exception as err:  # truncated, corrupt, not ours
        raise PolicyNotFoundError(f"{path} cannot be read: {err}") from None
    saved = state.get("policies", {})
    out = {}
    for name, (_agents, spaces) in policy_spaces(job.spec).items():
        adapter = ObservationAdapter(spaces)
        model_spec = job.spec.policy_spec(name).model
        dist = action_distribution(spaces.action, model_spec.squash_actions)
        model = build_model(model_spec, adapter.shape, dist)
        if name not in saved:
            raise PolicyNotFoundError(f"{path} holds no policy {name!r} ({', '.join(saved)})")
        model.load_state_dict(saved[name]["model"])
        model.float().eval()
        version = int(saved[name].get("policy_version", 0))
        out[name] = GamePolicy(name, model, dist, adapter, path, version)
    return out


@dataclass
class GameResults:
    games: int = 0
    wins: int = 0
    draws: int = 0
    losses: int = 0
    returns: list[float] | None = None

    @property
    def score(self) -> float:
        """Wins plus half the draws, per game."""
        return (self.wins + 0.5 * self.draws) / self.games if self.games else 0.0

    def summary(self) -> dict[str, Any]:
        returns = self.returns or []
        return {
            "games": self.games,
            "wins": self.wins,
            "draws": self.draws,
            "losses": self.losses,
            "win_rate": self.wins / self.games if self.games else 0.0,
            "score": self.score,
            "episode_return_mean": float(np.mean(returns)) if returns else None,
        }


def play_games(
    job: ImpalaJob,
    policy: GamePolicy,
    opponent: GamePolicy | None,
    games: int,
    seed: int = 0,
    explore: bool = False,
) -> GameResults:
    """`games` games of the job's env: `policy` in each of its agents' seats in turn, every
    other agent by `opponent` (None: random among the allowed actions)."""
    env = AgentEnv(make_pettingzoo(job.spec.env), seed)
    policy_of = policy_mapping(job.spec.agents)
    seats = [a for a in env.possible_agents if policy_of(a) == policy.name]
    if not seats:
        raise ValueError(f"no agent of {job.spec.env.name} acts by policy {policy.name!r}")
    rng = np.random.default_rng(seed)
    results = GameResults(returns=[])
    try:
        for game in range(games):
            seat = seats[game % len(seats)]
            returns = _play(env, seat, policy, opponent, rng, explore)
            mine = returns.pop(seat)
            best = max(returns.values(), default=float("-inf"))
            results.games += 1
            results.wins += mine > best
            results.draws += mine == best
            results.losses += mine < best
            assert results.returns is not None
            results.returns.append(mine)
    finally:
        env.close()
    return results


def _play(
    env: AgentEnv,
    seat: str,
    policy: GamePolicy,
    opponent: GamePolicy | None,
    rng: np.random.Generator,
    explore: bool,
) -> dict[str, float]:
    returns = dict.fromkeys(env.possible_agents, 0.0)
    turn = env.reset()
    while True:
        actions = {}
        for agent, obs in turn.acting.items():
            if agent == seat:
                actions[agent] = policy.act(obs, rng, explore)
            elif opponent is not None:
                actions[agent] = opponent.act(obs, rng, explore)
            else:
                actions[agent] = _random(env, agent, obs, rng)
        turn = env.step(actions)
        for out in turn.outcomes:
            returns[out.agent] += out.reward
        if turn.episode_over:
            return returns


def _random(env: AgentEnv, agent: str, obs: Any, rng: np.random.Generator) -> Any:
    spaces = env.spaces(agent)
    if spaces.masked:
        allowed = np.flatnonzero(ObservationAdapter(spaces).mask(obs))
        return int(rng.choice(allowed))
    space = spaces.action
    space.seed(int(rng.integers(2**31)))
    return space.sample()
