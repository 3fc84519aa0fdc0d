"""Our side of each scenario, driven through the project's public pieces.

- training runs go through the driver (`impala_trainer.driver`, what `impalajob train` runs) and
  read the run directory's history.jsonl, so the curve is exactly what a user sees;
- the rollout ceiling runs the same RolloutActors with fixed weights and no learner;
- learner-only pushes synthetic TrainBatches straight into `make_learner_thread`'s inqueue.
"""

from __future__ import annotations

import contextlib
import queue
import time
from typing import Any

import numpy as np

from impala_trainer.sample_batch import TrainBatch
from impala_trainer.spec import ImpalaJobSpec


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
        truncation_values=np.zeros((t_len, b), np.float32),
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
    """Samples/s of our learner thread fed one pre-built batch as fast as its inqueue takes it.

    samples/s = optimiser updates/s x batch env steps / numSgdIter, i.e. env steps of *new* train
    batches consumed per second (each is trained on numSgdIter times).
    """
    from impala_trainer.learner_thread import make_learner_thread

    t = spec.training
    b = t.train_batch_size // t.rollout_fragment_length
    batch = synthetic_batch(t.rollout_fragment_length, b, obs_shape, num_actions, dtype)
    thread = make_learner_thread(spec, obs_shape, num_actions)
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
