"""Mixin replay, as RLlib's MixInReplayBuffer: fresh batches go out with replayed ones mixed in."""

from __future__ import annotations

import dataclasses

import numpy as np

from impala_trainer.batches import TrainBatch


class MixInReplayBuffer:
    """A FIFO of the last `num_slots` train batches, replayed `proportion`:1 against fresh ones.

    `replayBatchesPerFresh` p means p replayed batches per fresh batch in expectation: the integer
    part always, the fraction with that probability (the `while random() < p: p -= 1` loop of
    RLlib's MixInMultiAgentReplayBuffer, fed p itself rather than RLlib's 1/(p-1) of its config).
    Like RLlib, a fresh batch is stored before the draw, so it may be replayed at once.
    """

    def __init__(self, proportion: float, num_slots: int, seed: int | None = None) -> None:
        if proportion < 0:
            raise ValueError(f"replayBatchesPerFresh must be >= 0, got {proportion}")
        if proportion > 0 and num_slots < 1:
            raise ValueError("replayBatchesPerFresh > 0 needs replayBufferBatches >= 1")
        self.proportion = proportion
        self.num_slots = num_slots
        self._slots: list[TrainBatch] = []
        self._next = 0  # ring index of the oldest batch once the buffer is full
        self._rng = np.random.default_rng(seed)
        self.replayed = 0
        """Batches served from the buffer so far."""

    def __len__(self) -> int:
        return len(self._slots)

    def add(self, batch: TrainBatch) -> None:
        """Store a fresh batch, evicting the oldest when all slots are taken."""
        if self.num_slots == 0:
            return
        if len(self._slots) < self.num_slots:
            self._slots.append(batch)
        else:
            self._slots[self._next] = batch
            self._next = (self._next + 1) % self.num_slots

    def mix(self, fresh: TrainBatch) -> list[TrainBatch]:
        """`fresh` followed by the replayed batches drawn for it (each flagged `replayed`)."""
        out = [fresh]
        if self.proportion <= 0:
            return out
        self.add(fresh)
        remaining = self.proportion
        while self._rng.random() < remaining:
            remaining -= 1.0
            stored = self._slots[int(self._rng.integers(len(self._slots)))]
            # Replays reuse the stored arrays; they carry no new episodes and no workers to
            # update, so the driver counts neither twice.
            out.append(
                dataclasses.replace(
                    stored, replayed=True, episode_returns=[], episode_lengths=[], worker_ids=[]
                )
            )
            self.replayed += 1
        return out
