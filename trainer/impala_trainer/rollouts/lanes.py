"""Agent steps into fragments: one lane per agent of each env, cut into [T, B] columns.

A multi-agent env's agents do not step in lock step: in a turn-based game each acts every other
move, an agent that is done waits for the others' episode to end. So each agent of each env has
its own lane: the steps it took, in order, each completed once its outcome (reward, done) is
known. A policy's fragment takes B = its lanes' count columns of T consecutive steps of one lane
each, with the observation the lane's next step acts on as the column's bootstrap; a lane that is
ahead (the player who moves first) may give two columns, one behind none. So a column is always
one agent's own trajectory, never two agents' interleaved, and what V-trace sees of it is
exactly the single-agent case: `vector_sampler` cuts a vector env's columns the same way. A
recurrent policy's steps carry the state each acted from: a column's `state_in` is its first
step's (and with maxSeqLen, each sequence's first step's, as `batches.split_sequences` lays
them out).

Pure numpy, no env: `agent_sampler` feeds it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from impala_trainer.batches import (
    Fragment,
    no_final_steps,
    no_mask,
    no_state,
    split_sequences,
)


@dataclass
class Step:
    """One agent step: what it saw and did; its outcome once known."""

    obs: np.ndarray
    action: np.ndarray
    logits: np.ndarray
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    final_obs: np.ndarray | None = None
    """The observation a truncated (not terminated) step's episode ended in."""
    mask: np.ndarray | None = None
    """The actions its observation allowed (an action_mask), or None."""
    state: np.ndarray | None = None
    """A recurrent policy's state it acted from, or None."""

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class Lane:
    """One agent of one env: its completed steps, and the one still awaiting its outcome."""

    def __init__(self) -> None:
        self.steps: deque[Step] = deque()
        self.pending: Step | None = None

    def act(self, step: Step) -> None:
        if self.pending is not None:
            raise RuntimeError("an agent acted again before its last action's outcome came")
        self.pending = step

    def complete(
        self, reward: float, terminated: bool, truncated: bool, final_obs: np.ndarray | None
    ) -> None:
        """The pending step's outcome; an outcome with no step pending (an AEC agent's first
        `last()` of an episode, before it ever acted) is nothing to record."""
        step, self.pending = self.pending, None
        if step is None:
            return
        step.reward, step.terminated, step.truncated = reward, terminated, truncated
        step.final_obs = final_obs if truncated and not terminated else None
        self.steps.append(step)

    def ready(self, t_len: int) -> int:
        """Columns of t_len steps this lane can give now: each needs the observation its
        bootstrap value is taken from (the next step's), unless its last step ended the episode
        (then nothing is bootstrapped through it)."""
        n = len(self.steps)
        full = n // t_len
        if full == 0:
            return 0
        last_is_known = n > full * t_len or self.pending is not None
        return full if last_is_known or self.steps[full * t_len - 1].done else full - 1

    def take(self, t_len: int) -> tuple[list[Step], np.ndarray]:
        """The oldest t_len steps and the observation to bootstrap from."""
        steps = [self.steps.popleft() for _ in range(t_len)]
        if self.steps:
            bootstrap = self.steps[0].obs
        elif self.pending is not None:
            bootstrap = self.pending.obs
        else:  # the last step was terminal: its value is never used
            bootstrap = steps[-1].obs
        return steps, bootstrap


class PolicyLanes:
    """A policy's lanes (every env x every agent mapped to it) and its fragments."""

    def __init__(self, policy: str, num_lanes: int, t_len: int, seq_len: int | None = None) -> None:
        self.policy = policy
        self.lanes = [Lane() for _ in range(num_lanes)]
        self.t_len = t_len
        self.seq_len = seq_len or t_len
        """A recurrent policy's maxSeqLen: its fragments are cut into sequences of it."""

    def ready(self) -> bool:
        """Enough columns for one fragment."""
        return sum(lane.ready(self.t_len) for lane in self.lanes) >= len(self.lanes)

    def fragment(self, policy_version: int, worker_id: str) -> Fragment:
        """One [T, B] fragment of B columns, taken from the lanes furthest ahead first (the
        oldest steps, so the lag to the learner stays least); `ready()` must hold."""
        t_len, b = self.t_len, len(self.lanes)
        columns: list[tuple[list[Step], np.ndarray]] = []
        while len(columns) < b:
            lane = max(self.lanes, key=lambda lane: lane.ready(t_len))
            if lane.ready(t_len) == 0:
                raise RuntimeError(f"policy {self.policy}: fewer than {b} columns ready")
            columns.append(lane.take(t_len))
        first = columns[0][0][0]
        obs = np.empty((t_len, b, *first.obs.shape), first.obs.dtype)
        actions = np.empty((t_len, b, *first.action.shape), first.action.dtype)
        logits = np.empty((t_len, b, *first.logits.shape), np.float32)
        rewards = np.empty((t_len, b), np.float32)
        terms = np.empty((t_len, b), np.bool_)
        truncs = np.empty((t_len, b), np.bool_)
        bootstrap = np.empty((b, *first.obs.shape), first.obs.dtype)
        masks = no_mask() if first.mask is None else np.empty((t_len, b, len(first.mask)), bool)
        final_obs: list[np.ndarray] = []
        final_steps: list[tuple[int, int]] = []
        for col, (steps, boot) in enumerate(columns):
            bootstrap[col] = boot
            for t, step in enumerate(steps):
                obs[t, col], actions[t, col], logits[t, col] = step.obs, step.action, step.logits
                rewards[t, col] = step.reward
                terms[t, col], truncs[t, col] = step.terminated, step.truncated
                if step.mask is not None:
                    masks[t, col] = step.mask
                if step.final_obs is not None:
                    final_obs.append(step.final_obs)
                    final_steps.append((t, col))
        if final_obs:
            cut_obs = np.stack(final_obs).astype(first.obs.dtype, copy=False)
            cut_steps = np.asarray(final_steps, np.int64)
        else:
            cut_obs, cut_steps = no_final_steps(first.obs.shape, first.obs.dtype)
        starts = None
        if first.state is not None:  # [T / seq_len, B, S]: each sequence's first state
            firsts = range(0, t_len, self.seq_len)
            starts = np.array(
                [[_state(steps[t]) for steps, _ in columns] for t in firsts], np.float32
            )
        fragment = Fragment(
            obs=obs,
            actions=actions,
            behaviour_logits=logits,
            rewards=rewards,
            terminateds=terms,
            truncateds=truncs,
            final_obs=cut_obs,
            final_steps=cut_steps,
            bootstrap_obs=bootstrap,
            policy_version=policy_version,
            state_in=no_state(b) if starts is None else starts[0],
            episode_returns=[],
            episode_lengths=[],
            worker_id=worker_id,
            policy_id=self.policy,
            action_mask=masks,
        )
        if starts is not None and len(starts) > 1:
            return split_sequences(fragment, self.seq_len, starts)
        return fragment


def _state(step: Step) -> np.ndarray:
    if step.state is None:
        raise RuntimeError("a recurrent policy's step without the state it acted from")
    return step.state
