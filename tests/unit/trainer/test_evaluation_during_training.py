"""Evaluation during training (spec.evaluation): the driver on the in-process backend starts a
round every intervalTimesteps with the learner's weights, its actors play whole episodes and
never feed the learner, the results reach status, history, summary and TensorBoard, the best
round's weights are kept as checkpoints/best, a stop criterion can read it, and a resumed run
continues the schedule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from impala_api.snapshot import EvaluationInfo
from impala_api.spec import EvaluationSpec, ImpalaJob
from impala_trainer.driver.evaluation import EvaluationSchedule, Round, merge, shares
from impala_trainer.driver.launch import Wiring, build_driver
from impala_trainer.driver.local_backend import LocalBackend
from impala_trainer.policy.episodes import EvaluationResult
from impala_trainer.policy.loaded import load_policy
from impala_trainer.rundir.writer import RunDir
from tests.support.jobs import make_job
from tests.support.learner import one_torch_thread


def _job(stop: dict[str, Any], **evaluation: Any) -> ImpalaJob:
    return make_job(
        "evaluated",
        env={"id": "CartPole-v1", "numEnvsPerWorker": 4},
        model={"hidden": [16]},
        training={"rolloutFragmentLength": 16, "trainBatchSize": 64, "lr": 0.005},
        evaluation={
            "intervalTimesteps": 2_000,
            "duration": 4,
            "numEnvRunners": 2,
            "numEnvsPerRunner": 2,
            **evaluation,
        },
        stop=stop,
    )


def _run(tmp_path: Path, job: ImpalaJob, resume: bool = False) -> tuple[Any, LocalBackend]:
    backend = LocalBackend(rollout_units=2)
    run_dir = RunDir(tmp_path / "run")
    run_dir.prepare(job)
    wiring = Wiring(rollout_workers=2, resume=resume)
    driver = build_driver(job, run_dir, backend, wiring)
    with one_torch_thread():
        result = driver.run()
    assert result.phase == "Succeeded", result
    return driver, backend


def test_evaluation_actors_play_the_learners_weights_and_never_feed_it(tmp_path: Path) -> None:
    # 2,000 steps a round, 500 per env: every env ends an episode (CartPole truncates at 500).
    job = _job({"timesteps": 9_000}, video=True, duration=2_000, durationUnit="timesteps")
    driver, backend = _run(tmp_path, job)
    run = tmp_path / "run"
    counters = driver.stats.counters
    # Every env step the driver counts came from the rollout actors (less the fragments still
    # in flight when it stopped: 2 actors x 2 requests x 64 steps); the evaluations' 2,000
    # steps a round are apart.
    rollout_steps = sum(a.worker.env_steps for a in backend.actors if a.worker is not None)
    assert 0 <= rollout_steps - counters.num_env_steps_sampled <= 256
    assert {a.role for a in backend.evaluators} == {"evaluation"}
    assert all(set(a.calls) == {"evaluate"} for a in backend.evaluators)
    assert len(backend.evaluators) == 2  # started once, reused every round
    status = json.loads((run / "status.json").read_text())
    info = EvaluationInfo.model_validate(status["evaluation"])
    rounds = info.evaluations
    assert rounds >= 3  # at ~2K, ~4K, ~6K, ~8K env steps
    # A round started in the run's last iteration is asked for but never collected.
    assert backend.evaluators[0].calls.count("evaluate") in (rounds, rounds + 1)
    assert info.env_steps == 2_000
    assert info.episodes >= 1 and info.episode_len_mean is not None
    assert info.num_env_steps_sampled <= counters.num_env_steps_sampled
    # The curve: one point per round in the history, at the env step of its weights.
    history = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    points = {h["evaluation_env_steps"]: h["evaluation_return_mean"] for h in history
              if h.get("evaluation_env_steps") is not None}  # fmt: skip
    assert len(points) == rounds and all(v > 0 for v in points.values())
    # The best round's weights, loadable as any checkpoint; its video in videos/.
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_checkpoint"] == "checkpoints/best" == info.best_checkpoint
    assert summary["best_evaluation_return_mean"] == max(points.values()) == info.best_return_mean
    best = load_policy(run, "best")
    assert best.global_timestep == info.best_num_env_steps_sampled
    assert [p.name for p in (run / "videos").iterdir()] != []
    assert info.video is not None and (run / info.video).stat().st_size > 1000
    acc = event_accumulator.EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0})
    acc.Reload()
    evaluated = [e.step for e in acc.Scalars("evaluation/episode_return_mean")]
    assert evaluated == sorted(points) and len(acc.Images("evaluation/episode")) == rounds


def test_a_stop_criterion_reads_the_evaluation_and_a_resumed_run_keeps_the_schedule(
    tmp_path: Path,
) -> None:
    driver, _ = _run(tmp_path, _job({"evaluationReturnMean": 1.0}, intervalTimesteps=1_000))
    assert driver.stats.stop_reason() == "evaluationReturnMean"  # any return is >= 1
    first = driver.stats.evaluation
    assert first is not None and first.evaluations == 1
    more = _job({"timesteps": first.num_env_steps_sampled + 3_000}, intervalTimesteps=1_000)
    driver, _ = _run(tmp_path, more, resume=True)
    info = driver.stats.evaluation
    assert info is not None and info.evaluations > first.evaluations  # counted on
    assert info.num_env_steps_sampled >= first.num_env_steps_sampled + 1_000


def test_the_duration_is_shared_over_the_runners_and_rounds_merge() -> None:
    spec = EvaluationSpec(duration=7, numEnvRunners=3)
    assert shares(spec) == [3, 2, 2]
    assert shares(EvaluationSpec(duration=2, numEnvRunners=4)) == [1, 1]
    merged = merge([EvaluationResult([1.0, 3.0], [10, 30], env_steps=45),
                    EvaluationResult([2.0], [20], env_steps=25)])  # fmt: skip
    assert merged.returns == [1.0, 3.0, 2.0] and merged.env_steps == 70
    schedule = EvaluationSchedule(EvaluationSpec(intervalTimesteps=100), None)
    assert not schedule.due(99) and schedule.due(100)
    schedule.started(150)
    assert not schedule.due(249) and schedule.due(250)
    weights = {"w": np.zeros(1)}
    info, best = schedule.finished(Round(150, 3, weights, []), merged, None)
    assert best and info.best_return_mean == pytest.approx(2.0) and info.evaluations == 1
    worse, best = schedule.finished(Round(250, 4, weights, []),
                                    EvaluationResult([0.5], [5], env_steps=5), None)  # fmt: skip
    assert not best and worse.best_return_mean == pytest.approx(2.0)
    assert worse.best_num_env_steps_sampled == 150 and worse.evaluations == 2
    nothing, best = schedule.finished(Round(350, 5, weights, []), EvaluationResult(), None)
    assert not best and nothing.episode_return_mean is None  # no episode ended in time
