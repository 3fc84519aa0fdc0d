"""Aggregator (concatenation to trainBatchSize) and the mixin replay buffer."""

from __future__ import annotations

import numpy as np
import pytest

from impala_trainer.batches import Fragment, TrainBatch, concat_fragments
from impala_trainer.rollouts.aggregation import Aggregator
from impala_trainer.rollouts.replay import MixInReplayBuffer


def _fragment(t: int, b: int, version: int = 0, worker: str = "w", fill: float = 0.0) -> Fragment:
    return Fragment(
        obs=np.full((t, b, 3), fill, np.float32),
        actions=np.zeros((t, b), np.int64),
        behaviour_logits=np.zeros((t, b, 2), np.float32),
        rewards=np.full((t, b), fill, np.float32),
        terminateds=np.zeros((t, b), np.bool_),
        truncateds=np.zeros((t, b), np.bool_),
        final_obs=np.zeros((0, 3), np.float32),
        final_steps=np.zeros((0, 2), np.int64),
        bootstrap_obs=np.zeros((b, 3), np.float32),
        policy_version=version,
        episode_returns=[fill],
        episode_lengths=[t],
        worker_id=worker,
    )


def test_concatenates_until_train_batch_size() -> None:
    agg = Aggregator(train_batch_size=100)
    assert agg.add(_fragment(10, 4, worker="a")) == []  # 40 steps
    assert agg.add(_fragment(10, 4, worker="b")) == []  # 80
    assert agg.pending_env_steps == 80
    (batch,) = agg.add(_fragment(10, 4, version=3, worker="a"))  # 120 >= 100
    assert batch.env_steps == 120 and batch.num_columns == 12
    assert batch.worker_ids == ["a", "b"]
    assert batch.policy_versions.tolist() == [0] * 8 + [3] * 4
    assert not batch.replayed
    assert agg.pending_env_steps == 0


def test_fragment_larger_than_batch_passes_through_alone() -> None:
    agg = Aggregator(train_batch_size=10)
    out = agg.add_many([_fragment(5, 4), _fragment(5, 4)])
    assert [b.env_steps for b in out] == [20, 20]


def test_no_replay_by_default() -> None:
    agg = Aggregator(train_batch_size=10)
    out = agg.add_many([_fragment(5, 2) for _ in range(50)])
    assert len(out) == 50 and not any(b.replayed for b in out)


@pytest.mark.parametrize("proportion", [0.5, 1.0, 2.0, 3.5])
def test_replay_batches_per_fresh_is_replays_per_fresh_batch(proportion: float) -> None:
    buf = MixInReplayBuffer(proportion, num_slots=8, seed=0)
    fresh, replayed = 0, 0
    for i in range(1000):
        out = buf.mix(concat_fragments([_fragment(2, 2, fill=float(i))]))
        assert not out[0].replayed and all(b.replayed for b in out[1:])
        fresh += 1
        replayed += len(out) - 1
    assert replayed / fresh == pytest.approx(proportion, rel=0.06)
    assert buf.replayed == replayed
    if proportion == int(proportion):  # integer proportions replay exactly that many each time
        assert replayed == int(proportion) * fresh


def test_replay_keeps_only_the_newest_slots() -> None:
    buf = MixInReplayBuffer(1.0, num_slots=3, seed=1)
    seen: set[float] = set()
    for i in range(10):
        out = buf.mix(concat_fragments([_fragment(2, 1, fill=float(i))]))
        if i >= 6:
            seen |= {float(b.rewards[0, 0]) for b in out[1:]}
    assert len(buf) == 3
    # After batch 9, only batches 7, 8, 9 are stored; anything replayed from i >= 9 is among them.
    out = buf.mix(concat_fragments([_fragment(2, 1, fill=10.0)]))
    assert {float(b.rewards[0, 0]) for b in out[1:]} <= {8.0, 9.0, 10.0}
    assert seen <= {4.0, 5.0, 6.0, 7.0, 8.0, 9.0}


def test_replayed_batches_carry_no_episodes_or_workers() -> None:
    agg = Aggregator(
        train_batch_size=4, replay_batches_per_fresh=1.0, replay_buffer_batches=4, seed=0
    )
    fresh, replay = agg.add(_fragment(2, 2, worker="w", fill=1.0))
    assert fresh.episode_returns == [1.0] and fresh.worker_ids == ["w"]
    assert replay.replayed and replay.episode_returns == [] and replay.worker_ids == []
    assert isinstance(replay, TrainBatch) and replay.env_steps == fresh.env_steps


def test_replay_needs_slots() -> None:
    with pytest.raises(ValueError, match="replayBufferBatches"):
        MixInReplayBuffer(0.5, num_slots=0)
