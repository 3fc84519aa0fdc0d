"""A PettingZoo env's samples: `numEnvsPerWorker` envs, every agent acting by its policy, one
fragment per trained policy out.

Each turn, the agents that act in every env are grouped by the policy (or snapshot) they act by
and each runs one batched forward for all of them (RLlib's per-policy batched inference). The
steps of a trained policy's agents go into lanes (`rollouts.lanes`) until each trained policy
has a whole fragment; the steps of a policy that does not learn are not kept. A recurrent
policy's state is each agent's own (per env and agent, zeroed when the env's episode ends), and
each step keeps the state it acted from; a model that takes its previous action and reward has
the agent's own written into its state once that step's reward is in (lstmUsePrevActionReward),
as the learner's unroll writes them. A fragment carries its own policy's version, so each
learner measures its own policy lag.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from impala_api.spec import ImpalaJobSpec
from impala_trainer.batches import MultiAgentFragment
from impala_trainer.learning.distributions import MASKED_LOGIT, action_distribution
from impala_trainer.rollouts.acting_policies import ActingPolicies, ActingPolicy
from impala_trainer.rollouts.agent_envs import (
    AgentEnv,
    ObservationAdapter,
    PolicyModel,
    Turn,
    make_pettingzoo,
    policy_spaces,
    random_action,
)
from impala_trainer.rollouts.lanes import PolicyLanes, Step

RANDOM_SEAT = "@random"
"""A self-play seat taken by the random player (no policy's name has an `@`)."""
MAX_TURNS_PER_FRAGMENT = 1000
"""Turns per fragment length beyond which an agent that never acts is an error, not a wait."""


class AgentEnvSampler:
    """Steps `numEnvsPerWorker` PettingZoo envs; one fragment per trained policy per sample."""

    def __init__(self, spec: ImpalaJobSpec, worker_id: str, seed: int) -> None:
        self.worker_id = worker_id
        self.num_envs = spec.env.num_envs_per_worker
        self.fragment_length = spec.training.rollout_fragment_length
        self.clip_rewards = spec.env.clips_rewards
        # Each env its own seed stream: episode k of env i is reset with seed + i * 10^6 + k.
        self.envs = [
            AgentEnv(make_pettingzoo(spec.env), seed + i * 1_000_000) for i in range(self.num_envs)
        ]
        self.adapters: dict[str, ObservationAdapter] = {}
        self.models: dict[str, PolicyModel] = {}
        """Each policy's model spaces (what `ActingPolicies` builds it for)."""
        self.policy_of: dict[str, str] = {}
        for name, (agents, spaces) in policy_spaces(spec, self.envs[0]).items():
            adapter = self.adapters[name] = ObservationAdapter(spaces)
            squash = spec.policy_spec(name).model.squash_actions
            dist = action_distribution(spaces.action, squash)
            self.models[name] = PolicyModel(agents, adapter.shape, adapter.dtype, dist)
            self.policy_of.update(dict.fromkeys(agents, name))
        self.self_play = spec.agents.self_play
        agents = self.envs[0].possible_agents
        self.lanes: dict[str, PolicyLanes] = {}
        self._lane_of: dict[tuple[int, str], Any] = {}
        trained = set(spec.agents.trained)
        for name in self.models:
            if name not in trained:
                continue
            mine = [a for a in agents if self.policy_of[a] == name]
            seq_len = spec.policy_spec(name).model.max_seq_len
            lanes = self.lanes[name] = PolicyLanes(
                name, self.num_envs * len(mine), self.fragment_length, seq_len
            )
            for i, (env, agent) in enumerate((e, a) for e in range(self.num_envs) for a in mine):
                self._lane_of[env, agent] = lanes.lanes[i]
        self.rng = np.random.default_rng(seed)
        self._seat_rng = np.random.default_rng(seed + 1)
        self._seats: list[dict[str, str]] = [{} for _ in self.envs]
        """Per env, this episode's self-play seats: agent -> the policy or snapshot it acts by."""
        self._learner_seat: list[str | None] = [None] * self.num_envs
        self.turns: list[Turn] = [env.reset() for env in self.envs]
        for e in range(self.num_envs):
            self._seat(e, [])
        self._returns = [dict.fromkeys(agents, 0.0) for _ in self.envs]
        self._lengths = [0] * self.num_envs
        self._states: dict[tuple[int, str], np.ndarray] = {}
        """A recurrent policy's state per (env, agent) in this episode; absent: zeros."""
        self._to_carry: dict[tuple[int, str], tuple[ActingPolicy, np.ndarray]] = {}
        """An agent's step whose action and reward its state takes once the reward is in
        (lstmUsePrevActionReward): (env, agent) -> (the policy it acted by, the action)."""
        self.env_steps = 0

    def _seat(self, e: int, pool: list[str]) -> None:
        """selfPlay: who plays whom in env e's new episode. One agent of the policy, at random,
        learns by it; each other one is a random player (randomProbability), the current
        policy too (latestProbability) or a snapshot from the pool."""
        play = self.self_play
        if play is None:
            return
        mine = [a for a in self.envs[e].possible_agents if self.policy_of[a] == play.policy]
        order = [mine[i] for i in self._seat_rng.permutation(len(mine))]
        seats = dict.fromkeys(order, play.policy)
        for agent in order[1:]:
            if play.random_probability and self._seat_rng.random() < play.random_probability:
                seats[agent] = RANDOM_SEAT
            elif pool and self._seat_rng.random() >= play.latest_probability:
                seats[agent] = pool[int(self._seat_rng.integers(len(pool)))]
        self._seats[e] = seats
        self._learner_seat[e] = order[0] if order else None

    def _acts_by(self, e: int, agent: str, acting: ActingPolicies) -> ActingPolicy | None:
        """The policy or snapshot `agent` acts by in env e's episode; None: the random player."""
        seat = self._seats[e].get(agent)
        if seat == RANDOM_SEAT:
            return None
        if seat is None or seat not in acting.snapshots:
            return acting.policies[self.policy_of[agent]]
        return acting.snapshots[seat]

    def sample(self, acting: ActingPolicies) -> MultiAgentFragment:
        """Turns in every env until each trained policy's lanes hold a whole fragment."""
        returns: list[float] = []
        lengths: list[int] = []
        policy_returns: dict[str, list[float]] = {name: [] for name in self.models}
        scores: list[float] = []
        turns = 0
        limit = MAX_TURNS_PER_FRAGMENT * self.fragment_length
        while not all(lanes.ready() for lanes in self.lanes.values()):
            if turns >= limit:
                slow = [name for name, lanes in self.lanes.items() if not lanes.ready()]
                raise RuntimeError(
                    f"after {turns} turns the agents of policy {slow[0]!r} still have not "
                    f"taken {self.fragment_length} steps in every env: an agent that never "
                    "acts cannot fill its lane (map it to a policy outside policiesToTrain)"
                )
            self._turn(acting, returns, lengths, policy_returns, scores)
            turns += 1
        self.env_steps += turns * self.num_envs
        fragments = {
            name: lanes.fragment(acting.policies[name].version, self.worker_id)
            for name, lanes in self.lanes.items()
        }
        for name, fragment in fragments.items():
            fragment.episode_returns = policy_returns[name]
        return MultiAgentFragment(
            fragments=fragments,
            env_steps=turns * self.num_envs,
            episode_returns=returns,
            episode_lengths=lengths,
            policy_returns={k: v for k, v in policy_returns.items() if v},
            self_play_scores=scores,
            worker_id=self.worker_id,
            policy_version=acting.version,
        )

    def _turn(
        self,
        acting: ActingPolicies,
        returns: list[float],
        lengths: list[int],
        policy_returns: dict[str, list[float]],
        scores: list[float],
    ) -> None:
        """One turn in every env: each policy (and snapshot) acts for its agents in one
        forward."""
        rows: dict[str, list[tuple[int, str, Any]]] = {}
        by_name: dict[str, ActingPolicy] = {}
        actions: list[dict[str, Any]] = [{} for _ in self.envs]
        for e, turn in enumerate(self.turns):
            for agent, obs in turn.acting.items():
                policy = self._acts_by(e, agent, acting)
                if policy is None:
                    actions[e][agent] = random_action(self.envs[e], agent, obs, self.rng)
                    continue
                by_name[policy.name] = policy
                rows.setdefault(policy.name, []).append((e, agent, obs))
        for name, picked in rows.items():
            policy = by_name[name]
            adapter = self.adapters[policy.policy]
            obs = np.stack([adapter.model_input(o) for _, _, o in picked])
            states = None
            if policy.recurrent:
                states = np.stack([self._state(e, agent, policy) for e, agent, _ in picked])
                out, after = policy.logits(obs, states)
                for (e, agent, _), state in zip(picked, after, strict=True):
                    self._states[e, agent] = state
            else:
                out = policy.logits(obs)
            logits = np.array(out, np.float32, copy=True)
            masks: np.ndarray | None = None
            if adapter.spaces.masked:
                masks = np.stack([adapter.mask(o) for _, _, o in picked])
                logits[~masks] = MASKED_LOGIT  # never sampled, and so recorded
            dist = policy.actions
            chosen = dist.empty_actions(1, len(picked))[0]
            dist.sample(logits, dist.noise(self.rng, 1, len(picked))[0], chosen)
            to_env = dist.to_env(chosen)
            for i, (e, agent, _) in enumerate(picked):
                actions[e][agent] = to_env[i].item() if to_env[i].ndim == 0 else to_env[i]
                if policy.carry is not None:
                    self._to_carry[e, agent] = (policy, chosen[i].copy())
                lane = self._lane_of.get((e, agent)) if policy.trained else None
                if lane is not None:
                    mask = None if masks is None else masks[i]
                    state = None if states is None else states[i]
                    lane.act(Step(obs[i], chosen[i].copy(), logits[i], mask=mask, state=state))
        for e, env in enumerate(self.envs):
            turn = self.turns[e] = env.step(actions[e])
            self._lengths[e] += 1
            for out in turn.outcomes:
                self._returns[e][out.agent] += out.reward
                # The learner sees clipped rewards; the episode return reports the env's own.
                reward = float(np.sign(out.reward)) if self.clip_rewards else out.reward
                self._carry(e, out.agent, reward)
                lane = self._lane_of.get((e, out.agent))
                if lane is not None:
                    final = out.final_obs
                    if final is not None:
                        final = self.adapters[self.policy_of[out.agent]].model_input(final)
                    lane.complete(reward, out.terminated, out.truncated, final)
            if turn.episode_over:
                self._episode_over(e, acting, returns, lengths, policy_returns, scores)

    def _episode_over(
        self,
        e: int,
        acting: ActingPolicies,
        returns: list[float],
        lengths: list[int],
        policy_returns: dict[str, list[float]],
        scores: list[float],
    ) -> None:
        agent_returns = self._returns[e]
        returns.append(float(sum(agent_returns.values())))
        lengths.append(self._lengths[e])
        seats = self._seats[e]
        for agent, value in agent_returns.items():
            # A snapshot's or the random player's play is not the policy's.
            own = self.policy_of[agent]
            if seats.get(agent, own) == own:
                policy_returns[own].append(value)
        learner = self._learner_seat[e]
        against = [a for a, seat in seats.items() if seat in acting.snapshots]
        if learner is not None and against:
            # Against the pool: 1 a win (more than every snapshot), 0.5 a draw, 0 a loss.
            best = max(agent_returns[a] for a in against)
            mine = agent_returns[learner]
            scores.append(1.0 if mine > best else 0.5 if mine == best else 0.0)
        self._returns[e] = dict.fromkeys(agent_returns, 0.0)
        self._lengths[e] = 0
        for agent in agent_returns:  # a new episode: every recurrent state starts at zero
            self._states.pop((e, agent), None)
            self._to_carry.pop((e, agent), None)
        self._seat(e, acting.pool())

    def _carry(self, e: int, agent: str, reward: float) -> None:
        """A completed step's action and reward into the agent's state, as the learner's
        unroll writes them after that step (zeroed with the state when the episode ends)."""
        acted = self._to_carry.pop((e, agent), None)
        state = self._states.get((e, agent))
        if acted is None or state is None:
            return
        policy, action = acted
        rewards = np.array([reward], np.float32)
        self._states[e, agent] = policy.carry(state[None], action[None], rewards)[0]

    def _state(self, e: int, agent: str, policy: ActingPolicy) -> np.ndarray:
        state = self._states.get((e, agent))
        if state is None:
            state = policy.model.initial_state(1).numpy()[0]
        return state
