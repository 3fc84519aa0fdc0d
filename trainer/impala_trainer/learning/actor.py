"""The learner actor: a thin Ray shell around the plain `learner_worker.LearnerWorker` (tested
without Ray through `driver.local_backend`), as `rollouts.actors` wraps the rollout worker.

Placed by the `learner` custom resource (a learner pod offers one unit; `impalajob train` offers
learner.replicas), learner 0 on the driver's own node (`RayBackend.start_learner`). Threaded
(`max_concurrency`): the driver's long poll for progress runs beside the calls that feed it
batches. Ray does not restart it: a learner lost is the group's failure (its peers wait on it in
their next all-reduce), which the run reports and the operator restarts from a checkpoint.
"""

from __future__ import annotations

import ray

from impala_api.spec import ImpalaJobSpec
from impala_trainer.batches import TrainBatch
from impala_trainer.learning.collective import Rendezvous
from impala_trainer.learning.distributions import ActionDistribution
from impala_trainer.learning.learner_worker import LearnerInfo, LearnerProgress, LearnerWorker

LEARNER_RESOURCE = "learner"


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=4)
class LearnerActor:
    """A LearnerWorker in its own process."""

    def __init__(
        self,
        spec: ImpalaJobSpec,
        obs_shape: tuple[int, ...],
        actions: ActionDistribution | int,
        seed: int,
        rank: int,
        intra_op_threads: int,
    ) -> None:
        self.worker = LearnerWorker(spec, obs_shape, actions, seed, rank, intra_op_threads)

    def address(self) -> Rendezvous:
        return self.worker.address(ray.util.get_node_ip_address())

    def join(self, rendezvous: Rendezvous) -> LearnerInfo:
        return self.worker.join(rendezvous, ray.util.get_node_ip_address())

    def load_state_dict(self, state: bytes) -> int:
        return self.worker.load_state_dict(state)

    def start(self, global_timestep: int) -> None:
        self.worker.start(global_timestep)

    def train(self, batch: TrainBatch) -> None:
        self.worker.train(batch)

    def progress(self, wait_seconds: float) -> LearnerProgress:
        return self.worker.progress(wait_seconds)

    def weights(self) -> bytes:
        return self.worker.weights()

    def state_dict(self) -> bytes:
        return self.worker.state_dict()

    def stop(self) -> None:
        self.worker.stop()
