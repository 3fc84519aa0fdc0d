"""`Backend` on Ray: actors placed by custom resource, results as object refs."""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from impala_api.roles import SAMPLE_PORT_ENV
from impala_api.spec import ImpalaJobSpec
from impala_trainer.backend import (
    ROLES,
    Handle,
    LearnerMethod,
    NodeView,
    Ref,
    Role,
    Weights,
)
from impala_trainer.driver.channels import ChannelRef, SampleChannels, wait_mixed
from impala_trainer.learners.actor import LEARNER_RESOURCE, LearnerActor
from impala_trainer.learning.learner import LearnerPolicy
from impala_trainer.node.ray_node import pinned_port
from impala_trainer.policy.actor import EvaluationActor
from impala_trainer.rollouts.actor import (
    AGGREGATOR_RESOURCE,
    ROLLOUT_RESOURCE,
    AggregatorActor,
    RolloutActor,
)

logger = logging.getLogger(__name__)

RESOURCE: dict[Role, str] = {"rollout": ROLLOUT_RESOURCE, "aggregator": AGGREGATOR_RESOURCE}


class RayBackend:
    """The driver's calls as Ray calls, on the Ray this process is connected to."""

    failure = ray.exceptions.RayError

    def __init__(self) -> None:
        self._channels: SampleChannels | None = None
        """Direct sample connections (`sample_whole(direct=True)`), made on first use."""
        self._warned_unreachable = False

    def _release(self, handle: Handle) -> None:
        """Before any Ray call on an actor: end its serve loop (a call would queue behind it)."""
        if self._channels is not None:
            self._channels.release(handle)

    def start(self, role: Role, spec: ImpalaJobSpec, actor_id: str, seed: int) -> Handle:
        cls: Any = RolloutActor if role == "rollout" else AggregatorActor
        # num_cpus=0: one actor per unit of the role's resource is the only placement rule.
        return cls.options(num_cpus=0, resources={RESOURCE[role]: 1}, max_restarts=0).remote(
            spec, actor_id, seed
        )

    def kill(self, handle: Handle) -> None:
        if self._channels is not None:
            self._channels.kill(handle)
        ray.kill(handle, no_restart=True)

    def node_info(self, handle: Handle) -> Ref:
        self._release(handle)
        return handle.node_info.remote()

    def sample(self, handle: Handle, weights: Weights | None, version: int) -> tuple[Ref, Ref]:
        self._release(handle)
        if weights is None:
            refs: tuple[Ref, Ref] = handle.sample.remote()
        else:
            refs = handle.sample.remote(weights, version)
        return refs

    def sample_whole(
        self, handle: Handle, weights: Weights | None, version: int, direct: bool = False
    ) -> Ref:
        if direct and (weights is None or isinstance(weights, bytes)):
            if self._channels is None:
                port = pinned_port(SAMPLE_PORT_ENV)
                self._channels = SampleChannels(ray.util.get_node_ip_address(), port)
            if self._channels.unreachable is None:
                return self._channels.sample(handle, weights, version)
            if not self._warned_unreachable:
                self._warned_unreachable = True
                logger.warning(
                    "rollout actors cannot reach the driver's direct sample port, so samples go "
                    "as Ray calls (to skip this, set spec.rollouts.transport: ray): %s",
                    self._channels.unreachable,
                )
        self._release(handle)
        # The same actor method with one return: its (fragment, meta) tuple is one object. Each
        # return is an object the actor stores and the driver tracks, waits on and fetches; in
        # a loop of 128-step CartPole fragments one return took 12-17% less driver CPU per
        # fragment than two (280-295 against 310-341 us, measured with 2 actors, Ray 2.60).
        method = handle.sample.options(num_returns=1)
        ref: Ref = method.remote() if weights is None else method.remote(weights, version)
        return ref

    def aggregate(self, handle: Handle, fragment: Ref) -> Ref:
        return handle.process.remote(fragment)

    def compute_gradients(
        self, handle: Handle, weights: Weights | None, version: int, global_timestep: int
    ) -> Ref:
        self._release(handle)
        return handle.compute_gradients.remote(weights, version, global_timestep)

    def handover(self, handle: Handle) -> Ref:
        self._release(handle)
        return handle.handover.remote()

    def start_evaluator(self, spec: ImpalaJobSpec, actor_id: str, seed: int) -> Handle:
        # On the driver's node, which is the learner pod on a cluster: the weights are there,
        # and no pod of its own has to be scheduled, authorised and joined for a few episodes.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        cls: Any = EvaluationActor
        return cls.options(num_cpus=0, scheduling_strategy=here, max_restarts=0).remote(
            spec, actor_id, seed
        )

    def evaluate(self, handle: Handle, weights: Weights, share: int, video: bool) -> Ref:
        return handle.evaluate.remote(weights, share, video)

    def start_learner(
        self, policies: dict[str, LearnerPolicy], seed: int, rank: int, intra_op_threads: int
    ) -> Handle:
        # Placed by its unit of `learner`, as the rollouts by theirs: no CPU is asked of the node.
        options: dict[str, Any] = {"num_cpus": 0, "resources": {LEARNER_RESOURCE: 1}}
        if rank == 0:  # beside the driver: the weights it broadcasts are read there
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False
            )
        gpus = next(iter(policies.values())).config.learner.gpus  # the job's, every policy's
        if gpus:
            options["num_gpus"] = gpus
        cls: Any = LearnerActor
        return cls.options(**options).remote(policies, seed, rank, intra_op_threads)

    def learner_call(self, handle: Handle, method: LearnerMethod, *args: Any) -> Ref:
        return getattr(handle, method).remote(*args)

    def wait(
        self, refs: list[Ref], num_returns: int, timeout: float
    ) -> tuple[list[Ref], list[Ref]]:
        if self._channels is not None and any(isinstance(r, ChannelRef) for r in refs):
            return wait_mixed(self._channels, refs, num_returns, timeout)
        ready, rest = ray.wait(refs, num_returns=num_returns, timeout=timeout)
        return ready, rest

    def get(self, ref: Ref) -> Any:
        if isinstance(ref, ChannelRef):
            assert self._channels is not None
            return self._channels.result(ref)
        return ray.get(ref)

    def get_many(self, refs: list[Ref]) -> list[Any]:
        if any(isinstance(r, ChannelRef) for r in refs):
            return [self.get(r) for r in refs]
        values: list[Any] = ray.get(refs)
        return values

    def put(self, value: Any) -> Ref:
        return ray.put(value)

    def units(self) -> dict[Role, int]:
        total = ray.cluster_resources()
        return {role: int(total.get(RESOURCE[role], 0)) for role in ROLES}

    def nodes(self) -> list[NodeView]:
        """The GCS's view of the nodes (one node-table read plus the drain list)."""
        try:
            draining = set(ray._private.state.state.get_draining_nodes())
        except Exception:  # an older GCS without drain info: nodes only leave by dying then
            draining = set()
        out = []
        for n in ray.nodes():
            resources = n.get("Resources", {})
            out.append(
                NodeView(
                    node_id=n["NodeID"],
                    alive=bool(n.get("Alive")),
                    draining=n["NodeID"] in draining,
                    units={r: int(resources.get(RESOURCE[r], 0)) for r in ROLES},
                )
            )
        return out

    def placed_on(self, handle: Handle) -> str:
        # The actor's constructor may still be running (torch import, env construction): the
        # GCS actor table knows the node before the actor can say so itself.
        try:
            info = ray._private.state.actors(actor_id=handle._actor_id.hex())
        except Exception:
            return ""
        node_id = str(info.get("Address", {}).get("NodeID", "")) if info else ""
        return "" if node_id.strip("f0") == "" else node_id

    def init_failed(self, error: BaseException) -> bool:
        return bool(getattr(error, "actor_init_failed", False))
