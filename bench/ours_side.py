"""Our side of each scenario, driven through the project's public pieces.

- training runs go through the driver (`impala_trainer.driver.impala`, what `impalajob train`
  runs) and read the run directory's history.jsonl, so the curve is exactly what a user sees;
- the rollout ceiling runs the same RolloutActors with fixed weights and no learner;
- learner-only pushes synthetic TrainBatches straight into `make_learner_thread`'s inqueue.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import time
from pathlib import Path
from typing import Any

import numpy as np

from common import SecondPoints
from impala_api.spec import ImpalaJobSpec
from impala_trainer.batches import TrainBatch


def synthetic_batch(
    t_len: int, b: int, obs_shape: tuple[int, ...], num_actions: int, dtype: str, seed: int = 0
) -> TrainBatch:
    """A TrainBatch of random data with the shapes and dtypes a real one has."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.uint8:
        obs = rng.integers(0, 256, size=(t_len, b, *obs_shape), dtype=np.uint8)
        boot = rng.integers(0, 256, size=(b, *obs_shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((t_len, b, *obs_shape)).astype(dtype)
        boot = rng.standard_normal((b, *obs_shape)).astype(dtype)
    return TrainBatch(
        obs=obs,
        actions=rng.integers(0, num_actions, size=(t_len, b), dtype=np.int64),
        behaviour_logits=rng.standard_normal((t_len, b, num_actions)).astype(np.float32),
        rewards=rng.standard_normal((t_len, b)).astype(np.float32),
        terminateds=rng.random((t_len, b)) < 0.01,
        truncateds=np.zeros((t_len, b), np.bool_),
        final_obs=np.zeros((0, *obs_shape), obs.dtype),
        final_steps=np.zeros((0, 2), np.int64),
        bootstrap_obs=boot,
        policy_versions=np.zeros(b, np.int64),
    )


def learner_only(
    spec: ImpalaJobSpec,
    obs_shape: tuple[int, ...],
    num_actions: int,
    dtype: str,
    seconds: float,
    warmup_s: float,
) -> dict[str, Any]:
    """Samples/s of our learner thread fed one pre-built batch as fast as its inqueue takes it
    (`learner.process: separate`: the learner process, fed through its inqueue as a run feeds it).

    samples/s = optimiser updates/s x batch env steps / numSgdIter, i.e. env steps of *new* train
    batches consumed per second (each is trained on numSgdIter times).
    """
    from impala_trainer.learners.threads import make_learner_thread
    from impala_trainer.learning.learner import LearnerConfig
    from impala_trainer.node.allocator import keep_freed_memory

    keep_freed_memory()  # as the learner's process does (commands/train.py, commands/learner.py)

    t, config = spec.training, LearnerConfig.of(spec)
    b = t.train_batch_size // t.rollout_fragment_length
    batch = synthetic_batch(t.rollout_fragment_length, b, obs_shape, num_actions, dtype)
    thread: Any
    if spec.learner.process == "separate":  # the learner in a process of its own, as a run has it
        import torch

        from impala_trainer.learners.process import LearnerProcess

        thread = LearnerProcess(config, obs_shape, num_actions, 0, torch.get_num_threads())
    else:
        thread = make_learner_thread(config, obs_shape, num_actions)
    thread.start()
    updates = 0
    start = time.perf_counter()
    window_start: float | None = None
    try:
        while True:
            now = time.perf_counter()
            if window_start is None and now - start >= warmup_s:
                window_start, updates = now, 0
            if window_start is not None and now - window_start >= seconds:
                break
            with contextlib.suppress(queue.Full):
                thread.inqueue.put(batch, timeout=0.05)
            while True:
                try:
                    thread.outqueue.get_nowait()
                except queue.Empty:
                    break
                updates += 1
            if thread.error is not None:
                raise RuntimeError(f"learner thread died: {thread.error}")
    finally:
        thread.stop()
        thread.join(timeout=5)
    elapsed = time.perf_counter() - (window_start or start)
    steps = batch.env_steps
    return {
        "samples_per_s": updates * steps / t.num_sgd_iter / elapsed,
        "updates_per_s": updates / elapsed,
        "batch_env_steps": steps,
        "learner_stats": thread.stats(),
    }


def train(
    manifest: Path,
    overrides: list[str],
    seconds: float,
    *,
    stop_return: float | None,
    seed: int,
    process_start: float,
    run_dir: Path,
    timesteps: int | None = None,
) -> dict[str, Any]:
    """`impalajob train -f MANIFEST` in this process; the curve from its history.jsonl.

    The stop criteria are replaced by ours: `seconds` of training (the driver's own clock), the
    return threshold or `timesteps` env steps. History lines come once a second, like RLlib's
    train() results here.
    """
    from impala_cli.main import main as cli_main

    sets = [
        *overrides,
        f"training.seed={seed}",
        f"stop.timeLimitSeconds={seconds}",
        f"stop.episodeReturnMean={'null' if stop_return is None else stop_return}",
        f"stop.timesteps={'null' if timesteps is None else timesteps}",
    ]
    argv = ["train", "-f", str(manifest), "--run-dir", str(run_dir), "--overwrite"]
    for s in sets:
        argv += ["--set", s]
    rc = cli_main(argv)
    from impala_api.manifest import load_manifest

    t = load_manifest(manifest, sets).spec.training
    # Trained env steps = learner updates x train batch / numSgdIter (every update trains on one
    # batch; the first of its numSgdIter passes counts its steps). history.jsonl has the
    # cumulative update count, not the trained steps.
    per_update = t.train_batch_size / t.num_sgd_iter
    points: list[list[float | None]] = [[0.0, 0.0, 0, 0, None]]
    history = run_dir / "history.jsonl"
    for line in history.read_text().splitlines() if history.exists() else []:
        try:
            h = json.loads(line)
        except json.JSONDecodeError:  # a torn last line
            continue
        points.append(
            [
                round(h["time"] - process_start, 3),
                round(h["wall_seconds"], 3),
                h["env_steps"],
                round(h.get("learner_updates", 0) * per_update),
                h.get("episode_return_mean"),
            ]
        )
    summary_path, status_path = run_dir / "summary.json", run_dir / "status.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    status = json.loads(status_path.read_text()) if status_path.exists() else {}
    counters = status.get("counters", {})
    reached = summary.get("stopped_by") == "episodeReturnMean"
    return {
        "points": points,
        "rc": rc,
        "reached_s": points[-1][1] if reached else None,
        "summary": summary,
        "num_env_steps_trained": counters.get("num_env_steps_trained"),
        "learner_updates": counters.get("learner_updates"),
        "timing_breakdown": status.get("timing_breakdown", {}),
        "learner_queue": status.get("learner_queue", {}),
        "policy_lag_mean": status.get("policy_lag_mean"),
    }


def sample_only(
    spec: ImpalaJobSpec, seconds: float, *, seed: int, process_start: float
) -> dict[str, Any]:
    """The rollout ceiling: our RolloutActors with fixed (initial) weights and no learner.

    The loop is the driver's sampling half, through the driver's backend: each actor keeps
    maxRequestsInFlightPerWorker requests outstanding, over the transport the driver would pick
    (`rollouts.transport`: direct connections for small fragments), and every fragment is
    fetched into this process (as the driver does before aggregation), then dropped. Points once
    a second, like the training runs.
    """
    import ray

    from impala_trainer.driver.impala import direct_samples
    from impala_trainer.driver.ray_backend import RayBackend
    from impala_trainer.learning.model_factory import build_model
    from impala_trainer.rollouts.actor import ROLLOUT_RESOURCE
    from impala_trainer.rollouts.envs import env_spaces

    workers = spec.rollouts.initial_replicas * spec.rollouts.workers_per_pod
    ray.init(
        address="local",  # never a cluster an earlier `ray start` left behind
        num_cpus=os.cpu_count() or 1,
        resources={ROLLOUT_RESOURCE: workers},
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
    )
    spaces = env_spaces(spec.env)
    model = build_model(spec.model, spaces.obs_shape, spaces.actions)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    direct = direct_samples(spec, spaces.obs_shape, spaces.obs_dtype, nbytes)
    backend = RayBackend()
    actors = [backend.start("rollout", spec, f"rollout-{i}", seed + i) for i in range(workers)]
    backend.get_many([backend.node_info(a) for a in actors])  # built: envs made, torch imported
    in_flight = spec.training.max_requests_in_flight_per_worker
    refs: dict[Any, int] = {}
    for i, actor in enumerate(actors):
        for _ in range(in_flight):
            refs[backend.sample_whole(actor, None, 0, direct=direct)] = i
    curve = SecondPoints(seconds, process_start)
    steps = 0
    try:
        while not curve.due(steps):
            ready, _ = backend.wait(list(refs), num_returns=1, timeout=0.05)
            for ref in ready:
                i = refs.pop(ref)
                _, meta = backend.get(ref)  # the driver pulls each fragment to aggregate it
                steps += meta.env_steps
                refs[backend.sample_whole(actors[i], None, 0, direct=direct)] = i
    finally:
        ray.shutdown()
    return {"points": curve.points}
