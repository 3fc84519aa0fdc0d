"""Elastic membership: the driver's actors follow the Ray cluster's rollout and aggregator nodes.

On a multi-pod job the learner is the Ray head and rollout/aggregator pods come and go (the
operator's autoscaler, preemption, a crashed pod). Every POLL_SECONDS the driver reads the GCS's
node table and drain list and:

* sets each role's target to the units its alive, non-draining nodes offer, so a node that joins
  gets actors on the next poll (placed by the custom resource, one actor per unit);
* marks the actors on a draining node (its pod got SIGTERM, see commands/nodes.py) `draining`:
  the driver sends them no new work, their in-flight fragments arrive and are trained on as
  usual, then the hand-over runs in the actor (an aggregator returns the fragments it still
  buffers, a rollout actor reports how many env steps it sampled), and only then is the actor
  released, which lets the node's raylet go idle and exit;
* retires the actors of nodes that vanished (no drain: a killed pod), without stopping training,
  as RLlib's FaultTolerantActorManager does for unhealthy actors;
* cancels actors that wait for capacity no node offers any more, or for a unit of a node that
  other actors hold.

`plan()` holds the decisions as a pure function; `ElasticMembership` does the I/O, through the
driver's `Backend`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from impala_api.snapshot import Membership
from impala_trainer.backend import ROLES, NodeView, Ref, Role
from impala_trainer.batches import Fragment, Handover
from impala_trainer.driver.actor_manager import ActorManager, ManagedActor, remember_dead

logger = logging.getLogger(__name__)
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class ActorView:
    actor_id: str
    role: Role
    node_id: str
    """Empty while the actor has not said where it runs."""
    state: str


@dataclass
class Plan:
    """What one poll decided."""

    targets: dict[Role, int]
    nodes: dict[Role, int]
    """Alive nodes offering each role's resource (draining ones included: they still serve)."""
    drain: list[str] = field(default_factory=list)
    """Actors to stop feeding: their node is draining."""
    lost: list[str] = field(default_factory=list)
    """Actors whose node is gone: retire them now."""
    cancel: list[str] = field(default_factory=list)
    """Starting actors beyond the capacity left: they would wait for a node that is gone."""


def plan(nodes: list[NodeView], actors: list[ActorView]) -> Plan:
    """Targets from the non-draining capacity, and what happens to each actor."""
    alive = {n.node_id: n for n in nodes if n.alive}
    targets = {r: sum(n.units.get(r, 0) for n in alive.values() if not n.draining) for r in ROLES}
    counts = {r: sum(1 for n in alive.values() if n.units.get(r, 0) > 0) for r in ROLES}
    out = Plan(targets=targets, nodes=counts)
    for a in actors:
        if not a.node_id or a.state == "dead":
            continue
        node = alive.get(a.node_id)
        if node is None:
            out.lost.append(a.actor_id)
        elif node.draining and a.state != "draining":
            out.drain.append(a.actor_id)
    gone = set(out.lost)
    left = [a for a in actors if a.actor_id not in gone]
    for role in ROLES:
        # Actors that still count toward the role: not lost, not leaving with a draining node.
        staying = [
            a
            for a in actors
            if a.role == role
            and a.state in ("starting", "healthy")
            and a.actor_id not in gone
            and a.actor_id not in out.drain
        ]
        oversubscribed = [a for a in _oversubscribed(role, alive, left) if a not in out.drain]
        out.cancel.extend(oversubscribed)
        staying = [a for a in staying if a.actor_id not in oversubscribed]
        excess = len(staying) - targets[role]
        # Beyond that, only unplaced actors can be in excess (a placed one holds a unit of a
        # live node); newest first, since they are the least likely to be about to start.
        unplaced = [a for a in staying if not a.node_id]
        out.cancel.extend(a.actor_id for a in reversed(unplaced[-excess:] if excess > 0 else []))
    return out


def _oversubscribed(role: Role, alive: dict[str, NodeView], actors: list[ActorView]) -> list[str]:
    """Starting actors the GCS queued on a node whose units other actors already hold, newest
    first: they would wait there for good. Seen after a network cut, where failures and rejoins
    overlap: a replacement made for an actor that failed before the GCS declared its node dead
    was queued on a rejoined node whose unit another new actor then took."""
    out: list[str] = []
    for node_id, node in alive.items():
        on_node = [
            a for a in actors if a.role == role and a.node_id == node_id and a.state != "dead"
        ]
        over = len(on_node) - node.units.get(role, 0)
        starting = [a.actor_id for a in on_node if a.state == "starting"]
        out.extend(reversed(starting[-over:]) if over > 0 else [])
    return out


class DriverHooks(Protocol):
    """What membership needs from the driver (driver.base.Driver implements it)."""

    def on_new_actor(self, actor: ManagedActor) -> None: ...
    def forget(self, actor_id: str) -> None: ...
    def in_flight(self, actor_id: str) -> int: ...
    def absorb(self, fragments: list[Fragment]) -> None: ...


