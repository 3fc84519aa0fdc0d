"""The evaluation actor: a thin Ray shell around `rounds.Evaluator` (tested without Ray, and
with the driver through `driver.local_backend`), as `rollouts.actor` wraps the rollout worker.
The driver places it on its own node (`ray_backend.start_evaluator`)."""

from __future__ import annotations

from typing import Any

import ray

from impala_api.spec import ImpalaJobSpec
from impala_trainer.policy.episodes import EvaluationResult
from impala_trainer.policy.rounds import Evaluator


@ray.remote(num_cpus=0, max_restarts=0)
class EvaluationActor:
    """An Evaluator in its own process."""

    def __init__(self, spec: ImpalaJobSpec, actor_id: str, seed: int) -> None:
        self.evaluator = Evaluator(spec, seed)

    def evaluate(
        self, weights: dict[str, Any], share: int, video: bool
    ) -> tuple[EvaluationResult, tuple[str, bytes] | None]:
        return self.evaluator.run(weights, share, video)
