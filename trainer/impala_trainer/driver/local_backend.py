"""`Backend` in the driver's own process: every call runs at once on a plain worker.

The same RolloutWorker and Aggregator the Ray actors wrap, built and called directly; a call's
result (or its exception) is ready when the call returns. The driver runs unchanged on it, so its
tests check real bookkeeping (which actor is asked for what, when; replacement of a dead one;
drains) without Ray processes. `crash` makes an actor fail its next calls as a dead Ray actor
would; `nodes`/`units` describe one local node whose capacity a test can change.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from impala_api.spec import ImpalaJobSpec
from impala_trainer.backend import ROLES, LearnerMethod, NodeView, Role
from impala_trainer.batches import Gradients, Handover, NodeInfo
from impala_trainer.learners.worker import LearnerWorker
from impala_trainer.learning.learner import LearnerPolicy
from impala_trainer.policy.rounds import Evaluator
from impala_trainer.rollouts.aggregation import Aggregator
from impala_trainer.rollouts.worker import RolloutWorker

NODE_ID = "local"

_ids = itertools.count()


class ActorDied(RuntimeError):
    """A call on a crashed (or killed) local actor, as Ray's RayActorError."""

    def __init__(self, message: str, *, init_failed: bool = False) -> None:
        super().__init__(message)
        self.actor_init_failed = init_failed


@dataclass(eq=False)
class LocalRef:
    """A finished call: its value, or the exception `get` raises; or a learner's call still
    running on its thread (`future`)."""

    value: Any = None
    error: BaseException | None = None
    id: int = field(default_factory=lambda: next(_ids))
    future: concurrent.futures.Future[Any] | None = None

    def done(self) -> bool:
        return self.future is None or self.future.done()

    def __hash__(self) -> int:
        return self.id


@dataclass(eq=False)
class LocalActor:
    role: Role | Literal["evaluation", "learner"]
    actor_id: str
    worker: RolloutWorker | None = None
    aggregator: Aggregator | None = None
    evaluator: Evaluator | None = None
    learner: LearnerWorker | None = None
    pool: concurrent.futures.ThreadPoolExecutor | None = None
    """A learner's calls run on threads of their own, as a threaded Ray actor's: its group's
    collectives block until every learner takes part."""
    error: BaseException | None = None
    """Set once the actor is dead: every later call fails with it."""
    calls: list[str] = field(default_factory=list)
    """Names of the calls made on it, in order (what tests assert on)."""
    versions_sent: list[int | None] = field(default_factory=list)
    """Per sample request: the policy version of the weights it carried, None without."""


