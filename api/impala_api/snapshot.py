"""The run directory's files, typed: what the learner writes and the status sidecar reads.

A run directory holds `config.yaml`, `status.json` (latest snapshot, replaced atomically),
`history.jsonl` (one `HistoryPoint` per line), `summary.json` (at the end) and `checkpoints/`.
The sidecar never talks to the trainer process: these models are the whole contract, so they stay
free of torch/ray imports.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

STATUS_FILE = "status.json"
HISTORY_FILE = "history.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.yaml"
CHECKPOINT_DIR = "checkpoints"
BEST_CHECKPOINT = "best"
"""checkpoints/best/: the weights of the best evaluation so far (never rotated away)."""
VIDEO_DIR = "videos"
"""Evaluation videos (spec.evaluation.video), `eval-<env steps>.mp4`."""

RunPhase = Literal["Starting", "Running", "Succeeded", "Failed", "Stopped"]
TrendSource = Literal["training", "evaluation"]
"""Which return a run's trend follows (`ReturnTrend.source`)."""


class Snap(BaseModel):
    model_config = ConfigDict(extra="ignore")


def _was(old: str, new: str) -> Any:
    """A field that also reads its name before RLlib's was adopted (older checkpoints)."""
    return Field(default=0, validation_alias=AliasChoices(new, old))


class Counters(Snap):
    """The run's counters, under RLlib's result names where RLlib has one."""

    num_env_steps_sampled: int = _was("env_steps_sampled", "num_env_steps_sampled")
    """Env steps returned by rollout workers."""
    num_env_steps_trained: int = _was("env_steps_trained", "num_env_steps_trained")
    """Env steps the learner has trained on (once per batch, not per SGD pass)."""
    episodes: int = 0
    """Completed episodes."""
    learner_updates: int = 0
    """Optimiser steps taken."""
    num_weight_broadcasts: int = _was("weight_broadcasts", "num_weight_broadcasts")
    """Times the weights were put in the object store for the workers."""
    num_times_learner_queue_full: int = _was("learner_queue_full", "num_times_learner_queue_full")
    """Times a train batch found the learner queue full (RLlib's num_times_learner_queue_full)."""
    policy_version: int = 0
    """Version of the learner's weights (incremented per update)."""
    replayed_batches: int = 0
    """Train batches served from the mixin replay buffer."""
    worker_restarts: int = 0
    """Rollout/aggregator actors replaced after a failure."""


class Throughput(Snap):
    env_steps_per_s: float = 0.0
    """Env steps sampled per second over the recent window."""
    trained_steps_per_s: float = 0.0
    """Env steps trained per second over the recent window."""
    learner_updates_per_s: float = 0.0
    """Optimiser steps per second over the recent window."""
    rollout_busy_fraction: float = 0.0
    """Fraction of the rollout actors' recent wall time spent on sample requests (loading
    weights, stepping envs, acting), in [0, 1]; the rest they waited for their next request,
    the round trip through Ray and the driver. Low with short fragments and one request in
    flight per worker (the CartPole example: ~0.27); `maxRequestsInFlightPerWorker: 2` or longer
    fragments raise it, at more policy lag."""


class LearnerQueue(Snap):
    """RLlib's learner_queue stats (size_count/mean/std/quantiles of the queue size after each of
    the last updates), with the capacity, the fill and the learner's idle share."""

    capacity: int = 0
    """learnerQueueSize."""
    size_count: int = 0
    """Updates the size statistics cover."""
    size_mean: float = 0.0
    """Mean queue size over the recent window."""
    size_std: float = 0.0
    """Standard deviation of the queue size over the window."""
    size_quantiles: list[float] = Field(default_factory=list)
    """The 0/10/50/90/100th percentiles of the queue size over the window (RLlib's)."""
    fill: float = 0.0
    """size_mean / capacity, in [0, 1]: near 0 the learner starves, near 1 it is saturated."""
    learner_idle_fraction: float = 0.0
    """Fraction of recent wall time the learner thread waited for data."""


class Member(Snap):
    actor_id: str
    """Stable id of the actor."""
    role: Literal["rollout", "aggregator"]
    """Which kind of actor."""
    node_id: str = ""
    """Ray node the actor lives on (one per pod on a cluster)."""
    node_ip: str = ""
    """Address of that node."""
    state: Literal["starting", "healthy", "draining", "dead"] = "healthy"
    """Lifecycle state."""
    env_steps: int = 0
    """Env steps this actor contributed."""
    env_steps_produced: int | None = None
    """Env steps the actor itself reported sampling, read when it was released after its node
    drained: equal to env_steps when every fragment it produced reached the driver."""


class Membership(Snap):
    rollout_workers: int = 0
    """Healthy rollout actors."""
    aggregator_workers: int = 0
    """Healthy aggregator actors."""
    rollout_nodes: int = 0
    """Ray nodes offering the `rollout` resource."""
    aggregator_nodes: int = 0
    """Ray nodes offering the `aggregator` resource."""
    members: list[Member] = Field(default_factory=list)
    """Every actor the driver manages."""


