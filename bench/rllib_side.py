"""The peer: RLlib's own IMPALA (ray[rllib], same Ray version), driven like ours.

Ray 2.60 ships both of RLlib's API stacks for IMPALA. The pinned peer is the NEW stack (RLlib's
default for IMPALA in 2.60: EnvRunners + an async IMPALALearner with its own learner thread),
configured by `common.rllib_config` from the same ImpalaJob manifest ours runs. The old stack
(RolloutWorkers + the LearnerThread our design mirrors) still builds and trains in 2.60; the
learner-only scenario drives both, and `--rllib-stack old` switches the other scenarios over.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Any

import numpy as np

from common import SecondPoints, quiet_ray_logs, rllib_config
from impala_api.spec import ImpalaJobSpec


def _init_ray(workers: int) -> None:
    import ray

    quiet_ray_logs()
    # Logical CPUs for the EnvRunners (1 each), the remote Learner (1) and slack: both sides share
    # the same physical cores, the logical count only lets RLlib's actors schedule.
    for attempt in range(3):
        try:
            ray.init(
                address="local",  # never a cluster an earlier `ray start` left behind
                num_cpus=max(4, workers + 2),
                include_dashboard=False,
                log_to_driver=False,
                logging_level="ERROR",
            )
            return
        except Exception:  # a loaded machine can time the raylet's start-up out; retry
            ray.shutdown()
            if attempt == 2:
                raise
            time.sleep(5)


RETURNS_KEY = "bench_episode_returns"


def _episode_returns_callback() -> Any:
    """An RLlib callback logging every finished episode's full return, unreduced.

    RLlib's own `episode_return_mean` is reduced per train() call over whatever episodes its
    EnvRunners finished since the last one, so it jumps around; the bench computes the same
    100-episode mean for both sides from the raw returns instead. An episode can span several
    sample() chunks: its return is the final chunk's plus the earlier chunks'.
    """
    from ray.rllib.callbacks.callbacks import RLlibCallback

    class EpisodeReturns(RLlibCallback):
        def on_episode_end(self, *, episode: Any, metrics_logger: Any = None, **kw: Any) -> None:
            ret = float(episode.get_return())
            ret += sum(float(c.get_return()) for c in kw.get("prev_episode_chunks") or [])
            metrics_logger.log_value(RETURNS_KEY, ret, reduce="item_series")

    return EpisodeReturns


def _point(
    result: dict[str, Any], t_proc: float, t: float, stack: str, returns: deque[float]
) -> list[float | None]:
    """common.POINT_FIELDS of one train() result; `returns` holds the last 100 episodes."""
    runners = result.get("env_runners", {})
    if stack == "new":
        new = runners.get(RETURNS_KEY)
        if isinstance(new, float | int):
            new = [new]
        returns.extend(float(r) for r in new or [])
        ret = sum(returns) / len(returns) if returns else None
        sampled = result.get("num_env_steps_sampled_lifetime") or runners.get(
            "num_env_steps_sampled_lifetime", 0
        )
        trained = (
            result.get("learners", {})
            .get("__all_modules__", {})
            .get("num_env_steps_trained_lifetime", 0)
        )
    else:
        # The old stack's episode_return_mean is already over the last 100 episodes.
        ret = runners.get("episode_return_mean")
        ret = None if ret is None or (isinstance(ret, float) and np.isnan(ret)) else float(ret)
        sampled = result.get("num_env_steps_sampled", 0)
        trained = result.get("num_env_steps_trained", 0)
    return [round(t_proc, 3), round(t, 3), float(sampled or 0), float(trained or 0), ret]


def train(
    spec: ImpalaJobSpec,
    seconds: float,
    *,
    stop_return: float | None = None,
    seed: int = 0,
    stack: str = "new",
    sample_only: bool = False,
    process_start: float,
    algo_name: str = "impala",
    stop_steps: int | None = None,
) -> dict[str, Any]:
    """Train (or only sample) for `seconds`, until the return mean reaches `stop_return`, or
    until `stop_steps` env steps are sampled. `algo_name`: "impala" or "appo" (rllib_config).

    Returns the curve as common.POINT_FIELDS rows; the training clock starts at the first
    `train()` call (Ray start-up and algorithm construction are build_s).
    """
    workers = spec.rollouts.initial_replicas * spec.rollouts.workers_per_pod
    t_start = time.perf_counter()
    _init_ray(workers)
    cfg = rllib_config(spec, stack=stack, seed=seed, sample_only=sample_only, algo=algo_name)
    if stack == "new":
        cfg = cfg.callbacks(_episode_returns_callback())
    algo = cfg.build_algo()
    returns: deque[float] = deque(maxlen=100)
    build_s = time.perf_counter() - t_start
    t0 = time.perf_counter()
    points: list[list[float | None]] = [[round(time.time() - process_start, 3), 0.0, 0, 0, None]]
    reached_at: float | None = None
    try:
        while True:
            result = algo.train()
            t = time.perf_counter() - t0
            points.append(_point(result, time.time() - process_start, t, stack, returns))
            ret = points[-1][4]
            if stop_return is not None and ret is not None and ret >= stop_return:
                reached_at = t
                break
            if t >= seconds or (stop_steps is not None and (points[-1][2] or 0) >= stop_steps):
                break
    finally:
        algo.stop()
        import ray

        ray.shutdown()
    return {
        "points": points,
        "build_s": round(build_s, 2),
        "reached_s": reached_at,
        "stack": stack,
        "algo": algo_name,
        "config": _config_summary(cfg),
    }


def _config_summary(cfg: Any) -> dict[str, Any]:
    keys = (
        "num_env_runners",
        "num_envs_per_env_runner",
        "rollout_fragment_length",
        "train_batch_size_per_learner",
        "train_batch_size",
        "num_learners",
        "lr",
        "lr_schedule",
        "gamma",
        "entropy_coeff",
        "vf_loss_coeff",
        "grad_clip",
        "num_epochs",
        "learner_queue_size",
        "broadcast_interval",
        "min_time_s_per_iteration",
        "enable_rl_module_and_learner",
        "max_requests_in_flight_per_env_runner",
        "_separate_vf_optimizer",
        "_lr_vf",
        "clip_param",
        "use_kl_loss",
    )
    return {k: getattr(cfg, k, None) for k in keys}


def sample_only(
    spec: ImpalaJobSpec, seconds: float, *, seed: int = 0, process_start: float
) -> dict[str, Any]:
    """RLlib's rollout ceiling: its EnvRunners sampling with fixed weights, no learner.

    The loop is IMPALA's own sampling call (`foreach_env_runner_async_fetch_ready`, as in
    `IMPALA._sample_and_get_connector_states`) asking for plain `sample()`: each EnvRunner keeps
    `max_requests_in_flight_per_env_runner` requests outstanding and every episode list is fetched
    into this process, then dropped, like ours. (RLlib's `_env_runners_only` switch measured
    *below* its own training throughput here, so it is not a ceiling.)
    """
    import ray

    workers = spec.rollouts.initial_replicas * spec.rollouts.workers_per_pod
    t_start = time.perf_counter()
    _init_ray(workers)
    cfg = rllib_config(spec, stack="new", seed=seed)
    algo = cfg.build_algo()
    build_s = time.perf_counter() - t_start
    group = algo.env_runner_group
    curve = SecondPoints(seconds, process_start)
    steps = 0
    try:
        while not curve.due(steps):
            results = group.foreach_env_runner_async_fetch_ready(
                func="sample", tag="sample", timeout_seconds=0.05
            )
            for episodes in results:
                steps += sum(len(e) for e in episodes)
    finally:
        algo.stop()
        ray.shutdown()
    return {"points": curve.points, "build_s": round(build_s, 2)}


def _rllib_obs(obs_shape: tuple[int, ...]) -> tuple[int, ...]:
    # RLlib's CNNs take channels-last images: our [C, H, W] is its [H, W, C].
    return (*obs_shape[1:], obs_shape[0]) if len(obs_shape) == 3 else obs_shape


def learner_only(
    spec: ImpalaJobSpec,
    obs_shape: tuple[int, ...],
    num_actions: int,
    dtype: str,
    seconds: float,
    warmup_s: float,
    stack: str = "new",
) -> dict[str, Any]:
    """Samples/s of RLlib's learner fed one pre-built train batch, the way its algorithm feeds it.

    new stack: `IMPALALearner.update(TrainingData(batch=...))` (the local learner; update()
    enqueues to its `_LearnerThread`, which runs `num_epochs` passes). The batch is what RLlib's
    own learner connector made once from real episodes, so the per-update connector cost is NOT
    counted, which flatters RLlib. old stack: the batch goes into `algo._learner_thread.inqueue`
    (RLlib's LearnerThread + MinibatchBuffer), exactly as ours is driven.
    """
    import ray
    from ray.rllib.core.learner.training_data import TrainingData
    from ray.rllib.policy.sample_batch import concat_samples
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    t = spec.training
    if stack == "new" and len(obs_shape) == 3:
        # The new stack's CNN takes float frames only: RLlib's own Atari pipeline normalises
        # them to float32 in the env (NormalizedImageEnv), so that is what its learner eats.
        dtype = "float32"
    _init_ray(0)
    cfg = rllib_config(
        spec,
        stack=stack,
        seed=0,
        env_runners=0,
        synthetic=(_rllib_obs(obs_shape), dtype, num_actions),
    )
    algo = cfg.build_algo()
    k = t.num_sgd_iter
    try:
        if stack == "new":
            learner = algo.learner_group._learner
            episodes = algo.env_runner.sample(num_timesteps=t.train_batch_size)
            steps = sum(len(e) for e in episodes)
            batch = learner._make_batch_if_necessary(training_data=TrainingData(episodes=episodes))
            calls = 0
            start = time.perf_counter()
            window_start: float | None = None
            while True:
                now = time.perf_counter()
                if window_start is None and now - start >= warmup_s:
                    window_start, calls = now, 0
                if window_start is not None and now - window_start >= seconds:
                    break
                learner.update(
                    training_data=TrainingData(batch=batch),
                    timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: calls * steps},
                    num_epochs=k,
                    minibatch_size=None,
                    shuffle_batch_per_epoch=False,
                )
                calls += 1
            elapsed = time.perf_counter() - (window_start or start)
            # Batches still queued at the end were not trained on inside the window.
            done = calls - learner._learner_thread_in_queue.qsize()
            return {
                "samples_per_s": done * steps / elapsed,
                "updates_per_s": done * k / elapsed,
                "batch_env_steps": steps,
            }
        # Old stack: RLlib's LearnerThread, driven like ours.
        worker = algo.env_runner
        parts, steps = [], 0
        while steps < t.train_batch_size:
            part = worker.sample()
            parts.append(part)
            steps += part.count
        batch = concat_samples(parts)
        thread = algo._learner_thread
        updates = 0
        start = time.perf_counter()
        window_start = None
        while True:
            now = time.perf_counter()
            if window_start is None and now - start >= warmup_s:
                window_start, updates = now, 0
            if window_start is not None and now - window_start >= seconds:
                break
            import queue

            with contextlib.suppress(queue.Full):
                thread.inqueue.put(batch, timeout=0.05)
            while not thread.outqueue.empty():
                thread.outqueue.get_nowait()
                updates += 1
            if not thread.is_alive():
                raise RuntimeError("RLlib's learner thread died")
        elapsed = time.perf_counter() - (window_start or start)
        return {
            "samples_per_s": updates * steps / k / elapsed,
            "updates_per_s": updates / elapsed,
            "batch_env_steps": steps,
            "thread": type(thread).__name__,
        }
    finally:
        algo.stop()
        ray.shutdown()
