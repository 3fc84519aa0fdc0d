"""Fragments in, train batches out: concatenation to trainBatchSize plus mixin replay.

The driver uses an `Aggregator` directly when the job has no aggregator actors; otherwise each
`actors.AggregatorActor` wraps one and the rollout fragments reach it by object reference, so the
concatenation (and any replay copying) happens off the driver.
"""

from __future__ import annotations

from impala_api.spec import ImpalaJobSpec
from impala_trainer.batches import Fragment, Sample, TrainBatch, concat_fragments
from impala_trainer.rollouts.replay import MixInReplayBuffer


class Aggregator:
    """Builds train batches of at least `train_batch_size` env steps, as RLlib does.

    Fragments are held until their steps reach the batch size, then concatenated along the
    environment axis into one batch (a batch may exceed the size by less than one fragment;
    fragments are never split, so every column stays one contiguous trajectory piece). A
    multi-agent sample's fragments are batched per policy, each policy with its own replay.
    """

    def __init__(
        self,
        train_batch_size: int,
        replay_batches_per_fresh: float = 0.0,
        replay_buffer_batches: int = 0,
        seed: int | None = None,
    ) -> None:
        self.train_batch_size = train_batch_size
        self._replay_settings = (replay_batches_per_fresh, replay_buffer_batches, seed)
        self._replays: dict[str, MixInReplayBuffer] = {}
        self._pending: dict[str, list[Fragment]] = {}
        self._pending_steps: dict[str, int] = {}
        self.fragments_in = 0
        self.batches_out = 0

    @classmethod
    def from_spec(cls, spec: ImpalaJobSpec, seed: int | None = None) -> Aggregator:
        """An aggregator with the job's trainBatchSize and replay settings."""
        t = spec.training
        return cls(t.train_batch_size, t.replay_batches_per_fresh, t.replay_buffer_batches, seed)

    @property
    def pending_env_steps(self) -> int:
        """Env steps held back until the next batch fills."""
        return sum(self._pending_steps.values())

    def add(self, sample: Sample) -> list[TrainBatch]:
        """Take one sample; return the train batches it completes (fresh, then replays)."""
        out: list[TrainBatch] = []
        for fragment in sample.parts():
            out.extend(self._add(fragment))
        return out

    def _add(self, fragment: Fragment) -> list[TrainBatch]:
        self.fragments_in += 1
        policy = fragment.policy_id
        pending = self._pending.setdefault(policy, [])
        pending.append(fragment)
        self._pending_steps[policy] = self._pending_steps.get(policy, 0) + fragment.env_steps
        if self._pending_steps[policy] < self.train_batch_size:
            return []
        batch = concat_fragments(pending)
        del self._pending[policy], self._pending_steps[policy]
        replay = self._replays.get(policy)
        if replay is None:
            replay = self._replays[policy] = MixInReplayBuffer(*self._replay_settings)
        out = replay.mix(batch)
        self.batches_out += len(out)
        return out

    def take_pending(self) -> list[Fragment]:
        """Hand over the fragments still waiting for a batch (an aggregator leaving the job)."""
        pending = [f for fragments in self._pending.values() for f in fragments]
        self._pending, self._pending_steps = {}, {}
        return pending

    def add_many(self, fragments: list[Fragment]) -> list[TrainBatch]:
        """`add` for several fragments; all completed batches in order."""
        out: list[TrainBatch] = []
        for fragment in fragments:
            out.extend(self.add(fragment))
        return out
