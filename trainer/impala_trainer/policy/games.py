"""A multi-agent run's policies played: whole games of its PettingZoo env, by
`impalajob evaluate --policy P --opponent random|POLICY` and by spec.evaluation's rounds
(`round_of_games`) while it trains.

Scored against an opponent, the policy takes each of its agents' seats in turn (the first
mover, then the second, ...) and every other agent acts by the opponent: `random` (a uniform
choice among the actions its observation allows), or a policy of the job, from the same
checkpoint or another one (its own earlier snapshot: `--opponent-checkpoint`). A game is won
when the policy's agent ends with more reward than every other agent, drawn when it ties the
best. Without an opponent every agent acts by its own policy (the team's return). Greedy unless
`explore`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from impala_api.manifest import load_manifest
from impala_api.snapshot import CONFIG_FILE
from impala_api.spec import RANDOM_OPPONENT, ImpalaJobSpec
from impala_trainer.learning.distributions import (
    MASKED_LOGIT,
    ActionDistribution,
    action_distribution,
)
from impala_trainer.learning.inference import acting_policy, carried_state, recurrent_policy
from impala_trainer.learning.model_factory import build_model
from impala_trainer.learning.models import ActorCritic
from impala_trainer.policy.episodes import MAX_VIDEO_FRAMES, EvaluationResult
from impala_trainer.policy.loaded import PolicyNotFoundError, find_checkpoint
from impala_trainer.policy.video import encode_video, headless_rendering, preview_gif
from impala_trainer.rollouts.agent_envs import (
    AgentEnv,
    ObservationAdapter,
    make_pettingzoo,
    policy_mapping,
    policy_spaces,
    random_action,
)
from impala_trainer.rundir.checkpoint import OLD_LAYOUT, load_checkpoint

RANDOM = RANDOM_OPPONENT


@dataclass
class GamePolicy:
    """One policy of a multi-agent run, ready to act."""

    name: str
    model: ActorCritic
    actions: ActionDistribution
    adapter: ObservationAdapter
    checkpoint: Path | None
    """Where its weights came from (None: a training run's current weights)."""
    policy_version: int

    def __post_init__(self) -> None:
        self.recurrent = self.model.state_size > 0
        self._logits = None if self.recurrent else acting_policy(self.model)
        self._step = recurrent_policy(self.model) if self.recurrent else None
        self._carry = carried_state(self.model)

    @property
    def source(self) -> str:
        """Its checkpoint's name, or `current` (a training run's weights)."""
        return self.checkpoint.name if self.checkpoint is not None else "current"

    def initial_state(self) -> np.ndarray | None:
        """A recurrent policy's state at an episode's start (None for a feed-forward one)."""
        return self.model.initial_state(1).numpy() if self.recurrent else None

    def carry(self, state: np.ndarray | None, chosen: np.ndarray, reward: float) -> Any:
        """The state after the step that took `chosen` (as `act` returned it) was rewarded
        `reward` (as the learner saw it): with it written in, for a model that takes its previous
        action and reward; else unchanged."""
        if self._carry is None or state is None:
            return state
        return self._carry(state, chosen[None], np.array([reward], np.float32))

    @torch.inference_mode()
    def act(
        self, obs: Any, rng: np.random.Generator, explore: bool, state: np.ndarray | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray | None]:
        """The env's action for `obs`, the action as the learner stores it (for `carry`), and
        a recurrent policy's next state, from `state`."""
        model_input = self.adapter.model_input(obs)[None]
        if self._step is not None:
            assert state is not None
            out, state = self._step(model_input, state)
        else:
            assert self._logits is not None
            out = self._logits(model_input)
        logits = np.array(out, np.float32)
        if self.adapter.spaces.masked:
            logits[0, ~self.adapter.mask(obs)] = MASKED_LOGIT
        if explore:
            out = self.actions.empty_actions(1, 1)[0]
            self.actions.sample(logits, self.actions.noise(rng, 1, 1)[0], out)
        else:
            out = np.asarray(self.actions.greedy(logits), self.actions.action_dtype)
        action = self.actions.to_env(out)[0]
        return (action.item() if np.ndim(action) == 0 else action), out[0], state


def game_policies(spec: ImpalaJobSpec) -> dict[str, GamePolicy]:
    """Every policy of a multi-agent job, with its initial weights (load them)."""
    out = {}
    for name, (_agents, spaces) in policy_spaces(spec).items():
        adapter = ObservationAdapter(spaces)
        model_spec = spec.policy_spec(name).model
        dist = action_distribution(spaces.action, model_spec.squash_actions)
        model = build_model(model_spec, adapter.shape, dist).float().eval()
        out[name] = GamePolicy(name, model, dist, adapter, None, 0)
    return out


def load_game_policies(run_dir: Path, checkpoint: str | None = None) -> dict[str, GamePolicy]:
    """Every policy of a multi-agent run's checkpoint (the newest, or `checkpoint`)."""
    config = run_dir / CONFIG_FILE
    if not config.is_file():
        raise PolicyNotFoundError(f"{run_dir} is not a run directory: it has no {CONFIG_FILE}")
    job = load_manifest(config)
    if not job.spec.env.is_pettingzoo:
        raise PolicyNotFoundError(f"{run_dir} trained {job.spec.env.id}, not a PettingZoo env")
    path = find_checkpoint(run_dir, checkpoint)
    try:
        state, _ = load_checkpoint(path)
    except Exception as err:  # truncated, corrupt, not ours
        raise PolicyNotFoundError(f"{path} cannot be read: {err}") from None
    saved = state.get("policies")
    if not isinstance(saved, dict):
        raise PolicyNotFoundError(OLD_LAYOUT.format(path=path))
    out = game_policies(job.spec)
    for name, policy in out.items():
        if name not in saved:
            raise PolicyNotFoundError(f"{path} holds no policy {name!r} ({', '.join(saved)})")
        policy.model.load_state_dict(saved[name]["model"])
        policy.model.float().eval()
        policy.checkpoint = path
        policy.policy_version = int(saved[name].get("policy_version", 0))
    return out


@dataclass
class GameResults:
    games: int = 0
    wins: int = 0
    draws: int = 0
    losses: int = 0
    returns: list[float] | None = None
    """The scored policy's return per game, or the team's (every agent's rewards)."""
    policy_returns: dict[str, list[float]] | None = None
    """A team's games: each policy's returns, one per agent and game."""

    @property
    def score(self) -> float:
        """Wins plus half the draws, per game."""
        return (self.wins + 0.5 * self.draws) / self.games if self.games else 0.0

    def summary(self) -> dict[str, Any]:
        """Games and the mean return; a team's each policy's mean, scored games their wins,
        draws and losses (nobody in a team is scored against anybody)."""
        returns = self.returns or []
        mean = float(np.mean(returns)) if returns else None
        if self.policy_returns is not None:
            means = {k: float(np.mean(v)) for k, v in self.policy_returns.items() if v}
            return {"games": self.games, "episode_return_mean": mean, "policy_return_means": means}
        return {
            "games": self.games,
            "wins": self.wins,
            "draws": self.draws,
            "losses": self.losses,
            "win_rate": self.wins / self.games if self.games else 0.0,
            "score": self.score,
            "episode_return_mean": mean,
        }


def play_games(
    spec: ImpalaJobSpec,
    policy: GamePolicy,
    opponent: GamePolicy | None,
    games: int,
    seed: int = 0,
    explore: bool = False,
    opening: int = 0,
) -> GameResults:
    """`games` games of the job's env: `policy` in each of its agents' seats in turn, every
    other agent by `opponent` (None: random among the allowed actions). The first `opening`
    turns of every game are random moves on both sides: two greedy policies then meet in many
    positions instead of replaying one game per seat."""
    results = GameResults(returns=[])
    with _GameEnv(spec, seed) as env:
        for game in _scored(env, policy, opponent, games, None, explore, opening):
            results.games += 1
            results.wins += game.outcome > 0
            results.draws += game.outcome == 0
            results.losses += game.outcome < 0
            assert results.returns is not None
            results.returns.append(game.returns[game.seat])
    return results


def play_team(
    spec: ImpalaJobSpec,
    policies: dict[str, GamePolicy],
    games: int,
    seed: int = 0,
    explore: bool = False,
    opening: int = 0,
) -> GameResults:
    """`games` games of the job's env with every agent acting by its own policy (a job without
    an opponent: cooperating agents, or policies that each play their own part): the team's
    return per game (every agent's rewards) and each policy's per agent, as training and
    spec.evaluation report them. No wins or losses: nobody is scored against anybody."""
    results = GameResults(returns=[], policy_returns={})
    assert results.returns is not None and results.policy_returns is not None
    with _GameEnv(spec, seed) as env:
        for game in _team(env, policies, games, None, explore, opening):
            results.games += 1
            results.returns.append(float(sum(game.returns.values())))
            for agent, value in game.returns.items():
                results.policy_returns.setdefault(env.policy_of(agent), []).append(value)
    return results


def round_of_games(
    spec: ImpalaJobSpec, policies: dict[str, GamePolicy], seed: int, share: int, video: bool
) -> tuple[EvaluationResult, tuple[str, bytes] | None]:
    """spec.evaluation's round on a PettingZoo env: `share` whole games (or env steps,
    durationUnit), one after another (numEnvsPerRunner does not apply), scored against
    spec.evaluation.opponent or played as the team; with `video`, the first game recorded from
    the env's frames (its file's suffix and bytes)."""
    evaluation = spec.evaluation
    assert evaluation is not None
    by_steps = evaluation.duration_unit == "timesteps"
    games = None if by_steps else share
    steps = share if by_steps else None
    explore = evaluation.explore
    result = EvaluationResult()
    with _GameEnv(spec, seed, render=video) as env:
        if evaluation.opponent is None:
            played = _team(env, policies, games, steps, explore)
        else:
            result.scored = spec.evaluated_policy
            against = evaluation.opponent
            opponent = None if against == RANDOM else policies[against]
            played = _scored(env, policies[result.scored], opponent, games, steps, explore)
        for game in played:
            result.env_steps += game.turns
            result.lengths.append(game.turns)
            if result.scored is None:
                result.returns.append(float(sum(game.returns.values())))
            else:
                result.returns.append(game.returns[game.seat])
                result.wins += game.outcome > 0
                result.draws += game.outcome == 0
                result.losses += game.outcome < 0
            for agent, value in game.returns.items():
                if result.scored is None or agent == game.seat:
                    result.policy_returns.setdefault(env.policy_of(agent), []).append(value)
        frames, fps = env.frames, env.fps
    if not frames:
        return result, None
    result.preview = preview_gif(frames, fps=fps)
    return result, encode_video(frames, fps)


@dataclass
class _Game:
    returns: dict[str, float]
    """Each agent's return."""
    turns: int
    seat: str = ""
    """The scored policy's agent."""
    outcome: int = 0
    """1 won, 0 drawn, -1 lost (scored games)."""


class _GameEnv:
    """The job's env for whole games, its agents' policies and a random generator; with
    `render`, the first game's frames (`frames`, at the env's `render_fps`)."""

    def __init__(self, spec: ImpalaJobSpec, seed: int, render: bool = False) -> None:
        if render:
            headless_rendering()
        made = make_pettingzoo(spec.env, render)
        self.env = AgentEnv(made, seed)
        self.policy_of = policy_mapping(spec.agents)
        self.name = spec.env.name
        self.clip_rewards = spec.env.clips_rewards
        self.rng = np.random.default_rng(seed)
        self.recording = render
        """Frames are taken while this holds: the first game, up to MAX_VIDEO_FRAMES."""
        self.frames: list[np.ndarray] = []
        self.fps = float((getattr(made, "metadata", None) or {}).get("render_fps") or 30)
        self._render = made.render

    def record(self) -> None:
        """The env's frame now, while the first game is recorded."""
        if self.recording and len(self.frames) < MAX_VIDEO_FRAMES:
            frame = self._render()
            if frame is not None:
                self.frames.append(np.asarray(frame))

    def __enter__(self) -> _GameEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.env.close()


def _indices(games: int | None) -> Iterable[int]:
    """Game indices: `games` of them, or without end (a budget of env steps ends them)."""
    return itertools.count() if games is None else range(games)


def _scored(
    env: _GameEnv,
    policy: GamePolicy,
    opponent: GamePolicy | None,
    games: int | None,
    steps: int | None,
    explore: bool,
    opening: int = 0,
) -> Iterator[_Game]:
    """Games of `policy` (in its agents' seats in turn) against `opponent` (None: random);
    with `steps`, the games that end within that many env steps; the first `opening` turns of
    each at random."""
    seats = [a for a in env.env.possible_agents if env.policy_of(a) == policy.name]
    if not seats:
        raise ValueError(f"no agent of {env.name} acts by policy {policy.name!r}")
    played = 0
    for game in _indices(games):
        seat = seats[game % len(seats)]

        def actor_of(agent: str, seat: str = seat) -> GamePolicy | None:
            return policy if agent == seat else opponent

        returns, turns = _play(env, actor_of, explore, opening)
        played += turns
        if steps is not None and played > steps:
            return
        mine = returns[seat]
        best = max((v for a, v in returns.items() if a != seat), default=float("-inf"))
        yield _Game(returns, turns, seat, (mine > best) - (mine < best))


def _team(
    env: _GameEnv,
    policies: dict[str, GamePolicy],
    games: int | None,
    steps: int | None,
    explore: bool,
    opening: int = 0,
) -> Iterator[_Game]:
    """Games with every agent acting by its own policy (the first `opening` turns at random)."""
    played = 0
    for _ in _indices(games):
        returns, turns = _play(env, lambda agent: policies[env.policy_of(agent)], explore, opening)
        played += turns
        if steps is not None and played > steps:
            return
        yield _Game(returns, turns)


def _play(
    env: _GameEnv, actor_of: Callable[[str], GamePolicy | None], explore: bool, opening: int = 0
) -> tuple[dict[str, float], int]:
    """One game: each agent acts by `actor_of(agent)` (None: random), every agent at random
    in the first `opening` turns; its returns and turns."""
    returns = dict.fromkeys(env.env.possible_agents, 0.0)
    states: dict[str, np.ndarray | None] = {}
    """Each agent's recurrent state in this game (its seat's policy does not change in one)."""
    acted: dict[str, tuple[GamePolicy, np.ndarray]] = {}
    """Each agent's last step by a policy, until its reward comes in (`GamePolicy.carry`)."""
    turn = env.env.reset()
    env.record()
    turns = 0
    while True:
        actions = {}
        for agent, obs in turn.acting.items():
            actor = actor_of(agent) if turns >= opening else None
            if actor is None:
                actions[agent] = random_action(env.env, agent, obs, env.rng)
                continue
            if agent not in states:
                states[agent] = actor.initial_state()
            actions[agent], chosen, states[agent] = actor.act(obs, env.rng, explore, states[agent])
            acted[agent] = (actor, chosen)
        turn = env.env.step(actions)
        env.record()
        turns += 1
        for out in turn.outcomes:
            returns[out.agent] += out.reward
            if out.agent in acted:
                actor, chosen = acted.pop(out.agent)
                seen = float(np.sign(out.reward)) if env.clip_rewards else out.reward
                states[out.agent] = actor.carry(states[out.agent], chosen, seen)
        if turn.episode_over:
            env.recording = False  # one game's video
            return returns, turns
