"""What the IMPALA driver has asked for and not yet got: one ledger instead of parallel maps.

Every sample request out (by the rollout actor that owes it), every fragment an aggregator actor
holds (by the aggregator, and the rollout actor to ask again when its batches are back), the
actors parked while a train batch waits for room in the learner queue, the broadcast version each
actor was last sent, and that backlog of train batches itself. RLlib keeps its in-flight requests
in one manager too (`FaultTolerantActorManager`); here the rules that decide who is asked next
live with the state they read, so they are tested on their own (`check` states the invariants).

Pure: refs are opaque, hashable handles; no Ray, no backend calls, no clock.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from impala_trainer.backend import Ref
from impala_trainer.batches import TrainBatch


@dataclass(frozen=True)
class SampleRequest:
    """A sample request out: the meta ref is the ledger's key, the fragment's ref comes with it."""

    actor_id: str
    fragment: Ref | None
    """None: the key's one object holds both (`Backend.sample_whole`)."""


@dataclass(frozen=True)
class Aggregation:
    """A fragment handed to an aggregator actor (by reference), keyed by its batches' ref."""

    aggregator_id: str
    source: str
    """The rollout actor whose fragment it is: asked again when the batches are back, not
    before, so an aggregator adds no fragment in flight (and no policy lag)."""


class LedgerError(AssertionError):
    """An invariant of the ledger does not hold: a bug in the driver, never bad input."""


class Ledger:
    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        """`maxRequestsInFlightPerWorker`: sample requests each rollout actor keeps out."""
        self.backlog: deque[TrainBatch] = deque()
        """Train batches waiting for room in the learner queue, oldest first."""
        self.parked: set[str] = set()
        """Rollout actors owed a request, held back while the backlog is not empty."""
        self._samples: dict[Ref, SampleRequest] = {}
        self._aggregations: dict[Ref, Aggregation] = {}
        self._per_actor: Counter[str] = Counter()
        self._weights_sent: dict[str, int] = {}

    # -- what is out ----------------------------------------------------------------------------

    def waiting_on(self) -> list[Ref]:
        """Every ref a result is due on: sample metas, then aggregated batch lists."""
        return [*self._samples, *self._aggregations]

    def is_sample(self, ref: Ref) -> bool:
        return ref in self._samples

    def is_aggregation(self, ref: Ref) -> bool:
        return ref in self._aggregations

    def samples_of(self, actor_id: str) -> int:
        return self._per_actor[actor_id]

    def samples_out(self) -> int:
        return len(self._samples)

    def aggregations(self) -> list[Aggregation]:
        return list(self._aggregations.values())

    def in_flight(self, actor_id: str) -> int:
        """Requests `actor_id` still owes: its samples, or the fragments it aggregates."""
        held = sum(1 for a in self._aggregations.values() if a.aggregator_id == actor_id)
        return self._per_actor[actor_id] + held

    def room(self, actor_id: str) -> int:
        """How many more sample requests `actor_id` may be sent now."""
        return max(0, self.max_in_flight - self._per_actor[actor_id])

    # -- requests -------------------------------------------------------------------------------

    def weights_due(self, actor_id: str, version: int) -> bool:
        """Whether the next request to `actor_id` must carry broadcast `version` (it is recorded
        as sent): each broadcast rides on one request per actor, not on every one."""
        if self._weights_sent.get(actor_id) == version:
            return False
        self._weights_sent[actor_id] = version
        return True

    def sent_sample(self, actor_id: str, meta: Ref, fragment: Ref | None) -> None:
        if self._per_actor[actor_id] >= self.max_in_flight:
            raise LedgerError(f"{actor_id} already has {self.max_in_flight} samples in flight")
        self._samples[meta] = SampleRequest(actor_id, fragment)
        self._per_actor[actor_id] += 1

    def sample_back(self, meta: Ref) -> SampleRequest:
        """The request `meta` answered (or failed): no longer in flight."""
        request = self._samples.pop(meta)
        self._per_actor[request.actor_id] -= 1
        if not self._per_actor[request.actor_id]:
            del self._per_actor[request.actor_id]
        return request

    def sent_to_aggregator(self, batches: Ref, aggregator_id: str, source: str) -> None:
        self._aggregations[batches] = Aggregation(aggregator_id, source)

    def aggregation_back(self, batches: Ref) -> Aggregation:
        return self._aggregations.pop(batches)

    # -- backpressure ---------------------------------------------------------------------------

    def ask_again(self, actor_id: str) -> bool:
        """Whether to send `actor_id` its next request now; while a batch waits for the learner
        queue it is parked instead (backpressure, nothing dropped)."""
        if self.backlog:
            self.parked.add(actor_id)
            return False
        return True

    def park(self, actor_id: str) -> None:
        """Hold `actor_id` until the backlog clears (its fragment was lost with an aggregator)."""
        self.parked.add(actor_id)

    def unpark(self) -> list[str]:
        """The parked actors to ask again, once the backlog is empty (else none)."""
        if self.backlog or not self.parked:
            return []
        actors = list(self.parked)
        self.parked.clear()
        return actors

    # -- actors leaving -------------------------------------------------------------------------

    def forget(self, actor_id: str) -> None:
        """`actor_id` is gone: its requests will never answer. The fragments it aggregated are
        lost with it, so their rollout actors are parked to sample anew."""
        for ref in [r for r, s in self._samples.items() if s.actor_id == actor_id]:
            del self._samples[ref]
        for ref in [r for r, a in self._aggregations.items() if a.aggregator_id == actor_id]:
            self.parked.add(self._aggregations.pop(ref).source)
        self._per_actor.pop(actor_id, None)
        self.parked.discard(actor_id)
        self._weights_sent.pop(actor_id, None)

    def check(self) -> None:
        """Raise LedgerError unless the invariants hold (the tests call it after each step)."""
        counted = Counter(s.actor_id for s in self._samples.values())
        if counted != self._per_actor:
            raise LedgerError(f"per-actor counts {dict(self._per_actor)} != {dict(counted)}")
        over = {a: n for a, n in counted.items() if n > self.max_in_flight}
        if over:
            raise LedgerError(f"over maxRequestsInFlightPerWorker {self.max_in_flight}: {over}")
        both = set(self._samples) & set(self._aggregations)
        if both:
            raise LedgerError(f"refs both a sample and an aggregation: {both}")