class CheckpointInfo(Snap):
    path: str
    """Checkpoint directory, relative to the run directory."""
    time: float
    """Unix time it was written."""
    num_env_steps_sampled: int = Field(
        validation_alias=AliasChoices("num_env_steps_sampled", "env_steps_sampled")
    )
    """Counter value at that checkpoint."""


class ReturnTrend(Snap):
    """The training return against its own past, so that a learned policy is not lost silently
    (`impala_trainer.rundir.trend`): once a full window of episodes has ended, the first window's
    mean and the best; `regressed` when the mean has given back at least half of what it gained
    from the first to the best, and stayed there for at least a quarter of the env steps the best
    took (and a full window of episodes); a training return whose best rose above the first
    window no more than chance does is never regressed. A job scored against a fixed opponent
    (spec.evaluation.opponent: self-play, whose training return is a zero-sum game's) follows its
    evaluation rounds' return instead."""

    source: TrendSource = "training"
    """Which return it follows: the training episodes' (a window of 100), or the evaluation
    rounds' against spec.evaluation.opponent (each round's games)."""
    first_return_mean: float | None = None
    """The first full window's mean return."""
    best_return_mean: float | None = None
    """The best window mean so far."""
    best_env_steps: int = 0
    """The env-step counter when the best was reached."""
    below_since_env_steps: int | None = None
    """The env-step counter since which the mean has been below the regression threshold (None
    while it is not)."""
    below_since_episodes: int | None = None
    """The episode counter at that point."""
    regressed: bool = False
    message: str | None = None
    """What `regressed` means for this run, in words (the ReturnRegressed condition's)."""


class EvaluationInfo(Snap):
    """The latest evaluation during training (spec.evaluation), and the best one so far."""

    evaluations: int = 0
    """Evaluations completed in this run (and the runs it resumed)."""
    num_env_steps_sampled: int = 0
    """The env-step counter when its weights were taken."""
    policy_version: int = 0
    """The policy version it played."""
    episodes: int = 0
    episode_return_mean: float | None = None
    """Mean return of its episodes (unclipped), None when none ended within its duration."""
    episode_return_std: float | None = None
    """Their standard deviation (the population's)."""
    episode_return_median: float | None = None
    episode_return_min: float | None = None
    episode_return_max: float | None = None
    episode_len_mean: float | None = None
    env_steps: int = 0
    """Env steps it played (never counted as training's)."""
    seconds: float = 0.0
    """How long it took."""
    time: float = 0.0
    """Unix time it finished."""
    video: str | None = None
    """Its video, relative to the run directory (spec.evaluation.video)."""
    policy_return_means: dict[str, float] = Field(default_factory=dict)
    """A PettingZoo env's: each policy's mean return per agent and episode."""
    opponent: str | None = None
    """The fixed opponent its games were scored against (spec.evaluation.opponent); None: every
    agent played by its own policy and the return is the team's."""
    policy: str | None = None
    """The policy whose games were scored (its own return is the round's return)."""
    wins: int = 0
    draws: int = 0
    losses: int = 0
    win_rate: float | None = None
    """Wins per game against the opponent."""
    best_return_mean: float | None = None
    """The best evaluation return so far."""
    best_num_env_steps_sampled: int | None = None
    best_checkpoint: str | None = None
    """checkpoints/best: its weights, relative to the run directory."""


class StopProgress(Snap):
    criteria: dict[str, float] = Field(default_factory=dict)
    """The stop criteria in force (timesteps, episodeReturnMean, timeLimitSeconds)."""
    progress: float = 0.0
    """Progress toward the nearest criterion, in [0, 1]."""
    foreseeable: float | None = None
    """Progress toward the nearer of timesteps and timeLimitSeconds, the criteria whose end can
    be foreseen, in [0, 1]; None when neither is set (a return criterion alone: no one knows
    when a return will be reached)."""
    remaining_seconds: float | None = None
    """Seconds until timesteps (at the recent sampling rate) or timeLimitSeconds is reached,
    whichever comes first: an upper bound when a return criterion may end the run sooner."""
    stopped_by: str | None = None
    """The criterion that ended the run, once it has."""
    policy: str | None = None
    """stop.policy: the policy whose return episodeReturnMean measures (None: the team's)."""


