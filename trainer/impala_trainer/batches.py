"""Typed payloads between rollout workers, aggregators and the learner.

Everything is time-major numpy: `[T, B, ...]` with T = rolloutFragmentLength and B = environments.
Numpy (not torch) crosses process boundaries because Ray's object store hands numpy arrays to the
reader zero-copy; the learner turns them into tensors with `torch.from_numpy`.

Weights travel in one layout whatever the env: every policy's arrays keyed `<policy>/<name>`,
with the policy's version under `<policy>/@version` (`policy_layout`, `policy_weights`); a
gymnasium env's one policy is `default`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from impala_api.spec import DEFAULT_POLICY

WEIGHTS_VERSION = "@version"
"""The key, under a policy's prefix, of its weights' version in a broadcast."""


def policy_layout(policy: str, arrays: Mapping[str, Any], version: int) -> dict[str, Any]:
    """One policy's weights in the broadcast layout: `<policy>/<name>` and its version."""
    out = {f"{policy}/{k}": v for k, v in arrays.items()}
    out[f"{policy}/{WEIGHTS_VERSION}"] = np.asarray(version, np.int64)
    return out


def policy_weights(weights: Mapping[str, Any]) -> dict[str, tuple[dict[str, Any], int]]:
    """A broadcast split per policy: policy -> (its arrays, its version)."""
    out: dict[str, tuple[dict[str, Any], int]] = {}
    for key, value in weights.items():
        policy, _, name = key.partition("/")
        arrays, version = out.get(policy, ({}, 0))
        if name == WEIGHTS_VERSION:
            version = int(value)
        else:
            arrays[name] = value
        out[policy] = (arrays, version)
    return out


@dataclass
class Fragment:
    """One rollout fragment: T steps of B environments, with what V-trace needs."""

    obs: np.ndarray
    """[T, B, *obs_shape] observation each action was taken in."""
    actions: np.ndarray
    """[T, B, *action_shape] actions: int64 for the discrete spaces, float32 for Box (the
    sampled, unclipped action; the env got it clipped)."""
    behaviour_logits: np.ndarray
    """[T, B, D] float32 distribution inputs of the policy that acted (logits for Discrete)."""
    rewards: np.ndarray
    """[T, B] float32 rewards."""
    terminateds: np.ndarray
    """[T, B] bool: the episode ended at step t for good (no bootstrap through it)."""
    truncateds: np.ndarray
    """[T, B] bool: the episode was cut at step t by a time limit."""
    final_obs: np.ndarray
    """[K, *obs_shape] the observation each of the K episodes cut by a time limit (truncated, not
    terminated) ended in. The learner evaluates them with its current value function on every
    pass, adds gamma * V(final obs) to that step's reward and cuts the trace there, so time
    limits are not mistaken for terminal states."""
    final_steps: np.ndarray
    """[K, 2] int64 (t, b): the step and column of each row of final_obs."""
    bootstrap_obs: np.ndarray
    """[B, *obs_shape] observation after the last step (the learner bootstraps from its value)."""
    policy_version: int
    """Version of the weights that produced behaviour_logits (off-policy lag = learner - this)."""
    state_in: np.ndarray = field(default_factory=lambda: no_state(0))
    """[B, S] float32: a recurrent policy's state before each column's first step (S = 0 for a
    feed-forward policy); the learner unrolls each column from it."""
    episode_returns: list[float] = field(default_factory=list)
    """Returns of episodes that finished inside this fragment."""
    episode_lengths: list[int] = field(default_factory=list)
    """Lengths of those episodes."""
    worker_id: str = ""
    """Actor that produced it."""
    busy_seconds: float = 0.0
    """Seconds the worker spent on this fragment: sampling it, and loading the weights that came
    with its request (`RolloutWorker.sample`). Against the wall clock it says how much of its
    time an actor works rather than waits for its next request."""
    policy_id: str = DEFAULT_POLICY
    """The policy that acted (a multi-agent job's fragment holds one policy's agents)."""
    action_mask: np.ndarray = field(default_factory=lambda: no_mask())
    """[T, B, A] bool: the actions each step allowed (an observation's `action_mask`), or
    `no_mask()` where the env masks none. The behaviour logits are masked already."""

    @property
    def env_steps(self) -> int:
        return int(self.actions.shape[0] * self.actions.shape[1])

    def parts(self) -> list[Fragment]:
        """The fragments to train on, one per policy: this one (`MultiAgentFragment`'s has
        several)."""
        return [self]

    def meta(self) -> FragmentMeta:
        """The small part the driver reads without pulling the arrays (counters, episodes)."""
        return FragmentMeta(
            worker_id=self.worker_id,
            env_steps=self.env_steps,
            episode_returns=list(self.episode_returns),
            episode_lengths=list(self.episode_lengths),
            policy_version=self.policy_version,
            busy_seconds=self.busy_seconds,
        )


