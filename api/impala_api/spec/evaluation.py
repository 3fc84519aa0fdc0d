"""`spec.evaluation`: the policy played on envs of its own while it trains (RLlib's evaluation_*
settings), whose return a stop criterion may use and which picks the best checkpoint."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from impala_api.spec.base import POLICY_NAME_PATTERN, SpecModel

RANDOM_OPPONENT = "random"
"""spec.evaluation.opponent: a uniform choice among the actions each observation allows."""

EVALUATION_STOP_NEEDS_EVALUATION = (
    "spec.stop.evaluationReturnMean needs spec.evaluation (the evaluation that measures it): "
    "add spec.evaluation, e.g. {intervalTimesteps: 50000}"
)


class EvaluationSpec(SpecModel):
    """Evaluation during training: separate actors play the current weights (greedy unless
    `explore`) on their own env seeds, never feeding the learner. They run in the learner's own
    pod (locally: on the machine), next to the weights (docs/architecture.md)."""

    interval_timesteps: int = Field(default=50_000, ge=1)
    """Env steps sampled between evaluations (RLlib's evaluation_interval counts training
    iterations, which last as long as the machine makes them; env steps put the evaluations at
    the same points of training on any machine). One runs at a time: an interval that ends
    while one is still playing starts the next as soon as it finishes."""

    duration: int = Field(default=10, ge=1, le=1_000_000)
    """Episodes (or env steps, durationUnit) per evaluation, shared out over the runners."""

    duration_unit: Literal["episodes", "timesteps"] = "episodes"
    """What `duration` counts; with timesteps, only episodes that end within them are counted."""

    num_env_runners: int = Field(default=1, ge=1, le=64)
    """Evaluation actors (RLlib's evaluation_num_env_runners)."""

    num_envs_per_runner: int = Field(default=4, ge=1, le=256)
    """Envs each evaluation actor plays side by side."""

    explore: bool = False
    """Sample actions as training does instead of taking the greedy one."""

    video: bool = False
    """Record each evaluation's first episode (mp4) into the run directory's videos/, shown on
    the dashboard and in TensorBoard; a PettingZoo env's first game, from the env's
    `render_mode="rgb_array"`."""

    opponent: str | None = Field(default=None, pattern=POLICY_NAME_PATTERN, max_length=32)
    """A PettingZoo env's games scored against a fixed opponent: `random` (a uniform choice
    among the allowed actions) or a policy of spec.multiAgent.policies. `policy` then takes
    each of its agents' seats in turn, every other agent acts by the opponent, and a round
    reports wins, draws and losses (a win: more reward than every other agent) with the
    policy's own return as the round's return. Omitted: every agent acts by its own policy and
    the return is the team's (all agents' rewards), as training reports it."""

    policy: str | None = Field(default=None, pattern=POLICY_NAME_PATTERN, max_length=32)
    """The policy whose games `opponent` scores: default spec.multiAgent.selfPlay's policy,
    else the first policy that learns."""
