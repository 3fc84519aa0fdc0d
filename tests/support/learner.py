"""Learner test inputs: the small learner spec, a random but well-formed train batch, and one
torch thread for tests on tiny tensors (the learner, loss and learner-thread tests share them)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from impala_api.spec import DEFAULT_POLICY, ImpalaJobSpec
from impala_trainer.batches import TrainBatch, policy_layout, policy_weights
from tests.support.jobs import make_spec


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Tiny tensors: intra-op threads only add contention on a shared machine. The test modules'
    autouse `single_torch_thread` fixtures run each test inside it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


SMALL_MLP: dict[str, Any] = {"model": {"hidden": [32, 32]}}


def broadcast(learner: Any, version: int | None = None) -> dict[str, Any]:
    """`learner`'s weights as the driver broadcasts those of a job's one policy (`default`),
    at its version or `version`."""
    v = learner.policy_version if version is None else version
    return policy_layout(DEFAULT_POLICY, learner.get_weights(), v)


def acting_weights(worker: Any) -> dict[str, np.ndarray]:
    """A rollout worker's own weights, out of the broadcast layout."""
    arrays: dict[str, np.ndarray] = policy_weights(worker.get_weights())[DEFAULT_POLICY][0]
    return arrays


def learner_spec(*, learner: dict[str, Any] | None = None, **training: Any) -> ImpalaJobSpec:
    """The learner tests' spec: a [32, 32] MLP, `training` fields (camelCase), `learner` section."""
    return make_spec(SMALL_MLP, training=training, learner=learner or {})


def make_batch(
    T: int = 10, B: int = 4, obs_shape: tuple[int, ...] = (4,), A: int = 2, seed: int = 0
) -> TrainBatch:
    """A random but well-formed batch with some terminations and truncations."""
    rng = np.random.default_rng(seed)
    truncateds = rng.random((T, B)) < 0.05
    terminateds = rng.random((T, B)) < 0.05
    final_steps = np.argwhere(truncateds & ~terminateds).astype(np.int64)
    return TrainBatch(
        obs=rng.standard_normal((T, B, *obs_shape)).astype(np.float32),
        actions=rng.integers(0, A, (T, B)),
        behaviour_logits=rng.standard_normal((T, B, A)).astype(np.float32),
        rewards=rng.standard_normal((T, B)).astype(np.float32),
        terminateds=terminateds,
        truncateds=truncateds,
        final_obs=rng.standard_normal((len(final_steps), *obs_shape)).astype(np.float32),
        final_steps=final_steps,
        bootstrap_obs=rng.standard_normal((B, *obs_shape)).astype(np.float32),
        policy_versions=np.zeros(B, np.int64),
    )
