"""Thin Ray actors around the plain RolloutWorker and Aggregator.

They hold no logic of their own, so every behaviour is tested on the plain classes (and, through
`driver.local_backend`, with the driver). Placement is by Ray custom resource: `{"rollout": 1}` /
`{"aggregator": 1}` with `num_cpus=0`, so an actor lands on whatever node (rollout pod, or the
local machine) offers the resource, and one actor takes one unit. Ray does not restart them
(`max_restarts=0`): the driver's ActorManager replaces a dead actor itself, because a replacement
needs fresh weights and a new seed anyway.
"""

from __future__ import annotations

from typing import Any

import ray

from impala_api.spec import ImpalaJobSpec
from impala_trainer.batches import (
    FragmentMeta,
    Gradients,
    Handover,
    NodeInfo,
    Sample,
    TrainBatch,
)
from impala_trainer.rollouts import channel
from impala_trainer.rollouts.aggregation import Aggregator
from impala_trainer.rollouts.worker import RolloutWorker

ROLLOUT_RESOURCE = "rollout"
AGGREGATOR_RESOURCE = "aggregator"


def _node_info() -> NodeInfo:
    return NodeInfo(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address())


@ray.remote(num_cpus=0, max_restarts=0)
class RolloutActor:
    """A RolloutWorker in its own process."""

    def __init__(self, spec: ImpalaJobSpec, worker_id: str, seed: int) -> None:
        self.worker = RolloutWorker(spec, worker_id, seed)

    def node_info(self) -> NodeInfo:
        return _node_info()

    @ray.method(num_returns=2)  # type: ignore[untyped-decorator]  # ray is untyped here
    def sample(
        self, weights: dict[str, Any] | bytes | None = None, policy_version: int = 0
    ) -> tuple[Sample, FragmentMeta]:
        """(fragment, its metadata), sampled after loading `weights` when given (the driver
        sends a broadcast with the next request instead of in a call of its own).

        The driver reads the metadata without pulling the fragment, which can go by reference
        straight to an aggregator actor; a job without aggregator actors asks for the pair as
        one object instead (`num_returns=1`, `RayBackend.sample_whole`)."""
        return self._sample(weights, policy_version)

    def serve(self, address: tuple[str, int], token: bytes) -> int:
        """Answer sample requests on a direct connection to the driver until it says stop
        (`rollouts/channel.py`); other calls on this actor wait until then."""
        return channel.serve(address, token, self._sample)

    def _sample(
        self, weights: dict[str, Any] | bytes | None, policy_version: int
    ) -> tuple[Sample, FragmentMeta]:
        if weights is not None:
            self.worker.set_weights(weights, policy_version)
        fragment = self.worker.sample()
        return fragment, fragment.meta()

    def compute_gradients(
        self, weights: dict[str, Any] | None, policy_version: int, global_timestep: int
    ) -> Gradients:
        """A3C: optionally load weights, then sample and return gradients on the sample."""
        if weights is not None:
            self.worker.set_weights(weights, policy_version)
        return self.worker.compute_gradients(global_timestep)

    def handover(self) -> Handover:
        """Its own env-step count: the driver's count for it must match, else a fragment was
        lost in the drain."""
        return Handover(fragments=[], env_steps=int(self.worker.env_steps))


@ray.remote(num_cpus=0, max_restarts=0)
class AggregatorActor:
    """An Aggregator in its own process: fragments by reference in, train batches out."""

    def __init__(self, spec: ImpalaJobSpec, actor_id: str, seed: int) -> None:
        self.actor_id = actor_id
        self.aggregator = Aggregator.from_spec(spec, seed)

    def node_info(self) -> NodeInfo:
        return _node_info()

    def process(self, fragment: Sample) -> list[TrainBatch]:
        """Add one fragment (Ray resolves the reference); return completed train batches."""
        return self.aggregator.add(fragment)

    def handover(self) -> Handover:
        """The fragments that did not yet fill a batch: the driver trains on them."""
        return Handover(fragments=self.aggregator.take_pending(), env_steps=None)