@dataclass(frozen=True)
class FragmentMeta:
    """What the driver learns from a sample request without pulling the fragment itself: the
    fragment can go by reference straight to an aggregator."""

    worker_id: str
    env_steps: int
    episode_returns: list[float]
    episode_lengths: list[int]
    policy_version: int
    busy_seconds: float = 0.0
    """`Fragment.busy_seconds`."""
    policy_returns: dict[str, list[float]] = field(default_factory=dict)
    """A multi-agent sample's episode returns per policy (one per agent and episode)."""
    self_play_scores: list[float] = field(default_factory=list)
    """spec.multiAgent.selfPlay: each game against a snapshot, 1 won, 0.5 drawn, 0 lost."""


@dataclass
class MultiAgentFragment:
    """What a multi-agent worker samples: one fragment per trained policy (its agents' columns),
    and the env episodes that ended meanwhile. Env steps count the env's steps (every agent's
    action in a parallel env, one move in a turn-based one), as RLlib's env steps do; the parts
    count agent steps."""

    fragments: dict[str, Fragment]
    env_steps: int
    episode_returns: list[float]
    """Team returns: each finished episode's rewards summed over all its agents (RLlib's
    episode_return_mean)."""
    episode_lengths: list[int]
    policy_returns: dict[str, list[float]]
    self_play_scores: list[float] = field(default_factory=list)
    worker_id: str = ""
    busy_seconds: float = 0.0
    policy_version: int = 0

    def parts(self) -> list[Fragment]:
        return list(self.fragments.values())

    def meta(self) -> FragmentMeta:
        return FragmentMeta(
            worker_id=self.worker_id,
            env_steps=self.env_steps,
            episode_returns=list(self.episode_returns),
            episode_lengths=list(self.episode_lengths),
            policy_version=self.policy_version,
            busy_seconds=self.busy_seconds,
            policy_returns={p: list(r) for p, r in self.policy_returns.items()},
            self_play_scores=list(self.self_play_scores),
        )


Sample = Fragment | MultiAgentFragment
"""What a rollout worker's `sample()` returns: one policy's fragment, or a multi-agent env's."""


@dataclass(frozen=True)
class Gradients:
    """A3C mode: a rollout worker's loss gradients on one sample it took on-policy, for each
    trained policy (`default` alone for a gymnasium env)."""

    grads: dict[str, list[np.ndarray]]
    """Policy -> the gradients of its loss on its own columns of the sample, in its parameters'
    order."""
    meta: FragmentMeta
    stats: dict[str, float]
    """The learner stats of the gradient computation (loss terms, entropy...), keyed
    `<policy>/<stat>` as the learner groups' are."""


@dataclass(frozen=True)
class NodeInfo:
    """Where an actor runs; its answer also means the actor finished building."""

    node_id: str
    node_ip: str


@dataclass(frozen=True)
class Handover:
    """What a draining actor still held when released (membership's drain)."""

    fragments: list[Fragment]
    """Fragments an aggregator had not yet made into a batch."""
    env_steps: int | None
    """A rollout worker's own count of the env steps it sampled (None for an aggregator)."""


@dataclass
class TrainBatch:
    """Fragments with the same T concatenated along the environment axis: what the learner eats."""

    obs: np.ndarray
    actions: np.ndarray
    behaviour_logits: np.ndarray
    rewards: np.ndarray
    terminateds: np.ndarray
    truncateds: np.ndarray
    final_obs: np.ndarray
    final_steps: np.ndarray
    """[K, 2] (t, b) of each final_obs row, b counted in this batch's columns."""
    bootstrap_obs: np.ndarray
    policy_versions: np.ndarray
    """[B] int64: behaviour policy version of each column."""
    state_in: np.ndarray = field(default_factory=lambda: no_state(0))
    """[B, S] recurrent state each column starts from (S = 0: feed-forward)."""
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    worker_ids: list[str] = field(default_factory=list)
    """Actors whose fragments are in this batch (they get the next weight broadcast)."""
    replayed: bool = False
    """True when this batch came from the mixin replay buffer (not counted as new env steps)."""
    policy_id: str = DEFAULT_POLICY
    """The policy whose learner trains on it."""
    action_mask: np.ndarray = field(default_factory=lambda: no_mask())
    """[T, B, A] `Fragment.action_mask`: the learner masks its logits alike."""

    @property
    def env_steps(self) -> int:
        return int(self.actions.shape[0] * self.actions.shape[1])

    @property
    def num_columns(self) -> int:
        return int(self.actions.shape[1])


_ARRAY_FIELDS = (
    "obs",
    "actions",
    "behaviour_logits",
    "rewards",
    "terminateds",
    "truncateds",
)
"""The [T, B, ...] fields, concatenated and sliced along B."""


def no_state(columns: int) -> np.ndarray:
    """The state_in of a feed-forward policy's fragment: [B, 0]."""
    return np.zeros((columns, 0), np.float32)


def no_mask() -> np.ndarray:
    """The action_mask of a fragment whose env masks no action."""
    return np.zeros((0, 0, 0), np.bool_)


