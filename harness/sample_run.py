"""A plausible run directory, written through the real snapshot models and write helpers.

`bench/sidecar_wrk.py` and the sidecar's tests need run directories before (and apart from) a
real training run; this writes what a CartPole IMPALA run's driver would: a learning curve that
rises toward 500, throughput around 700 env steps/s, a full learner/timing/membership snapshot.
Both import it as `harness.sample_run`; it imports nothing but the product's snapshot models.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

from impala_api.snapshot import (
    HISTORY_FILE,
    STATUS_FILE,
    CheckpointInfo,
    Counters,
    HistoryPoint,
    LearnerQueue,
    Member,
    Membership,
    RunPhase,
    StatusSnapshot,
    StopProgress,
    Throughput,
    append_history,
    write_json_atomic,
)

STEPS_PER_POINT = 500
SECONDS_PER_POINT = 0.7


def sample_history(n: int, *, start_time: float, seed: int = 0) -> list[HistoryPoint]:
    """`n` history points, one per 500 env steps; the first has no episode return yet."""
    rng = random.Random(seed)
    points = []
    for i in range(n):
        steps = (i + 1) * STEPS_PER_POINT
        wall = (i + 1) * SECONDS_PER_POINT
        ret = (
            None
            if i == 0
            else round(20 + 430 * (1 - math.exp(-steps / 40_000)) + rng.uniform(-15, 15), 3)
        )
        points.append(
            HistoryPoint(
                time=start_time + wall,
                wall_seconds=round(wall, 3),
                env_steps=steps,
                episodes=steps // 60,
                learner_updates=steps // 500,
                episode_return_mean=ret,
                env_steps_per_s=round(700 + rng.uniform(-60, 60), 2),
                trained_steps_per_s=round(690 + rng.uniform(-60, 60), 2),
                learner_queue_fill=round(rng.uniform(0.1, 0.6), 3),
                policy_loss=round(rng.uniform(-0.05, 0.05), 5),
                vf_loss=round(rng.uniform(0.1, 2.0), 4),
                entropy=round(0.69 * math.exp(-steps / 200_000), 5),
            )
        )
    return points


def sample_snapshot(
    job: str,
    last: HistoryPoint | None,
    *,
    phase: RunPhase = "Running",
    start_time: float | None = None,
    updated_at: float | None = None,
    rollouts: int = 4,
    aggregators: int = 2,
) -> StatusSnapshot:
    """A snapshot consistent with the history's last point (or a fresh run when None)."""
    now = time.time() if updated_at is None else updated_at
    steps = last.env_steps if last else 0
    if start_time is None:
        start_time = now - (last.wall_seconds if last else 0.0)
    members = [
        Member(
            actor_id=f"rollout-{i}",
            role="rollout",
            node_id=f"node-r{i // 2}",
            node_ip=f"10.0.1.{i // 2 + 10}",
            env_steps=steps // max(rollouts, 1),
        )
        for i in range(rollouts)
    ] + [
        Member(
            actor_id=f"aggregator-{i}",
            role="aggregator",
            node_id=f"node-a{i}",
            node_ip=f"10.0.2.{i + 10}",
        )
        for i in range(aggregators)
    ]
    return StatusSnapshot(
        job=job,
        phase=phase,
        message="training" if phase == "Running" else None,
        started_at=start_time,
        updated_at=now,
        wall_seconds=last.wall_seconds if last else 0.0,
        iteration=steps // STEPS_PER_POINT,
        counters=Counters(
            num_env_steps_sampled=steps,
            num_env_steps_trained=max(0, steps - 500),
            episodes=last.episodes if last else 0,
            learner_updates=last.learner_updates if last else 0,
            num_weight_broadcasts=steps // 1000,
            num_times_learner_queue_full=3,
            policy_version=last.learner_updates if last else 0,
        ),
        episode_return_mean=last.episode_return_mean if last else None,
        episode_return_min=9.0 if last else None,
        episode_return_max=500.0 if last else None,
        episode_len_mean=last.episode_return_mean if last else None,
        throughput=Throughput(
            env_steps_per_s=last.env_steps_per_s if last else 0.0,
            trained_steps_per_s=last.trained_steps_per_s if last else 0.0,
            learner_updates_per_s=1.4,
            rollout_busy_fraction=0.42,
        ),
        learner={  # a gymnasium env's one policy, `default`
            "default/policy_loss": -0.012,
            "default/vf_loss": 0.84,
            "default/entropy": 0.52,
            "default/total_loss": 0.41,
            "default/grad_gnorm": 3.2,
            "default/cur_lr": 0.0005,
            "default/entropy_coeff": 0.01,
            "default/vf_explained_var": 0.61,
            "default/mean_rho": 0.97,
        },
        timing_breakdown={
            "learner_dequeue": 0.4,
            "learner_grad": 11.5,
            "learner_load": 0.9,
            "learner_load_wait": 0.2,
            "driver_sample_wait": 3.1,
        },
        learner_queue=LearnerQueue(
            capacity=16, size_mean=3.2, fill=0.2, learner_idle_fraction=0.12
        ),
        membership=Membership(
            rollout_workers=rollouts,
            aggregator_workers=aggregators,
            rollout_nodes=(rollouts + 1) // 2,
            aggregator_nodes=aggregators,
            members=members,
        ),
        checkpoint=CheckpointInfo(
            path="checkpoints/000010", time=now - 30, num_env_steps_sampled=steps // 2
        )
        if steps
        else None,
        stop=StopProgress(
            criteria={"timesteps": 200_000.0, "episodeReturnMean": 450.0},
            progress=min(1.0, steps / 200_000),
        ),
        policy_lag_mean=1.3,
    )


def write_sample_run(
    run_dir: Path,
    job: str = "cartpole",
    points: int = 100,
    *,
    phase: RunPhase = "Running",
    seed: int = 0,
) -> tuple[StatusSnapshot, list[HistoryPoint]]:
    """Write history.jsonl (appending `points` lines) and status.json into `run_dir`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    history = sample_history(points, start_time=now - points * SECONDS_PER_POINT, seed=seed)
    for point in history:
        append_history(run_dir / HISTORY_FILE, point)
    snap = sample_snapshot(job, history[-1] if history else None, phase=phase, updated_at=now)
    write_json_atomic(run_dir / STATUS_FILE, snap)
    return snap, history
