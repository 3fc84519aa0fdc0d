"""The driver's in-flight ledger on its own: each rule, then random interleavings against its
invariants (a model of what should be out, kept by the test)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from impala_trainer.driver.ledger import Ledger, LedgerError

# The ledger holds batches without looking at them.
BATCH: Any = object()


def test_room_counts_down_to_max_in_flight_and_back() -> None:
    ledger = Ledger(max_in_flight=2)
    assert ledger.room("a") == 2
    ledger.sent_sample("a", "m1", "f1")
    ledger.sent_sample("a", "m2", "f2")
    assert ledger.room("a") == 0 and ledger.samples_of("a") == 2
    with pytest.raises(LedgerError):
        ledger.sent_sample("a", "m3", "f3")
    request = ledger.sample_back("m1")
    assert (request.actor_id, request.fragment) == ("a", "f1")
    assert ledger.room("a") == 1 and ledger.waiting_on() == ["m2"]
    ledger.check()


def test_each_broadcast_rides_on_one_request_per_actor() -> None:
    ledger = Ledger(max_in_flight=2)
    assert ledger.weights_due("a", 0)
    assert not ledger.weights_due("a", 0)
    assert ledger.weights_due("b", 0)
    assert ledger.weights_due("a", 1)
    ledger.forget("a")  # a replacement of the same id gets the weights again
    assert ledger.weights_due("a", 1)


def test_a_backlog_parks_actors_until_it_clears() -> None:
    ledger = Ledger(max_in_flight=1)
    assert ledger.ask_again("a")
    ledger.backlog.append(BATCH)
    assert not ledger.ask_again("a") and not ledger.ask_again("b")
    assert ledger.unpark() == [] and ledger.parked == {"a", "b"}
    ledger.backlog.popleft()
    assert sorted(ledger.unpark()) == ["a", "b"] and not ledger.parked
    assert ledger.unpark() == []


def test_an_aggregator_counts_what_it_holds_and_its_sources_are_parked_when_it_goes() -> None:
    ledger = Ledger(max_in_flight=1)
    ledger.sent_sample("r0", "m0", "f0")
    ledger.sent_sample("r1", "m1", "f1")
    for meta, batches in (("m0", "b0"), ("m1", "b1")):
        request = ledger.sample_back(meta)
        ledger.sent_to_aggregator(batches, "agg", source=request.actor_id)
    assert ledger.in_flight("agg") == 2 and ledger.in_flight("r0") == 0
    assert ledger.is_aggregation("b0") and not ledger.is_sample("b0")
    back = ledger.aggregation_back("b0")
    assert (back.aggregator_id, back.source) == ("agg", "r0")
    ledger.forget("agg")  # r1's fragment is lost with it: r1 samples anew
    assert ledger.parked == {"r1"} and ledger.waiting_on() == [] and ledger.in_flight("agg") == 0
    ledger.check()


def test_forgetting_an_actor_drops_its_requests() -> None:
    ledger = Ledger(max_in_flight=2)
    ledger.sent_sample("a", "m1", "f1")
    ledger.sent_sample("b", "m2", "f2")
    ledger.park("a")
    ledger.forget("a")
    assert ledger.waiting_on() == ["m2"] and ledger.samples_of("a") == 0 and not ledger.parked
    ledger.check()


def test_check_names_a_broken_invariant() -> None:
    ledger = Ledger(max_in_flight=1)
    ledger.sent_sample("a", "m1", "f1")
    ledger._per_actor["a"] += 1  # what a driver writing around the ledger would do
    with pytest.raises(LedgerError, match="per-actor counts"):
        ledger.check()


ROLLOUTS = ("r0", "r1", "r2")
AGGREGATORS = ("g0", "g1")


class LedgerMachine(RuleBasedStateMachine):
    """Random sends, answers, aggregations, backlog changes and deaths; after each, the ledger
    agrees with a plain model of what is out."""

    def __init__(self) -> None:
        super().__init__()
        self.max_in_flight = 2
        self.ledger = Ledger(self.max_in_flight)
        self.refs = itertools.count()
        self.samples: dict[str, str] = {}  # meta -> actor
        self.aggregations: dict[str, tuple[str, str]] = {}  # batches -> (aggregator, source)

    @rule(actor=st.sampled_from(ROLLOUTS))
    def submit(self, actor: str) -> None:
        for _ in range(self.ledger.room(actor)):
            meta = f"m{next(self.refs)}"
            self.ledger.sent_sample(actor, meta, f"f{meta}")
            self.samples[meta] = actor

    @precondition(lambda self: self.samples)
    @rule(data=st.data(), aggregator=st.sampled_from((None, *AGGREGATORS)))
    def sample_answers(self, data: st.DataObject, aggregator: str | None) -> None:
        meta = data.draw(st.sampled_from(sorted(self.samples)))
        request = self.ledger.sample_back(meta)
        assert request.actor_id == self.samples.pop(meta) and request.fragment == f"f{meta}"
        if aggregator is not None:
            batches = f"b{next(self.refs)}"
            self.ledger.sent_to_aggregator(batches, aggregator, source=request.actor_id)
            self.aggregations[batches] = (aggregator, request.actor_id)
        elif self.ledger.ask_again(request.actor_id):
            self.submit(request.actor_id)

    @precondition(lambda self: self.aggregations)
    @rule(data=st.data())
    def aggregation_answers(self, data: st.DataObject) -> None:
        batches = data.draw(st.sampled_from(sorted(self.aggregations)))
        back = self.ledger.aggregation_back(batches)
        assert (back.aggregator_id, back.source) == self.aggregations.pop(batches)
        if self.ledger.ask_again(back.source):
            self.submit(back.source)

    @rule()
    def backlog_grows(self) -> None:
        self.ledger.backlog.append(BATCH)

    @precondition(lambda self: self.ledger.backlog)
    @rule()
    def learner_takes_a_batch(self) -> None:
        self.ledger.backlog.popleft()
        for actor in self.ledger.unpark():
            self.submit(actor)

    @rule(actor=st.sampled_from(ROLLOUTS + AGGREGATORS))
    def actor_dies(self, actor: str) -> None:
        lost_sources = {s for a, s in self.aggregations.values() if a == actor}
        self.ledger.forget(actor)
        self.samples = {m: a for m, a in self.samples.items() if a != actor}
        self.aggregations = {b: v for b, v in self.aggregations.items() if v[0] != actor}
        assert lost_sources - {actor} <= self.ledger.parked

    @invariant()
    def agrees_with_the_model(self) -> None:
        self.ledger.check()
        assert set(self.ledger.waiting_on()) == set(self.samples) | set(self.aggregations)
        per_actor = Counter(self.samples.values())
        for actor in ROLLOUTS:
            assert self.ledger.samples_of(actor) == per_actor[actor] <= self.max_in_flight
        for aggregator in AGGREGATORS:
            held = sum(1 for a, _ in self.aggregations.values() if a == aggregator)
            assert self.ledger.in_flight(aggregator) == held

    @invariant()
    def parked_only_behind_a_backlog(self) -> None:
        # Parking is backpressure: with nothing waiting for the learner, the driver's next
        # step (`unpark`) sends every parked actor its request.
        if not self.ledger.backlog:
            for actor in self.ledger.unpark():
                self.submit(actor)
            assert not self.ledger.parked


TestLedgerInterleavings = LedgerMachine.TestCase
TestLedgerInterleavings.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
