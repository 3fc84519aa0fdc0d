"""Fault-tolerant bookkeeping of the driver's Ray actors (like RLlib's FaultTolerantActorManager).

The manager creates rollout and aggregator actors up to a target count, records where they run,
replaces an actor that died (or drops it when the cluster no longer offers its resource), and
reports membership for status.json. It never waits on an actor: readiness is polled with
`backend.wait(timeout=0)`, so the driver loop is never held up by a slow-starting process.
Elastic membership (pods joining and leaving) extends this class: `set_target` and
`ensure_targets` are the hooks.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Literal

from impala_api.snapshot import Member, Membership
from impala_api.spec import ImpalaJobSpec
from impala_trainer.backend import ROLES, Backend, Handle, Ref, Role
from impala_trainer.batches import NodeInfo

# An actor that dies this many times in a row before ever answering is a broken configuration,
# not bad luck: fail the run instead of replacing it forever.
MAX_STARTUP_FAILURES = 3
KEEP_DEAD = 10
"""Dead actors status.json lists beside the live ones (`remember_dead`)."""


class ActorStartupError(RuntimeError):
    """Actors of a role keep dying before they finish starting."""


@dataclass
class ManagedActor:
    """One actor and what the driver knows about it."""

    actor_id: str
    role: Role
    handle: Handle
    seed: int
    state: Literal["starting", "healthy", "draining", "dead"] = "starting"
    node_id: str = ""
    node_ip: str = ""
    env_steps: int = 0
    created_at: float = field(default_factory=time.time)
    info_ref: Ref | None = None

    def member(self) -> Member:
        return Member(
            actor_id=self.actor_id,
            role=self.role,
            node_id=self.node_id,
            node_ip=self.node_ip,
            state=self.state,
            env_steps=self.env_steps,
        )


def remember_dead(
    dead: list[ManagedActor], actor: ManagedActor, keep: int = KEEP_DEAD
) -> list[ManagedActor]:
    """`dead` with `actor` added, at most `keep` long, the oldest dropped first, but those that
    delivered no env steps before any that did.

    Cut off from the learner, a node's actors are replaced and die again and again (14 in a
    30 s network cut of the real-node test) without sampling anything; dropping them first keeps
    the listed members' env steps summing to the job's count (each step counted once) until more
    than `keep` actors that sampled have died.
    """
    out = [*dead, actor]
    while len(out) > keep:
        idle = next((i for i, a in enumerate(out) if a.env_steps == 0), 0)
        del out[idle]
    return out


class ActorManager:
    """Creates, tracks and replaces the rollout and aggregator actors of one job."""

    def __init__(self, spec: ImpalaJobSpec, base_seed: int, backend: Backend) -> None:
        self.spec = spec
        self.base_seed = base_seed
        self.backend = backend
        self.actors: dict[str, ManagedActor] = {}
        self.dead: list[ManagedActor] = []
        self.targets: dict[Role, int] = {"rollout": 0, "aggregator": 0}
        self.restarts = 0
        self._startup_failures: dict[Role, int] = {"rollout": 0, "aggregator": 0}
        self._ids = {role: itertools.count() for role in ROLES}
        self._round_robin = itertools.count()
        self._nodes: dict[Role, int] = {"rollout": 0, "aggregator": 0}

    # -- creation -------------------------------------------------------------------------------

    def set_target(self, role: Role, count: int) -> None:
        """Desired number of actors of `role` (created by ensure_targets)."""
        self.targets[role] = max(0, count)

    def capacity(self, role: Role) -> int:
        """Units of the role's resource the cluster offers (one actor each)."""
        return self.backend.units()[role]

    def ensure_targets(self) -> list[ManagedActor]:
        """Create actors until each role has min(target, capacity); return the new ones."""
        created: list[ManagedActor] = []
        for role in ROLES:
            want = min(self.targets[role], self.capacity(role))
            while len(self.live(role)) < want:
                created.append(self._create(role))
        return created

    def _create(self, role: Role) -> ManagedActor:
        n = next(self._ids[role])
        actor_id = f"{role}-{n}"
        # Replacements get new seeds, so a restarted worker does not replay its predecessor.
        # Spaced wider than any numEnvsPerWorker, since sub-env i of a worker uses seed + i.
        seed = (self.base_seed + (0 if role == "rollout" else 5_000) + 10_007 * n) % (2**31)
        handle = self.backend.start(role, self.spec, actor_id, seed)
        actor = ManagedActor(actor_id=actor_id, role=role, handle=handle, seed=seed)
        actor.info_ref = self.backend.node_info(handle)
        self.actors[actor_id] = actor
        return actor

    # -- queries --------------------------------------------------------------------------------

    def live(self, role: Role) -> list[ManagedActor]:
        """Starting or healthy actors of a role."""
        return [a for a in self.actors.values() if a.role == role and a.state != "dead"]

    def next_aggregator(self) -> ManagedActor | None:
        """Round-robin over live aggregators (so each fills its batches at the same pace)."""
        live = self.live("aggregator")
        return live[next(self._round_robin) % len(live)] if live else None

    def poll(self) -> None:
        """Mark actors healthy once they answered node_info (never blocks)."""
        pending = {a.info_ref: a for a in self.actors.values() if a.info_ref is not None}
        if not pending:
            return
        ready, _ = self.backend.wait(list(pending), num_returns=len(pending), timeout=0)
        for ref in ready:
            actor = pending[ref]
            actor.info_ref = None
            try:
                info: NodeInfo = self.backend.get(ref)
            except self.backend.failure as err:
                self.on_failure(actor.actor_id, err)
                continue
            actor.node_id, actor.node_ip = info.node_id, info.node_ip
            actor.state = "healthy"
            self._startup_failures[actor.role] = 0

    # -- failures -------------------------------------------------------------------------------

    def on_failure(self, actor_id: str, error: BaseException) -> ManagedActor | None:
        """Retire a failed actor; return its replacement (None when the resource is gone)."""
        actor = self.actors.pop(actor_id, None)
        if actor is None:  # already handled (several in-flight calls fail together)
            return None
        never_started = actor.state == "starting"
        actor.state = "dead"
        self.dead = remember_dead(self.dead, actor)
        self.backend.kill(actor.handle)
        if never_started:
            self._startup_failures[actor.role] += 1
            if self._startup_failures[actor.role] >= MAX_STARTUP_FAILURES:
                raise ActorStartupError(
                    f"{actor.role} actors die while starting ({MAX_STARTUP_FAILURES} in a row); "
                    f"last error: {str(error).strip().splitlines()[-1][:300]}"
                )
        self.restarts += 1
        if len(self.live(actor.role)) >= min(self.targets[actor.role], self.capacity(actor.role)):
            return None
        return self._create(actor.role)

    # -- membership -----------------------------------------------------------------------------

    def refresh_nodes(self) -> None:
        """Count live Ray nodes offering each role's resource (a GCS call: call it rarely)."""
        alive = [n for n in self.backend.nodes() if n.alive]
        self._nodes = {role: sum(1 for n in alive if n.units.get(role, 0) > 0) for role in ROLES}

    def membership(self) -> Membership:
        """Membership section of status.json."""
        return Membership(
            rollout_workers=sum(a.state == "healthy" for a in self.live("rollout")),
            aggregator_workers=sum(a.state == "healthy" for a in self.live("aggregator")),
            rollout_nodes=self._nodes["rollout"],
            aggregator_nodes=self._nodes["aggregator"],
            members=[a.member() for a in [*self.actors.values(), *self.dead]],
        )

    def shutdown(self) -> None:
        """Kill every actor (the run is over)."""
        for actor in self.actors.values():
            self.backend.kill(actor.handle)
        self.actors.clear()
