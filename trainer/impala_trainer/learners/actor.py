"""The learner actor: a thin Ray shell around the plain `learner_worker.LearnerWorker` (tested
without Ray through `driver.local_backend`), as `rollouts.actor` wraps the rollout worker.

Placed by the `learner` custom resource (a learner pod offers one unit; `impalajob train` offers
learner.replicas), learner 0 on the driver's own node (`RayBackend.start_learner`). Threaded
(`max_concurrency`): the driver's long poll for progress runs beside the calls that feed it
batches. Ray does not restart it: a learner lost is the group's failure (its peers wait on it in
their next all-reduce), which the run reports and the operator restarts from a checkpoint.
"""

from __future__ import annotations

import ray

from impala_trainer.batches import TrainBatch
from impala_trainer.learners.worker import LearnerInfo, LearnerProgress, LearnerWorker
from impala_trainer.learning.collective import Rendezvous
from impala_trainer.learning.learner import LearnerPolicy

LEARNER_RESOURCE = "learner"


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=4)
class LearnerActor:
    """A LearnerWorker in its own process."""

    def __init__(
        self, policies: dict[str, LearnerPolicy], seed: int, rank: int, intra_op_threads: int
    ) -> None:
        self.worker = LearnerWorker(policies, seed, rank, intra_op_threads)

    def address(self) -> Rendezvous:
        return self.worker.address(ray.util.get_node_ip_address())

    def join(self, rendezvous: Rendezvous) -> dict[str, LearnerInfo]:
        return self.worker.join(rendezvous, ray.util.get_node_ip_address())

    def load_state_dict(self, policy: str, state: bytes) -> int:
        return self.worker.load_state_dict(policy, state)

    def change(self, policy: str, change: bytes) -> int:
        return self.worker.change(policy, change)

    def start(self, global_timesteps: dict[str, int]) -> None:
        self.worker.start(global_timesteps)

    def train(self, batch: TrainBatch) -> None:
        self.worker.train(batch)

    def progress(self, wait_seconds: float) -> LearnerProgress:
        return self.worker.progress(wait_seconds)

    def weights(self, policy: str) -> bytes:
        return self.worker.weights(policy)

    def state_dict(self, policy: str) -> bytes:
        return self.worker.state_dict(policy)

    def stop(self) -> None:
        self.worker.stop()
