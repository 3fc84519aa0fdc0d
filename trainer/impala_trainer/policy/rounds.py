"""What an evaluation actor runs each round of spec.evaluation, for the job's kind of env: whole
episodes of a single-agent env (`episodes.EpisodeEvaluator`) or whole games of a PettingZoo env
(`games.GameEvaluator`), both returning an `episodes.EvaluationResult`. Above both, so that
neither imports the other."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from impala_api.spec import ImpalaJobSpec
from impala_trainer.policy.episodes import EpisodeEvaluator, EvaluationResult
from impala_trainer.policy.games import GameEvaluator


class RoundPlayer(Protocol):
    """One evaluation round: play `share` episodes or games (or env steps, durationUnit) with
    `weights`; the result and, when asked, its first episode's video (suffix, bytes)."""

    def run(
        self, weights: dict[str, np.ndarray], share: int, video: bool
    ) -> tuple[EvaluationResult, tuple[str, bytes] | None]: ...


def make_evaluator(spec: ImpalaJobSpec, seed: int) -> RoundPlayer:
    """The evaluation actor's work for this job's kind of env."""
    if spec.env.multi_agent:
        return GameEvaluator(spec, seed)
    return EpisodeEvaluator(spec, seed)
