"""The driver's view of where its actors run: a small Ray-like interface.

The driver, its actor manager and membership make every cross-process call through a `Backend`:
`ray_backend.RayBackend` on a Ray cluster (what `impalajob train` and the learner pod use), and
`local_backend.LocalBackend`, which runs the same rollout workers and aggregators in the driver's
own process and completes each call at once, so the driver's bookkeeping is tested without Ray
(as Sample Factory's serial runner wires its components in one process).

Results are opaque references (`Ref`): `wait` says which are ready without blocking longer than
its timeout, `get` takes the value or raises `backend.failure` when the actor died.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

from impala_api.spec import ImpalaJobSpec

if TYPE_CHECKING:  # torch, which the driver's backends import only once a learner is made
    from impala_trainer.learning.learner import LearnerPolicy

Role = Literal["rollout", "aggregator"]
ROLES: tuple[Role, ...] = ("rollout", "aggregator")
LearnerMethod = Literal[
    "address", "join", "load_state_dict", "change", "start", "train", "progress", "weights",
    "state_dict", "stop",
]
"""The calls a learner of a group answers (`learners.worker.LearnerWorker`'s methods)."""

Ref: TypeAlias = Any
"""A result that may not be ready yet (a Ray ObjectRef; a LocalRef in process). Hashable."""
Handle: TypeAlias = Any
"""An actor (a Ray ActorHandle; a LocalActor in process)."""
Weights: TypeAlias = Any
"""Model weights as sent to actors: a dict of arrays, its pickle (`Learner.pickled_weights`, the
form small weights ride inline in), or a Ref to a dict (`Backend.put`)."""


@dataclass(frozen=True)
class NodeView:
    """What membership needs to know about one node of the cluster."""

    node_id: str
    alive: bool
    draining: bool
    units: dict[Role, int]
    """Units of the rollout/aggregator resource the node offers (0 for the head)."""


class Backend(Protocol):
    failure: type[BaseException]
    """What `get` raises for a call whose actor died (or whose node went away)."""

    # -- actors ---------------------------------------------------------------------------------
    def start(self, role: Role, spec: ImpalaJobSpec, actor_id: str, seed: int) -> Handle:
        """Create an actor of `role` (placed on a unit of the role's resource); never blocks."""
        ...

    def kill(self, handle: Handle) -> None: ...

    def node_info(self, handle: Handle) -> Ref:
        """-> NodeInfo, once the actor is built."""
        ...

    def sample(self, handle: Handle, weights: Weights | None, version: int) -> tuple[Ref, Ref]:
        """-> (Fragment, FragmentMeta) as two objects, so the fragment can go by reference to an
        aggregator actor unread; loads `weights` first when given."""
        ...

    def sample_whole(
        self, handle: Handle, weights: Weights | None, version: int, direct: bool = False
    ) -> Ref:
        """-> (Fragment, FragmentMeta) as one object: a sample whose fragment the driver reads
        itself (no aggregator actor), for one return's cost instead of two. `direct`: the
        request and its reply may go over a connection of their own to the actor rather than
        as a Ray call (small weights and fragments: `rollouts/channel.py`)."""
        ...

    def aggregate(self, handle: Handle, fragment: Ref) -> Ref:
        """-> list[TrainBatch]: an aggregator takes one fragment (passed by reference)."""
        ...

    def compute_gradients(
        self, handle: Handle, weights: Weights | None, version: int, global_timestep: int
    ) -> Ref:
        """-> Gradients (A3C mode)."""
        ...

    def handover(self, handle: Handle) -> Ref:
        """-> Handover: what a draining actor still holds, after its last request."""
        ...

    def start_evaluator(self, spec: ImpalaJobSpec, actor_id: str, seed: int) -> Handle:
        """Create an evaluation actor on the driver's own node; never blocks."""
        ...

    def evaluate(self, handle: Handle, weights: Weights, share: int, video: bool) -> Ref:
        """-> (EvaluationResult, video bytes or None): `share` episodes (or env steps)."""
        ...

    def start_learner(
        self, policies: dict[str, LearnerPolicy], seed: int, rank: int, intra_op_threads: int
    ) -> Handle:
        """Create learner `rank` of a group (learner.replicas > 1), holding the trained
        `policies`, on a unit of the learner resource, rank 0 on the driver's own node. Never
        blocks."""
        ...

    def learner_call(self, handle: Handle, method: LearnerMethod, *args: Any) -> Ref:
        """-> what the learner's `method` returns."""
        ...

    # -- results --------------------------------------------------------------------------------
    def wait(
        self, refs: list[Ref], num_returns: int, timeout: float
    ) -> tuple[list[Ref], list[Ref]]:
        """(ready, not ready): at most `num_returns` ready ones, after at most `timeout` s."""
        ...

    def get(self, ref: Ref) -> Any: ...

    def get_many(self, refs: list[Ref]) -> list[Any]:
        """The values of several refs in one call (raises as `get` for any that failed)."""
        ...

    def put(self, value: Any) -> Ref:
        """Store a value once for many calls (the weights of a broadcast)."""
        ...

    # -- the cluster ----------------------------------------------------------------------------
    def units(self) -> dict[Role, int]:
        """Units of each role's resource the cluster offers in total."""
        ...

    def nodes(self) -> list[NodeView]: ...

    def placed_on(self, handle: Handle) -> str:
        """Node an actor was placed on before it can answer ("" while it waits for one)."""
        ...

    def init_failed(self, error: BaseException) -> bool:
        """Whether `error` says the actor's constructor raised (a broken configuration)."""
        ...