def no_final_steps(
    obs_shape: tuple[int, ...], dtype: np.dtype[Any]
) -> tuple[np.ndarray, np.ndarray]:
    """(final_obs, final_steps) of a fragment in which no episode was cut by a time limit."""
    return np.empty((0, *obs_shape), dtype), np.empty((0, 2), np.int64)


def concat_fragments(fragments: list[Fragment]) -> TrainBatch:
    """Concatenate fragments along B. All must share T (rolloutFragmentLength)."""
    if not fragments:
        raise ValueError("concat_fragments needs at least one fragment")
    lengths = {f.actions.shape[0] for f in fragments}
    if len(lengths) != 1:
        raise ValueError(f"fragments differ in length {sorted(lengths)}; they must share T")
    if len({f.policy_id for f in fragments}) != 1:
        raise ValueError("fragments of different policies cannot make one batch")
    arrays: dict[str, Any] = {
        name: np.concatenate([getattr(f, name) for f in fragments], axis=1)
        for name in _ARRAY_FIELDS
    }
    offsets = np.cumsum([0] + [f.actions.shape[1] for f in fragments[:-1]])
    return TrainBatch(
        **arrays,
        final_obs=np.concatenate([f.final_obs for f in fragments]),
        final_steps=np.concatenate(
            [
                f.final_steps + np.array([0, off], np.int64)
                for f, off in zip(fragments, offsets, strict=True)
            ]
        ),
        bootstrap_obs=np.concatenate([f.bootstrap_obs for f in fragments], axis=0),
        state_in=np.concatenate([f.state_in for f in fragments], axis=0),
        policy_versions=np.concatenate(
            [np.full(f.actions.shape[1], f.policy_version, dtype=np.int64) for f in fragments]
        ),
        episode_returns=[r for f in fragments for r in f.episode_returns],
        episode_lengths=[n for f in fragments for n in f.episode_lengths],
        worker_ids=sorted({f.worker_id for f in fragments}),
        policy_id=fragments[0].policy_id,
        action_mask=np.concatenate([f.action_mask for f in fragments], axis=1),
    )


def slice_columns(batch: TrainBatch, start: int, stop: int) -> TrainBatch:
    """Columns [start, stop) of a batch (a shard for one tower); views, except the few final
    observations, whose rows are picked out and renumbered to the shard's columns."""
    cols = batch.final_steps[:, 1]
    picked = (cols >= start) & (cols < stop)
    return TrainBatch(
        **{name: getattr(batch, name)[:, start:stop] for name in _ARRAY_FIELDS},
        final_obs=batch.final_obs[picked],
        final_steps=batch.final_steps[picked] - np.array([0, start], np.int64),
        bootstrap_obs=batch.bootstrap_obs[start:stop],
        state_in=batch.state_in[start:stop],
        policy_versions=batch.policy_versions[start:stop],
        replayed=batch.replayed,
        policy_id=batch.policy_id,
        action_mask=batch.action_mask[:, start:stop],
    )


def split_sequences(fragment: Fragment, seq_len: int, starts: np.ndarray) -> Fragment:
    """A [T, B] fragment as [seq_len, T / seq_len * B] sequences (truncated BPTT, maxSeqLen).

    Column `i * B + b` is steps [i * seq_len, (i + 1) * seq_len) of env b, starting from
    `starts[i, b]` (the worker's state before that step, [T / seq_len, B, S]); its bootstrap
    observation is the next sequence's first (the fragment's own for the last). Env steps,
    episodes and the policy version are unchanged.
    """
    t_len, b = fragment.actions.shape[:2]
    n = t_len // seq_len
    if n * seq_len != t_len or starts.shape[:2] != (n, b):
        raise ValueError(f"{t_len} steps do not split into {starts.shape[0]} x {seq_len}")

    def seqs(a: np.ndarray) -> np.ndarray:
        rest = a.shape[2:]
        return a.reshape(n, seq_len, b, *rest).swapaxes(0, 1).reshape(seq_len, n * b, *rest)

    nexts = np.concatenate([fragment.obs[seq_len::seq_len], fragment.bootstrap_obs[None]])
    t, col = fragment.final_steps[:, 0], fragment.final_steps[:, 1]
    return Fragment(
        **{name: seqs(getattr(fragment, name)) for name in _ARRAY_FIELDS},
        final_obs=fragment.final_obs,
        final_steps=np.stack([t % seq_len, (t // seq_len) * b + col], axis=1).astype(np.int64),
        bootstrap_obs=nexts.reshape(n * b, *nexts.shape[2:]),
        state_in=starts.reshape(n * b, -1),
        policy_version=fragment.policy_version,
        episode_returns=fragment.episode_returns,
        episode_lengths=fragment.episode_lengths,
        worker_id=fragment.worker_id,
        busy_seconds=fragment.busy_seconds,
        policy_id=fragment.policy_id,
        action_mask=seqs(fragment.action_mask) if fragment.action_mask.size else no_mask(),
    )