def duration_text(seconds: float) -> str:
    """`kubectl get`'s style for a duration: 45s, 3m20s, 1h05m, 2d3h."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


class PolicyStatus(Snap):
    """One policy of a multi-agent job (spec.multiAgent)."""

    episode_return_mean: float | None = None
    """Mean return of its agents over their last 100 episodes (one per agent and episode)."""
    episodes: int = 0
    """Agent episodes counted (an episode of 3 agents of this policy counts 3)."""
    self_play_score: float | None = None
    """spec.multiAgent.selfPlay's policy: its mean score over its last 100 games against the
    snapshot pool (1 a win, 0.5 a draw, 0 a loss); None before the first."""
    self_play_games: int = 0
    """Games it played against the pool."""


class StatusSnapshot(Snap):
    job: str
    """ImpalaJob name."""
    phase: RunPhase = "Starting"
    """Run phase as the trainer sees it."""
    message: str | None = None
    """Human-readable reason for the phase (errors included)."""
    started_at: float = 0.0
    """Unix time training started."""
    updated_at: float = 0.0
    """Unix time of this snapshot."""
    wall_seconds: float = 0.0
    """Seconds since start (training time, accumulated across resumes)."""
    iteration: int = 0
    """Driver loop iterations that wrote a snapshot."""
    counters: Counters = Field(default_factory=Counters)
    episode_return_mean: float | None = None
    """Mean return of the last 100 episodes."""
    episode_return_min: float | None = None
    episode_return_max: float | None = None
    episode_len_mean: float | None = None
    """Mean length of the last 100 episodes."""
    throughput: Throughput = Field(default_factory=Throughput)
    learner: dict[str, float] = Field(default_factory=dict)
    """Learner stats (policy_loss, vf_loss, entropy, grad_gnorm, cur_lr, ...), each the mean over
    the updates since the previous snapshot, as RLlib's LearnerInfoBuilder averages an
    iteration's; unchanged while no update finished."""
    timing_breakdown: dict[str, float] = Field(default_factory=dict)
    """RLlib's timing_breakdown in ms (learner_dequeue/grad/load/load_wait_time_ms, under the
    same names) plus the driver's own (driver_sample_wait_time_ms, ...)."""
    learner_queue: LearnerQueue = Field(default_factory=LearnerQueue)
    membership: Membership = Field(default_factory=Membership)
    checkpoint: CheckpointInfo | None = None
    """Latest checkpoint written."""
    evaluation: EvaluationInfo | None = None
    """The latest evaluation (spec.evaluation), None before the first."""
    stop: StopProgress = Field(default_factory=StopProgress)
    return_trend: ReturnTrend = Field(default_factory=ReturnTrend)
    """Whether the training return has fallen far below its best, for long."""
    policy_lag_mean: float = 0.0
    """Mean learner-version minus behaviour-version of trained batches (off-policy lag), taken
    at each batch's first update: the time it waited in the learner queue counts."""
    policies: dict[str, PolicyStatus] = Field(default_factory=dict)
    """A multi-agent job's policies by name (empty for a single-agent env); their learner stats
    are `learner`'s keys prefixed `<policy>/`. episode_return_mean is then the team's: each
    episode's rewards summed over all its agents."""

    @property
    def followed_return_mean(self) -> float | None:
        """The return the run is judged by, the one its trend follows (`return_trend.source`):
        the training episodes' mean, or, for a job scored against a fixed opponent (self-play,
        whose zero-sum training return is 0 whatever it learns), its latest evaluation's (None
        before the first)."""
        if self.return_trend.source == "evaluation":
            return self.evaluation.episode_return_mean if self.evaluation else None
        return self.episode_return_mean


class HistoryPoint(Snap):
    time: float
    """Unix time."""
    wall_seconds: float
    env_steps: int
    """num_env_steps_sampled at this point."""
    episodes: int = 0
    learner_updates: int = 0
    episode_return_mean: float | None = None
    env_steps_per_s: float = 0.0
    trained_steps_per_s: float = 0.0
    learner_queue_fill: float = 0.0
    policy_loss: float | None = None
    vf_loss: float | None = None
    entropy: float | None = None
    evaluation_return_mean: float | None = None
    """The latest evaluation's mean return (repeated until the next: a curve takes one point per
    `evaluation_env_steps`)."""
    evaluation_env_steps: int | None = None
    """The env-step counter when that evaluation's weights were taken."""


class Summary(Snap):
    job: str
    timesteps: int
    """num_env_steps_sampled at the end."""
    episodes: int = 0
    episode_return_mean: float | None = None
    wall_seconds: float
    stopped_by: str | None
    """timesteps | episodeReturnMean | timeLimitSeconds, or None when the run failed/was stopped."""
    phase: RunPhase = "Succeeded"
    message: str | None = None
    evaluation_return_mean: float | None = None
    """The last evaluation's mean return (spec.evaluation)."""
    best_evaluation_return_mean: float | None = None
    best_checkpoint: str | None = None
    """The checkpoint of the best evaluation, relative to the run directory."""


def write_json_atomic(path: Path, model: BaseModel) -> None:
    """Write a model as JSON via a temp file + rename, so readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(model.model_dump_json())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_whole(path: Path, data: bytes) -> None:
    """Append `data` to `path` entirely or not at all: a write that fails part-way (a full
    volume) is cut back off, so the next append does not land in the middle of a line or a
    record (truncating frees space, so it works on a full volume too)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def append_history(path: Path, point: HistoryPoint) -> None:
    """Append one JSON line, whole or not at all; a reader may still see a partial last line
    while it is being written, and must skip it."""
    line = json.dumps(point.model_dump(mode="json"), separators=(",", ":")) + "\n"
    append_whole(path, line.encode())