class ElasticActorManager(ActorManager):
    """ActorManager whose targets and capacity come from the observed nodes, not from flags."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._capacity: dict[Role, int] = {"rollout": 0, "aggregator": 0}
        self.produced: dict[str, int] = {}
        """Actor id -> env steps it reported at hand-over (released rollout actors)."""

    def capacity(self, role: Role) -> int:
        return self._capacity[role]

    def refresh_nodes(self) -> None:
        """Membership polls the nodes itself (ElasticMembership.tick)."""

    def apply(self, p: Plan) -> None:
        """Adopt a poll's targets and node counts."""
        for role in ROLES:
            self._capacity[role] = p.targets[role]
            self.set_target(role, p.targets[role])
        self._nodes = dict(p.nodes)

    def next_aggregator(self) -> ManagedActor | None:
        """Round-robin over aggregators that still take fragments (not draining ones)."""
        usable = [a for a in self.live("aggregator") if a.state != "draining"]
        return usable[next(self._round_robin) % len(usable)] if usable else None

    def on_failure(self, actor_id: str, error: BaseException) -> ManagedActor | None:
        """As ActorManager's, but only a constructor that raised counts as a start-up failure.

        Here nodes leave while actors start on them (a pod killed, a replacement placed on a
        node the GCS has not yet declared dead); that is membership, not a broken configuration,
        and must not fail the run after a few repetitions.
        """
        actor = self.actors.get(actor_id)
        if actor is not None and actor.state == "starting" and not self.backend.init_failed(error):
            actor.state = "healthy"
        return super().on_failure(actor_id, error)

    def membership(self) -> Membership:
        """As ActorManager's, plus each released actor's own env-step count."""
        out = super().membership()
        for m in out.members:
            m.env_steps_produced = self.produced.get(m.actor_id)
        return out

    def retire(self, actor_id: str, produced: int | None = None) -> ManagedActor | None:
        """Remove an actor for good (released after its drain, lost, or cancelled)."""
        actor = self.actors.pop(actor_id, None)
        if actor is None:
            return None
        actor.state = "dead"
        if produced is not None:
            self.produced[actor_id] = produced
        self.dead = remember_dead(self.dead, actor, keep=50)
        self.backend.kill(actor.handle)
        return actor


class ElasticMembership:
    """Drives an ElasticActorManager from the cluster's node table; `tick` from the driver loop."""

    def __init__(self, manager: ElasticActorManager, poll_seconds: float = POLL_SECONDS) -> None:
        self.manager = manager
        self.backend = manager.backend
        self.poll_seconds = poll_seconds
        self._last_poll = float("-inf")
        self._handovers: dict[Ref, str] = {}  # handover ref -> actor id
        self.lost_env_steps = 0
        """Env steps released rollout actors sampled that never reached the driver."""

    def tick(self, driver: DriverHooks) -> None:
        """Poll the nodes (every poll_seconds) and move draining actors along; never blocks."""
        now = time.monotonic()
        if now - self._last_poll >= self.poll_seconds:
            self._last_poll = now
            self._poll(driver)
        self._progress_drains(driver)

    def _poll(self, driver: DriverHooks) -> None:
        p = plan(self.backend.nodes(), [self._view(a) for a in self.manager.actors.values()])
        self.manager.apply(p)
        for actor_id in p.drain:
            logger.info("actor %s: node draining, finishing in-flight work", actor_id)
            self.manager.actors[actor_id].state = "draining"
        for actor_id in [*p.lost, *p.cancel]:
            logger.warning("actor %s: dropped (node gone or no capacity left)", actor_id)
            driver.forget(actor_id)
            self.manager.retire(actor_id)
        for actor in self.manager.ensure_targets():
            driver.on_new_actor(actor)

    def _progress_drains(self, driver: DriverHooks) -> None:
        waiting = set(self._handovers.values())
        for actor in list(self.manager.actors.values()):
            if actor.state != "draining" or actor.actor_id in waiting:
                continue
            if driver.in_flight(actor.actor_id) == 0:
                self._handovers[self.backend.handover(actor.handle)] = actor.actor_id
        if not self._handovers:
            return
        refs = list(self._handovers)
        ready, _ = self.backend.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            actor_id = self._handovers.pop(ref)
            leaving = self.manager.actors.get(actor_id)
            try:
                got: Handover = self.backend.get(ref)
            except self.backend.failure as err:  # the node went before the hand-over
                logger.warning("actor %s: hand-over failed: %s", actor_id, err)
                driver.forget(actor_id)
                self.manager.retire(actor_id)
                continue
            if got.fragments:
                driver.absorb(got.fragments)
            if got.env_steps is not None and leaving is not None:
                lost = max(0, got.env_steps - leaving.env_steps)
                if lost:
                    logger.warning("actor %s: %d env steps lost in its drain", actor_id, lost)
                self.lost_env_steps += lost
            driver.forget(actor_id)
            self.manager.retire(actor_id, got.env_steps)
            logger.info("actor %s: drained and released", actor_id)

    def _view(self, a: ManagedActor) -> ActorView:
        node_id = a.node_id or (self.backend.placed_on(a.handle) if a.state == "starting" else "")
        return ActorView(a.actor_id, a.role, node_id, a.state)
