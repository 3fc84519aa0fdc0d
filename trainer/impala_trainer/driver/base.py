"""What every driver mode shares: setup, resume, stop criteria, reporting, checkpoints, failures.

`impala.ImpalaDriver` (the V-trace data flow of RLlib's IMPALA) and
`async_gradients.AsyncGradientsDriver` (the A3C flow) fill in the hooks. A driver is built whole
by its constructor (learner, thread, counters), with its collaborators passed in: the `Backend`
its actors run on, the `ActorManager` that keeps them, and, on a multi-pod learner, the
`ElasticMembership` that follows the cluster's nodes (`launch.build_driver` wires them). All
backend calls happen on the driver's main thread; a learner thread only ever sees queues.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from impala_api.snapshot import (
    BEST_CHECKPOINT,
    CheckpointInfo,
    RunPhase,
    StatusSnapshot,
    TrendSource,
)
from impala_api.spec import ImpalaJob, ImpalaJobSpec
from impala_trainer.backend import Backend, Handle
from impala_trainer.batches import Fragment, FragmentMeta
from impala_trainer.driver.actor_manager import ActorManager, ManagedActor
from impala_trainer.driver.evaluation import (
    MAX_FAILED_ROUNDS,
    EvaluationSchedule,
    Round,
    merge,
    runner_seed,
    shares,
)
from impala_trainer.driver.membership import ElasticMembership
from impala_trainer.driver.steering import Steering
from impala_trainer.learners.group import LearnerGroupError
from impala_trainer.learners.policies import LearnerState, policy_set_state
from impala_trainer.learners.process import LearnerProcessError
from impala_trainer.rollouts.agent_envs import PolicyModel, policy_models
from impala_trainer.rundir.checkpoint import (
    Restored,
    load_newest_readable,
    save_checkpoint,
    save_policy_checkpoint,
)
from impala_trainer.rundir.remote import Mirror
from impala_trainer.rundir.stats import RunStats
from impala_trainer.rundir.writer import RunDir

logger = logging.getLogger(__name__)
WAIT_SECONDS = 0.05  # longest the loop blocks before it re-checks the learner and the clock
NODES_REFRESH_SECONDS = 5.0


@dataclass
class DriverResult:
    phase: RunPhase
    stopped_by: str | None
    message: str | None

    @property
    def exit_code(self) -> int:
        return {"Succeeded": 0, "Stopped": 130}.get(self.phase, 1)


def _trend_source(spec: ImpalaJobSpec) -> TrendSource:
    """What the return trend follows: a job scored against a fixed opponent (self-play) learns
    nothing its zero-sum training return shows, so its evaluation rounds'."""
    scored = spec.evaluation is not None and spec.evaluation.opponent is not None
    return "evaluation" if scored else "training"


def resolve_seed(seed: int | None) -> int:
    """The run's seed: the spec's, or a fresh random one."""
    return random.SystemRandom().randrange(2**31) if seed is None else seed


