"""Evaluation during training (spec.evaluation), as the driver runs it: when a round is due, how
its duration is shared over the runners, how their results merge, which round is the best.

Pure (no backend calls, no files), so the schedule and the bookkeeping are unit-tested; the
driver makes the calls (`Driver._evaluate`). One round at a time: a round's weights are the
learner's when it starts, its result lands in the history at the env step of those weights, and
its actors never send anything to the learner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from impala_api.snapshot import EvaluationInfo
from impala_api.spec import EvaluationSpec
from impala_trainer.policy.episodes import EvaluationResult

MAX_FAILED_ROUNDS = 3
"""Rounds in a row whose actors fail before the run fails (a broken env or model)."""
RUNNER_SEED_STRIDE = 10_007
"""Runner i plays env seeds from run seed + (i + 1) * this: never the rollout workers' seeds."""


@dataclass
class Round:
    """One evaluation in flight."""

    env_steps: int
    policy_version: int
    weights: dict[str, np.ndarray]
    refs: list[Any]
    started: float = field(default_factory=time.monotonic)


def shares(spec: EvaluationSpec) -> list[int]:
    """`duration` split over the runners (no runner gets nothing)."""
    n = min(spec.num_env_runners, spec.duration)
    return [spec.duration // n + (i < spec.duration % n) for i in range(n)]


def runner_seed(run_seed: int, index: int) -> int:
    return run_seed + (index + 1) * RUNNER_SEED_STRIDE


def merge(results: list[EvaluationResult]) -> EvaluationResult:
    out = EvaluationResult()
    for r in results:
        out.returns.extend(r.returns)
        out.lengths.extend(r.lengths)
        out.env_steps += r.env_steps
        for name, returns in r.policy_returns.items():
            out.policy_returns.setdefault(name, []).extend(returns)
        out.scored = out.scored or r.scored
        out.wins += r.wins
        out.draws += r.draws
        out.losses += r.losses
    return out


class EvaluationSchedule:
    """When the next round starts, and what the rounds so far add up to."""

    def __init__(self, spec: EvaluationSpec, last: EvaluationInfo | None) -> None:
        self.spec = spec
        self.last = last
        """The latest finished round (restored from the checkpoint when resuming)."""
        after = last.num_env_steps_sampled if last else 0
        self.next_at = after + spec.interval_timesteps
        self.failures = 0

    def due(self, env_steps: int) -> bool:
        return env_steps >= self.next_at

    def started(self, env_steps: int) -> None:
        # Measured from the round's own start: a slow round delays the next, never stacks them.
        self.next_at = env_steps + self.spec.interval_timesteps

    def failed(self) -> bool:
        """Count a failed round; True when the run should fail for it."""
        self.failures += 1
        return self.failures >= MAX_FAILED_ROUNDS

    def finished(
        self, rnd: Round, result: EvaluationResult, video: str | None
    ) -> tuple[EvaluationInfo, bool]:
        """The round's EvaluationInfo, and whether it is the best so far (its weights are kept
        as the best checkpoint, whose path the caller sets)."""
        self.failures = 0
        summary = result.summary()
        mean = summary["episode_return_mean"]
        prev = self.last or EvaluationInfo()
        best = mean is not None and (prev.best_return_mean is None or mean > prev.best_return_mean)
        info = EvaluationInfo(
            evaluations=prev.evaluations + 1,
            num_env_steps_sampled=rnd.env_steps,
            policy_version=rnd.policy_version,
            episodes=summary["episodes"],
            episode_return_mean=mean,
            episode_return_std=summary["episode_return_std"],
            episode_return_median=summary["episode_return_median"],
            episode_return_min=summary["episode_return_min"],
            episode_return_max=summary["episode_return_max"],
            episode_len_mean=summary["episode_len_mean"],
            env_steps=result.env_steps,
            seconds=time.monotonic() - rnd.started,
            time=time.time(),
            video=video,
            policy_return_means=summary["policy_return_means"],
            opponent=self.spec.opponent if result.scored else None,
            policy=result.scored,
            wins=result.wins,
            draws=result.draws,
            losses=result.losses,
            win_rate=summary["win_rate"],
            best_return_mean=mean if best else prev.best_return_mean,
            best_num_env_steps_sampled=rnd.env_steps if best else prev.best_num_env_steps_sampled,
            best_checkpoint=prev.best_checkpoint,
        )
        self.last = info
        return info, best
