"""The driver's bookkeeping: counters, the episode window, throughput, stop criteria, snapshots.

Pure Python (no Ray, no torch), so stop criteria and snapshot contents are unit-testable, and the
driver loop only moves data.
"""

from __future__ import annotations

import math
import time
from collections import deque
from statistics import fmean, pstdev
from typing import Any

from impala_api.snapshot import (
    CheckpointInfo,
    Counters,
    EvaluationInfo,
    HistoryPoint,
    LearnerQueue,
    Membership,
    PolicyStatus,
    ReturnTrend,
    RunPhase,
    StatusSnapshot,
    StopProgress,
    Summary,
    Throughput,
    TrendSource,
)
from impala_api.spec import DEFAULT_POLICY, StopSpec
from impala_trainer.rundir import trend
from impala_trainer.rundir.checkpoint import DriverState

EPISODE_WINDOW = 100
RATE_WINDOW_SECONDS = 5.0


class RunStats:
    """Everything status.json, history.jsonl, summary.json and checkpoints report."""

    def __init__(
        self,
        job: str,
        stop: StopSpec,
        resumed: DriverState | None = None,
        trend_source: TrendSource = "training",
        main_policy: str = DEFAULT_POLICY,
    ) -> None:
        self.job = job
        self.stop = stop
        self.main_policy = main_policy
        """Whose learner stats the history's losses follow (spec.agents.main_policy)."""
        state = resumed or DriverState()
        self.counters = Counters(**state.counters)
        self.returns: deque[float] = deque(state.episode_returns, maxlen=EPISODE_WINDOW)
        self.policy_returns: dict[str, deque[float]] = {}
        """A multi-agent job's agent returns per policy (not checkpointed: refilled within a
        window's episodes of a resume)."""
        self.policy_episodes: dict[str, int] = {}
        self.self_play_policy: str | None = None
        self.self_play_scores: deque[float] = deque(maxlen=EPISODE_WINDOW)
        self.self_play_games = 0
        self.lengths: deque[int] = deque(state.episode_lengths, maxlen=EPISODE_WINDOW)
        self.iteration = state.iteration
        self.started_at = state.started_at or time.time()
        self._wall_before = state.wall_seconds
        self._t0 = time.monotonic()
        self.learner: dict[str, float] = {}
        """Learner stats of the last snapshot: each the mean over that snapshot's updates."""
        self._learner_pending: list[dict[str, float]] = []
        self.timing_breakdown: dict[str, float] = {}
        self.queue = LearnerQueue()
        self.checkpoint: CheckpointInfo | None = None
        self._lags: deque[float] = deque(maxlen=50)
        self._rollout_busy = 0.0
        """Seconds the rollout actors spent on the fragments received so far (this process)."""
        self._rates: deque[tuple[float, int, int, int, float]] = deque()
        self.throughput = Throughput()
        self.evaluation: EvaluationInfo | None = (
            EvaluationInfo.model_validate(state.evaluation) if state.evaluation else None
        )
        saved = ReturnTrend.model_validate(state.return_trend or {"source": trend_source})
        # A job resumed with another evaluation opponent follows another return: start afresh.
        self.trend = saved if saved.source == trend_source else ReturnTrend(source=trend_source)

    # -- updates --------------------------------------------------------------------------------

    def add_episodes(self, returns: list[float], lengths: list[int]) -> None:
        self.returns.extend(returns)
        self.lengths.extend(lengths)
        self.counters.episodes += len(returns)

    def add_policy_returns(self, returns: dict[str, list[float]]) -> None:
        """A multi-agent sample's agent returns per policy."""
        for name, values in returns.items():
            window = self.policy_returns.setdefault(name, deque(maxlen=EPISODE_WINDOW))
            window.extend(values)
            self.policy_episodes[name] = self.policy_episodes.get(name, 0) + len(values)

    def add_self_play(self, policy: str, scores: list[float]) -> None:
        """Games of the self-play policy against its snapshot pool (1, 0.5, 0)."""
        if scores:
            self.self_play_policy = policy
            self.self_play_scores.extend(scores)
            self.self_play_games += len(scores)

    def add_learner_stats(self, stats: dict[str, float]) -> None:
        """One update's learner stats; the next snapshot reports their mean over its updates
        (RLlib's LearnerInfoBuilder), not the last update's noise. A stat no update of the
        window carries keeps its last mean: each policy's learner steps on its own, and one that
        took no step in a window (a busy machine's last seconds) still has its figures."""
        self._learner_pending.append(stats)

    def _fold_learner_stats(self) -> None:
        pending, self._learner_pending = self._learner_pending, []
        if pending:
            keys = dict.fromkeys(k for stats in pending for k in stats)
            window = {k: fmean(s[k] for s in pending if k in s) for k in keys}
            self.learner = {**self.learner, **window}

    def add_evaluation(self, info: EvaluationInfo) -> None:
        """A finished evaluation (the caller has set its best_* fields); the trend's next point
        when it follows the evaluation (its episodes: the games of every round so far)."""
        self.evaluation = info
        mean = info.episode_return_mean
        if self.trend.source == "evaluation" and mean is not None and info.episodes:
            games = info.evaluations * info.episodes
            error = (info.episode_return_std or 0.0) / math.sqrt(info.episodes)
            self.trend = trend.observe(self.trend, mean, info.num_env_steps_sampled, games, error)

    def add_policy_lag(self, lag: float) -> None:
        self._lags.append(lag)

    @property
    def policy_lag_mean(self) -> float:
        """Over the recent batches' lags (0 before the first)."""
        return sum(self._lags) / len(self._lags) if self._lags else 0.0

    def add_rollout_busy(self, seconds: float) -> None:
        """A received fragment's `busy_seconds`: its actor's time on the request."""
        self._rollout_busy += seconds

    def wall_seconds(self) -> float:
        """Training seconds over this run and every run it resumed."""
        return self._wall_before + time.monotonic() - self._t0

    def tick(self, rollout_actors: int = 0) -> None:
        """Refresh throughput over the last few seconds (`rollout_actors`: how many sampled in
        them, for the share of their time they were busy)."""
        now = time.monotonic()
        c = self.counters
        self._rates.append(
            (
                now,
                c.num_env_steps_sampled,
                c.num_env_steps_trained,
                c.learner_updates,
                self._rollout_busy,
            )
        )
        while len(self._rates) > 2 and now - self._rates[0][0] > RATE_WINDOW_SECONDS:
            self._rates.popleft()
        t0, s0, tr0, u0, b0 = self._rates[0]
        dt = now - t0
        if dt > 0:
            busy = (self._rollout_busy - b0) / (dt * rollout_actors) if rollout_actors else 0.0
            self.throughput = Throughput(
                env_steps_per_s=(c.num_env_steps_sampled - s0) / dt,
                trained_steps_per_s=(c.num_env_steps_trained - tr0) / dt,
                learner_updates_per_s=(c.learner_updates - u0) / dt,
                # A fragment's time is counted when it arrives, so a window can hold a little
                # more than its own span: capped.
                rollout_busy_fraction=min(1.0, busy),
            )

    # -- stop criteria --------------------------------------------------------------------------

    @property
    def return_mean(self) -> float | None:
        return sum(self.returns) / len(self.returns) if self.returns else None

    def _stop_window(self) -> deque[float]:
        """The returns stop.episodeReturnMean measures: stop.policy's agents', else the
        episodes'."""
        if self.stop.policy is None:
            return self.returns
        return self.policy_returns.get(self.stop.policy, deque())

    def criteria(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.stop.timesteps is not None:
            out["timesteps"] = float(self.stop.timesteps)
        if self.stop.episode_return_mean is not None:
            out["episodeReturnMean"] = float(self.stop.episode_return_mean)
        if self.stop.evaluation_return_mean is not None:
            out["evaluationReturnMean"] = float(self.stop.evaluation_return_mean)
        if self.stop.time_limit_seconds is not None:
            out["timeLimitSeconds"] = float(self.stop.time_limit_seconds)
        return out

    def stop_reason(self) -> str | None:
        """The first criterion met, checked in manifest order, else None.

        The return criterion needs a full window of 100 episodes, so a lucky handful of early
        episodes cannot end the run.
        """
        s = self.stop
        if s.timesteps is not None and self.counters.num_env_steps_sampled >= s.timesteps:
            return "timesteps"
        window = self._stop_window()
        if (
            s.episode_return_mean is not None
            and len(window) >= EPISODE_WINDOW
            and sum(window) / len(window) >= s.episode_return_mean
        ):
            return "episodeReturnMean"
        evaluated = self.evaluation_return_mean
        if (
            s.evaluation_return_mean is not None
            and evaluated is not None
            and evaluated >= s.evaluation_return_mean
        ):
            return "evaluationReturnMean"
        if s.time_limit_seconds is not None and self.wall_seconds() >= s.time_limit_seconds:
            return "timeLimitSeconds"
        return None

    def progress(self) -> float:
        """Progress toward the nearest criterion, in [0, 1]."""
        foreseeable = self.foreseeable_progress()
        fractions = [0.0] if foreseeable is None else [foreseeable]
        s = self.stop
        window = self._stop_window()
        if s.episode_return_mean is not None and window:
            mean, target = sum(window) / len(window), s.episode_return_mean
            frac = mean / target if target > 0 else float(mean >= target)
            fractions.append(frac * min(1.0, len(window) / EPISODE_WINDOW))
        evaluated = self.evaluation_return_mean
        if s.evaluation_return_mean is not None and evaluated is not None:
            target = s.evaluation_return_mean
            fractions.append(evaluated / target if target > 0 else float(evaluated >= target))
        return max(0.0, min(1.0, max(fractions)))

    def foreseeable_progress(self) -> float | None:
        """Progress toward the nearer of timesteps and timeLimitSeconds; None without either."""
        s = self.stop
        fractions = []
        if s.timesteps:
            fractions.append(self.counters.num_env_steps_sampled / s.timesteps)
        if s.time_limit_seconds:
            fractions.append(self.wall_seconds() / s.time_limit_seconds)
        return max(0.0, min(1.0, max(fractions))) if fractions else None

    def remaining_seconds(self) -> float | None:
        """Until timesteps (at the recent rate) or timeLimitSeconds, whichever is sooner; None
        when neither is set, or only timesteps and nothing has been sampled recently."""
        s = self.stop
        left = []
        rate = self.throughput.env_steps_per_s
        if s.timesteps and rate > 0:
            left.append((s.timesteps - self.counters.num_env_steps_sampled) / rate)
        if s.time_limit_seconds:
            left.append(s.time_limit_seconds - self.wall_seconds())
        return max(0.0, min(left)) if left else None

    @property
    def evaluation_return_mean(self) -> float | None:
        return self.evaluation.episode_return_mean if self.evaluation else None

    # -- outputs --------------------------------------------------------------------------------

    def snapshot(
        self,
        phase: RunPhase,
        membership: Membership,
        message: str | None = None,
        stopped_by: str | None = None,
    ) -> StatusSnapshot:
        returns = list(self.returns)
        lengths = list(self.lengths)
        self._fold_learner_stats()
        mean = self.return_mean
        if self.trend.source == "training" and len(returns) >= EPISODE_WINDOW and mean is not None:
            c = self.counters
            error = pstdev(returns) / math.sqrt(len(returns))
            self.trend = trend.observe(
                self.trend, mean, c.num_env_steps_sampled, c.episodes, error, from_start=True
            )
        return StatusSnapshot(
            job=self.job,
            phase=phase,
            message=message,
            started_at=self.started_at,
            updated_at=time.time(),
            wall_seconds=self.wall_seconds(),
            iteration=self.iteration,
            counters=self.counters.model_copy(),
            episode_return_mean=self.return_mean,
            episode_return_min=min(returns) if returns else None,
            episode_return_max=max(returns) if returns else None,
            episode_len_mean=sum(lengths) / len(lengths) if lengths else None,
            throughput=self.throughput,
            learner=dict(self.learner),
            timing_breakdown=dict(self.timing_breakdown),
            learner_queue=self.queue,
            membership=membership,
            checkpoint=self.checkpoint,
            evaluation=self.evaluation,
            stop=StopProgress(
                criteria=self.criteria(), progress=self.progress(), stopped_by=stopped_by,
                policy=self.stop.policy, foreseeable=self.foreseeable_progress(),
                remaining_seconds=self.remaining_seconds(),
            ),
            return_trend=self.trend,
            policy_lag_mean=self.policy_lag_mean,
            policies=self._policies(),
        )

    def _policies(self) -> dict[str, PolicyStatus]:
        out = {
            name: PolicyStatus(
                episode_return_mean=sum(w) / len(w) if w else None,
                episodes=self.policy_episodes.get(name, 0),
            )
            for name, w in self.policy_returns.items()
        }
        play, scores = self.self_play_policy, self.self_play_scores
        if play is not None and scores:
            status = out.setdefault(play, PolicyStatus())
            status.self_play_score = sum(scores) / len(scores)
            status.self_play_games = self.self_play_games
        return out

    def history_point(self) -> HistoryPoint:
        c = self.counters
        return HistoryPoint(
            time=time.time(),
            wall_seconds=self.wall_seconds(),
            env_steps=c.num_env_steps_sampled,
            episodes=c.episodes,
            learner_updates=c.learner_updates,
            episode_return_mean=self.return_mean,
            env_steps_per_s=self.throughput.env_steps_per_s,
            trained_steps_per_s=self.throughput.trained_steps_per_s,
            learner_queue_fill=self.queue.fill,
            policy_loss=self.learner.get(f"{self.main_policy}/policy_loss"),
            vf_loss=self.learner.get(f"{self.main_policy}/vf_loss"),
            entropy=self.learner.get(f"{self.main_policy}/entropy"),
            evaluation_return_mean=self.evaluation_return_mean,
            evaluation_env_steps=self.evaluation.num_env_steps_sampled if self.evaluation else None,
        )

    def summary(self, phase: RunPhase, stopped_by: str | None, message: str | None) -> Summary:
        evaluation = self.evaluation or EvaluationInfo()
        return Summary(
            job=self.job,
            timesteps=self.counters.num_env_steps_sampled,
            episodes=self.counters.episodes,
            episode_return_mean=self.return_mean,
            wall_seconds=self.wall_seconds(),
            stopped_by=stopped_by,
            phase=phase,
            message=message,
            evaluation_return_mean=self.evaluation_return_mean,
            best_evaluation_return_mean=evaluation.best_return_mean,
            best_checkpoint=evaluation.best_checkpoint,
        )

    def driver_state(self) -> DriverState:
        return DriverState(
            counters=self.counters.model_dump(),
            wall_seconds=self.wall_seconds(),
            episode_returns=list(self.returns),
            episode_lengths=list(self.lengths),
            iteration=self.iteration,
            started_at=self.started_at,
            evaluation=self.evaluation.model_dump() if self.evaluation else None,
            return_trend=self.trend.model_dump(),
        )

    def set_learner_queue(
        self, size_stats: dict[str, Any], capacity: int, idle_fraction: float
    ) -> None:
        """From the learner thread's WindowStat("size").stats() (RLlib's keys)."""
        mean = float(size_stats.get("size_mean", 0.0))
        self.queue = LearnerQueue(
            capacity=capacity,
            size_count=int(size_stats.get("size_count", 0)),
            size_mean=mean,
            size_std=float(size_stats.get("size_std", 0.0)),
            size_quantiles=list(size_stats.get("size_quantiles", [])),
            fill=min(1.0, mean / capacity) if capacity else 0.0,
            learner_idle_fraction=idle_fraction,
        )