class Driver:
    """Shared skeleton: subclasses build `learner` in their constructor and implement `_step`."""

    learner: LearnerState

    def __init__(
        self,
        job: ImpalaJob,
        run_dir: RunDir,
        *,
        backend: Backend,
        manager: ActorManager,
        membership: ElasticMembership | None = None,
        resume: bool = False,
        on_report: Callable[[StatusSnapshot], None] | None = None,
        mirror: Mirror | None = None,
    ) -> None:
        self.job = job
        self.spec = job.spec
        self.run_dir = run_dir
        self.backend = backend
        self.manager = manager
        self.seed = manager.base_seed
        # On a multi-pod learner the actors follow the cluster's rollout/aggregator nodes
        # instead of the manager's fixed targets.
        self.membership = membership
        self.resume = resume
        self.on_report = on_report
        # checkpoint.storageUri: each checkpoint goes up in the background, everything at the end.
        self.mirror = mirror
        self.stats = RunStats(job.name, self.spec.stop, trend_source=_trend_source(self.spec),
                              main_policy=self.spec.agents.main_policy)  # fmt: skip
        self._last_checkpoint = time.monotonic()
        self._last_nodes = float("-inf")
        self._started = False
        self._write_failing = False
        # spec.evaluation: its schedule (made in _setup, from the resumed counters), actors and
        # the round in flight.
        self.evaluations: EvaluationSchedule | None = None
        self._evaluators: list[Handle] = []
        self._round: Round | None = None
        torch.manual_seed(self.seed)
        self.models: dict[str, PolicyModel] = policy_models(self.spec)
        """The job's policies (a gymnasium env's one, `default`): what each model is built for."""
        # The largest of them: what `direct_samples` sizes a sample by.
        first = max(self.models.values(), key=lambda m: math.prod(m.obs_shape))
        self.obs_shape, self.actions = first.obs_shape, first.actions
        self.obs_dtype = first.obs_dtype
        # The actors start now, before the subclass builds its learner: each actor is a process
        # that imports torch and makes its envs, as a learner process does, and a GPU learner
        # makes its CUDA context; they overlap instead of adding up. Asked for work in _setup.
        self._new_actors = self.manager.ensure_targets()
        self.steering = Steering(run_dir.path, self.spec)
        """A population's requests to this run (rundir.control)."""

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> DriverResult:
        """Train until a stop criterion is met or something fails; always writes the summary."""
        result = DriverResult("Failed", None, "driver did not start")
        try:
            self._setup()
            while True:
                self._step()
                self._maintain()
                reason = self.stats.stop_reason()
                self._report()
                if reason is not None:
                    result = DriverResult("Succeeded", reason, f"stop criterion {reason} met")
                    break
        except KeyboardInterrupt:
            result = DriverResult("Stopped", None, "interrupted")
        except Exception as exc:  # the run fails with a one-line reason; details in the log
            logger.error("run failed", exc_info=True)
            result = DriverResult("Failed", None, one_line(exc))
        finally:
            self._finish(result)
        return result

    def _setup(self) -> None:
        new_actors = [*self._new_actors, *self.manager.ensure_targets()]
        self._new_actors = []
        restored = load_newest_readable(self.run_dir.checkpoints) if self.resume else None
        message = ""
        if isinstance(restored, tuple):
            message = f"no checkpoint could be read ({'; '.join(restored)}): starting afresh"
            logger.error(message)
        elif restored is not None:
            self._restore(restored)
            if restored.skipped:
                message = (
                    f"resumed from {restored.path.name}, the newest readable checkpoint; set "
                    f"aside: {'; '.join(restored.skipped)}"
                )
                logger.warning(message)
            else:
                logger.info(
                    "resumed from %s at %d env steps",
                    restored.path.name, self.stats.counters.num_env_steps_sampled,
                )  # fmt: skip
        if self.spec.evaluation is not None:
            self.evaluations = EvaluationSchedule(self.spec.evaluation, self.stats.evaluation)
        self._steer(force=True)  # a request the checkpoint had not caught up with: again
        self.learner.global_timestep = self.stats.counters.num_env_steps_trained
        self.stats.counters.policy_version = self.learner.policy_version
        # The first snapshot shows the restored counters before anything new is sampled.
        self._report(force=True, phase="Starting", message=message)
        self._started = True
        for actor in new_actors:
            self.on_new_actor(actor)
        self._begin()

    def _restore(self, restored: Restored) -> None:
        self.learner.load_state_dict(restored.learner_state)
        self._use(self.steering.resume(restored.state.control, self.learner))
        self.stats = RunStats(self.job.name, self.spec.stop, restored.state,
                              _trend_source(self.spec), self.spec.agents.main_policy)  # fmt: skip
        self.stats.checkpoint = CheckpointInfo(
            path=str(restored.path.relative_to(self.run_dir.path)),
            time=restored.path.stat().st_mtime,
            num_env_steps_sampled=self.stats.counters.num_env_steps_sampled,
        )

    def _steer(self, force: bool = False) -> None:
        timesteps = self.stats.counters.num_env_steps_sampled
        self._use(self.steering.poll(self.learner, timesteps, force))

    def _use(self, spec: ImpalaJobSpec) -> None:
        """Train with `spec` from now on (the same job with other live values)."""
        if spec is not self.spec:
            self.spec = spec
            self.job = self.job.model_copy(update={"spec": spec})

    def _maintain(self) -> None:
        self.manager.poll()
        self._steer()
        now = time.monotonic()
        if self.membership is not None:
            self.membership.tick(self)
        elif now - self._last_nodes > NODES_REFRESH_SECONDS:
            self._last_nodes = now
            self.manager.refresh_nodes()
            for actor in self.manager.ensure_targets():  # e.g. a node came back
                self.on_new_actor(actor)
        self.stats.counters.worker_restarts = self.manager.restarts
        if self.evaluations is not None:
            self._evaluate(self.evaluations)
        if now - self._last_checkpoint >= self.spec.checkpoint.interval_seconds:
            self._checkpoint()

    def _report(self, force: bool = False, phase: RunPhase = "Running", message: str = "") -> None:
        if not force and not self.run_dir.status_due():
            return
        snap = self._snapshot(phase, message or None)
        try:
            self.run_dir.write_status(snap, force=True)
            self.run_dir.append_history(self.stats.history_point(), force=force)
        except OSError as exc:  # a full volume: the sidecar serves the last status meanwhile
            if not self._write_failing:
                logger.error("status not written (%s); training goes on", exc.strerror or exc)
            self._write_failing = True
        else:
            self._write_failing = False
        if self.on_report is not None:
            self.on_report(snap)

    def _snapshot(
        self, phase: RunPhase, message: str | None = None, stopped_by: str | None = None
    ) -> StatusSnapshot:
        self.stats.iteration += 1
        membership = self.manager.membership()
        self.stats.tick(membership.rollout_workers)
        self._update_learner_stats()
        return self.stats.snapshot(phase, membership, message, stopped_by)

    def _checkpoint(self) -> None:
        self._last_checkpoint = time.monotonic()
        try:
            learner_state = self.learner.state_dict()
        except (LearnerProcessError, LearnerGroupError) as exc:  # its state died with it
            kept = self.stats.checkpoint.path if self.stats.checkpoint else "none yet"
            logger.error("checkpoint not written: %s; the last one stays (%s)", exc, kept)
            return
        try:
            state = self.stats.driver_state()
            state.control = self.steering.checkpoint_state(self.learner)
            path = save_checkpoint(
                self.run_dir.checkpoints, learner_state, state, self.spec.checkpoint.keep
            )
        except OSError as exc:  # a full or failing volume: train on, try again next interval
            kept = self.stats.checkpoint.path if self.stats.checkpoint else "none yet"
            logger.error(
                "checkpoint not written (%s) under %s; the last good one stays (%s); "
                "training goes on and the next interval tries again",
                exc.strerror or exc, self.run_dir.checkpoints, kept,
            )  # fmt: skip
            return
        self.stats.checkpoint = CheckpointInfo(
            path=str(path.relative_to(self.run_dir.path)),
            time=time.time(),
            num_env_steps_sampled=self.stats.counters.num_env_steps_sampled,
        )
        if self.mirror is not None:
            self.mirror.request()

    def _finish(self, result: DriverResult) -> None:
        try:
            self._close()
        except Exception:  # closing must not hide the run's own result
            logger.debug("close failed", exc_info=True)
        self._stop_evaluators()
        if self._started:
            # Also after a failure: the operator's restart resumes from it.
            self._checkpoint()
        snap = self._snapshot(result.phase, result.message, result.stopped_by)
        self.manager.shutdown()
        try:
            self.run_dir.write_status(snap, force=True)
            self.run_dir.append_history(self.stats.history_point(), force=True)
            self.run_dir.write_summary(
                self.stats.summary(result.phase, result.stopped_by, result.message)
            )
        except OSError as exc:
            # A full volume as the run ends: its result stands (an exit 1 here would count a
            # finished run as a failure and start it again on the same full volume).
            kept = self.stats.checkpoint.path if self.stats.checkpoint else "none"
            logger.error(
                "the run ended (%s) but its final status and summary were not written (%s); "
                "the newest checkpoint written is %s",
                result.phase, exc.strerror or exc, kept,
            )  # fmt: skip
        if self.mirror is not None and not self.mirror.close():
            logger.error(
                "the run's files did not all reach %s: %s",
                self.mirror.remote.location,
                self.mirror.last_error or "timed out",
            )
        if self.on_report is not None:
            self.on_report(snap)

    # -- evaluation (spec.evaluation; driver/evaluation.py holds the logic) --------------------

    def _evaluate(self, schedule: EvaluationSchedule) -> None:
        """Collect the round in flight when it is done; start the next when it is due."""
        if self._round is not None:
            refs = self._round.refs
            ready, _ = self.backend.wait(refs, len(refs), 0.0)
            if len(ready) < len(refs):
                return
            rnd, self._round = self._round, None
            try:
                results = [self.backend.get(ref) for ref in refs]
            except self.backend.failure as exc:
                logger.warning("evaluation failed: %s (new evaluation actors next round)",
                               one_line(exc))  # fmt: skip
                self._stop_evaluators()
                if schedule.failed():
                    raise RuntimeError(f"evaluation failed {MAX_FAILED_ROUNDS} times in a row: "
                                       f"{one_line(exc)}") from exc  # fmt: skip
                return
            self._record_round(schedule, rnd, results)
        counters = self.stats.counters
        if schedule.due(counters.num_env_steps_sampled):
            self._start_round(schedule)

    def _start_round(self, schedule: EvaluationSchedule) -> None:
        counters = self.stats.counters
        schedule.started(counters.num_env_steps_sampled)
        parts = shares(schedule.spec)
        while len(self._evaluators) < len(parts):
            i = len(self._evaluators)
            self._evaluators.append(self.backend.start_evaluator(
                self.spec, f"evaluation-{i}", runner_seed(self.seed, i)))  # fmt: skip
        weights = self.learner.get_weights()
        shared = self.backend.put(weights)
        video = schedule.spec.video
        refs = [
            self.backend.evaluate(actor, shared, share, video and i == 0)
            for i, (actor, share) in enumerate(zip(self._evaluators, parts, strict=False))
        ]
        self._round = Round(counters.num_env_steps_sampled, self.learner.policy_version,
                            weights, refs)  # fmt: skip

    def _record_round(
        self,
        schedule: EvaluationSchedule,
        rnd: Round,
        results: list[tuple[Any, tuple[str, bytes] | None]],
    ) -> None:
        video = next((v for _, v in results if v), None)
        path = self.run_dir.write_video(rnd.env_steps, video[1], video[0]) if video else None
        preview = next((r.preview for r, _ in results if r.preview), None)
        if preview is not None:
            self.run_dir.add_video_preview(rnd.env_steps, *preview)
        info, best = schedule.finished(rnd, merge([r for r, _ in results]), path)
        if best:
            kept = policy_set_state(rnd.weights, rnd.env_steps)
            where = save_policy_checkpoint(
                self.run_dir.checkpoints / BEST_CHECKPOINT, kept, self.stats.driver_state()
            )
            info.best_checkpoint = str(where.relative_to(self.run_dir.path))
        self.stats.add_evaluation(info)
        # A line of its own, so no round is missing from the curve when two finish between
        # regular history lines.
        self.run_dir.append_history(self.stats.history_point(), force=True)
        logger.info(
            "evaluation %d at %d env steps: return %s over %d episodes%s",
            info.evaluations, info.num_env_steps_sampled,
            "n/a" if info.episode_return_mean is None else f"{info.episode_return_mean:.2f}",
            info.episodes, " (best so far)" if best else "",
        )  # fmt: skip

    def _stop_evaluators(self) -> None:
        for actor in self._evaluators:
            try:
                self.backend.kill(actor)
            except Exception:  # already gone
                logger.debug("kill failed", exc_info=True)
        self._evaluators = []
        self._round = None

    # -- actors ---------------------------------------------------------------------------------

    def _count_sample(self, meta: FragmentMeta) -> None:
        """A sample's env steps, episodes and busy time into the run's stats."""
        self.stats.counters.num_env_steps_sampled += meta.env_steps
        self.stats.add_episodes(meta.episode_returns, meta.episode_lengths)
        self.stats.add_policy_returns(meta.policy_returns)
        play = self.spec.agents.self_play
        if play is not None:
            self.stats.add_self_play(play.policy, meta.self_play_scores)
        self.stats.add_rollout_busy(meta.busy_seconds)

    def _actor_failed(self, actor_id: str, error: BaseException) -> None:
        logger.warning("actor %s failed: %s", actor_id, one_line(error))
        self.forget(actor_id)
        replacement = self.manager.on_failure(actor_id, error)
        self.stats.counters.worker_restarts = self.manager.restarts
        if replacement is not None:
            self.on_new_actor(replacement)

    # -- what membership calls (membership.DriverHooks) ------------------------------------------

    def on_new_actor(self, actor: ManagedActor) -> None:
        """Give a new actor weights and work."""
        raise NotImplementedError

    def forget(self, actor_id: str) -> None:
        """Drop the in-flight requests of a failed or released actor."""

    def in_flight(self, actor_id: str) -> int:
        """Requests (samples, aggregations, gradients) the actor still owes the driver."""
        return 0

    def absorb(self, fragments: list[Fragment]) -> None:
        """Take fragments a released aggregator still held (membership's drain hand-over)."""
        if fragments:
            raise NotImplementedError(f"{type(self).__name__} has no aggregation")

    # -- subclass hooks -------------------------------------------------------------------------

    def _begin(self) -> None:
        """Start learning and sampling after the actors were created."""

    def _step(self) -> None:
        """One loop iteration; blocks at most about WAIT_SECONDS."""
        raise NotImplementedError

    def _update_learner_stats(self) -> None:
        """Copy learner/queue stats into self.stats before a snapshot."""

    def _close(self) -> None:
        """Stop the learner side (thread) at the end of the run."""


def one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__