class LocalBackend:
    """Runs actors as plain objects in this process; see the module docstring."""

    failure = ActorDied

    def __init__(self, rollout_units: int = 0, aggregator_units: int = 0) -> None:
        self.capacity: dict[Role, int] = {"rollout": rollout_units, "aggregator": aggregator_units}
        self.draining = False
        """Whether the one local node is draining (a test of membership's drain)."""
        self.actors: list[LocalActor] = []
        self.evaluators: list[LocalActor] = []
        self.learners: list[LocalActor] = []
        self._stores: dict[int, Any] = {}
        self.puts = 0

    # -- test controls --------------------------------------------------------------------------

    def crash(self, actor: LocalActor, message: str = "the actor died") -> None:
        """Make `actor` fail every later call, as a killed Ray actor does. A learner's thread
        stops too, without waiting for it: a dead process's peers see their all-reduce with it
        end, where a thread left running would hold them in it (learner 0 stepping while the
        driver, its peer's calls failing, never feeds learner 1 again)."""
        actor.error = ActorDied(f"{actor.actor_id}: {message}")
        if actor.learner is not None:
            actor.learner.stop(wait=False)

    # -- actors ---------------------------------------------------------------------------------

    def start(self, role: Role, spec: ImpalaJobSpec, actor_id: str, seed: int) -> LocalActor:
        actor = LocalActor(role, actor_id)
        try:
            if role == "rollout":
                actor.worker = RolloutWorker(spec, actor_id, seed)
            else:
                actor.aggregator = Aggregator.from_spec(spec, seed)
        except Exception as exc:  # Ray reports a constructor's exception on the first call
            actor.error = ActorDied(f"{actor_id}: {exc}", init_failed=True)
        self.actors.append(actor)
        return actor

    def kill(self, handle: LocalActor) -> None:
        if handle.error is None:
            handle.error = ActorDied(f"{handle.actor_id} was killed")
        if handle.learner is not None and handle.pool is not None:
            handle.learner.stop()
            handle.pool.shutdown(wait=False, cancel_futures=True)

    def _call(self, actor: LocalActor, name: str, fn: Callable[[], Any]) -> LocalRef:
        actor.calls.append(name)
        if actor.error is not None:
            return LocalRef(error=actor.error)
        try:
            return LocalRef(fn())
        except Exception as exc:  # an actor method that raises: Ray hands it to `get`
            return LocalRef(error=exc)

    def node_info(self, handle: LocalActor) -> LocalRef:
        return self._call(handle, "node_info", lambda: NodeInfo(NODE_ID, "127.0.0.1"))

    def sample(
        self, handle: LocalActor, weights: Any | None, version: int
    ) -> tuple[LocalRef, LocalRef]:
        handle.versions_sent.append(None if weights is None else version)
        worker = handle.worker
        if worker is None:
            raise TypeError(f"{handle.actor_id} is not a rollout actor")

        def sample() -> Any:
            if weights is not None:  # Ray resolves a reference passed as an argument
                worker.set_weights(self._resolve(weights), version)
            return worker.sample()

        fragment = self._call(handle, "sample", sample)
        if fragment.error is not None:
            return fragment, LocalRef(error=fragment.error)
        return fragment, LocalRef(fragment.value.meta())

    def sample_whole(
        self, handle: LocalActor, weights: Any | None, version: int, direct: bool = False
    ) -> LocalRef:
        # In process there is no transport to choose: `direct` changes nothing.
        fragment, meta = self.sample(handle, weights, version)
        if fragment.error is not None:
            return fragment
        return LocalRef((fragment.value, meta.value))

    def aggregate(self, handle: LocalActor, fragment: Any) -> LocalRef:
        aggregator = handle.aggregator
        if aggregator is None:
            raise TypeError(f"{handle.actor_id} is not an aggregator")
        return self._call(handle, "aggregate", lambda: aggregator.add(self._resolve(fragment)))

    def compute_gradients(
        self, handle: LocalActor, weights: Any | None, version: int, global_timestep: int
    ) -> LocalRef:
        worker = handle.worker
        if worker is None:
            raise TypeError(f"{handle.actor_id} is not a rollout actor")

        def compute() -> Gradients:
            if weights is not None:
                worker.set_weights(self._resolve(weights), version)
            return worker.compute_gradients(global_timestep)

        return self._call(handle, "compute_gradients", compute)

    def handover(self, handle: LocalActor) -> LocalRef:
        def handover() -> Handover:
            if handle.aggregator is not None:
                return Handover(handle.aggregator.take_pending(), None)
            assert handle.worker is not None
            return Handover([], int(handle.worker.env_steps))

        return self._call(handle, "handover", handover)

    def start_evaluator(self, spec: ImpalaJobSpec, actor_id: str, seed: int) -> LocalActor:
        actor = LocalActor("evaluation", actor_id)
        try:
            actor.evaluator = Evaluator(spec, seed)
        except Exception as exc:
            actor.error = ActorDied(f"{actor_id}: {exc}", init_failed=True)
        self.evaluators.append(actor)
        return actor

    def evaluate(self, handle: LocalActor, weights: Any, share: int, video: bool) -> LocalRef:
        evaluator = handle.evaluator

        def evaluate() -> Any:
            assert evaluator is not None
            return evaluator.run(self._resolve(weights), share, video)

        return self._call(handle, "evaluate", evaluate)

    # -- results --------------------------------------------------------------------------------

    def start_learner(
        self, policies: dict[str, LearnerPolicy], seed: int, rank: int, intra_op_threads: int
    ) -> LocalActor:
        worker = LearnerWorker(policies, seed, rank, intra_op_threads)
        pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix=f"learner-{rank}")
        actor = LocalActor("learner", f"learner-{rank}", learner=worker, pool=pool)
        self.learners.append(actor)
        return actor

    def learner_call(self, handle: LocalActor, method: LearnerMethod, *args: Any) -> LocalRef:
        handle.calls.append(method)
        if handle.error is not None:
            return LocalRef(error=handle.error)
        assert handle.learner is not None and handle.pool is not None
        if method == "address":
            args = ("127.0.0.1",)
        elif method == "join":  # the group meets in a store of this process, not over TCP
            rendezvous = args[0]
            store = self._stores.setdefault(rendezvous.port, _hash_store())
            args = (rendezvous, "127.0.0.1", store)
        return LocalRef(future=handle.pool.submit(getattr(handle.learner, method), *args))

    def wait(
        self, refs: list[LocalRef], num_returns: int, timeout: float
    ) -> tuple[list[LocalRef], list[LocalRef]]:
        # As ray.wait: until `num_returns` are done or the timeout passes.
        deadline = time.monotonic() + timeout
        while True:
            pending = [r.future for r in refs if r.future is not None and not r.future.done()]
            left = deadline - time.monotonic()
            if len(refs) - len(pending) >= num_returns or not pending or left <= 0:
                break
            concurrent.futures.wait(pending, left, concurrent.futures.FIRST_COMPLETED)
        ready = [r for r in refs if r.done()][:num_returns]
        return ready, [r for r in refs if r not in ready]

    def get(self, ref: LocalRef) -> Any:
        if ref.future is not None:
            return ref.future.result()
        if ref.error is not None:
            raise ref.error
        return ref.value

    def get_many(self, refs: list[LocalRef]) -> list[Any]:
        return [self.get(ref) for ref in refs]

    def put(self, value: Any) -> LocalRef:
        self.puts += 1
        return LocalRef(value)

    def _resolve(self, value: Any) -> Any:
        return self.get(value) if isinstance(value, LocalRef) else value

    # -- the cluster ----------------------------------------------------------------------------

    def units(self) -> dict[Role, int]:
        return dict(self.capacity)

    def nodes(self) -> list[NodeView]:
        units = {role: self.capacity[role] for role in ROLES}
        return [NodeView(NODE_ID, alive=True, draining=self.draining, units=units)]

    def placed_on(self, handle: LocalActor) -> str:
        return NODE_ID

    def init_failed(self, error: BaseException) -> bool:
        return bool(getattr(error, "actor_init_failed", False))


def _hash_store() -> Any:
    import torch.distributed as dist

    return dist.HashStore()  # type: ignore[attr-defined]  # exported, but not in __all__
