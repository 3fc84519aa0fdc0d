"""learner.replicas: learners in one group step exactly as DistributedDataParallel defines it.

Two learners run on threads of this process over a gloo group on a `HashStore` (the production
code's `Collective`, only the store differs from a TCPStore), in float64.
"""

from __future__ import annotations

import dataclasses
import gc
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from impala_trainer.batches import TrainBatch, slice_columns
from impala_trainer.learning.collective import (
    BUCKET_BYTES,
    Collective,
    GroupStopped,
    Rendezvous,
    plan_buckets,
)
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.learning.towers import MultiDeviceLearner
from tests.support.learner import learner_spec, make_batch, one_torch_thread

MODELS: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {
    "mlp": ({"hidden": [16, 16]}, (4,)),
    "cnn": ({"type": "cnn", "hidden": [16]}, (4, 84, 84)),
    "lstm": ({"hidden": [8], "useLstm": True, "lstmCellSize": 8, "maxSeqLen": 5}, (4,)),
}
ACTIONS = 3


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def frames(batch: TrainBatch) -> TrainBatch:
    """Atari-like uint8 observations for the CNN, in place of the batch's floats."""
    rng = np.random.default_rng(1)
    T, B = batch.rewards.shape
    return dataclasses.replace(
        batch,
        obs=rng.integers(0, 255, (T, B, 4, 84, 84), np.uint8),
        bootstrap_obs=rng.integers(0, 255, (B, 4, 84, 84), np.uint8),
        final_obs=rng.integers(0, 255, (len(batch.final_steps), 4, 84, 84), np.uint8),
    )


def batches(obs_shape: tuple[int, ...], n: int, state_size: int = 0) -> list[TrainBatch]:
    """`n` batches of 4 columns; an LSTM's with a state for each column to start from."""
    out = [make_batch(T=10, B=4, obs_shape=(4,), A=ACTIONS, seed=s) for s in range(n)]
    if state_size:
        rng = np.random.default_rng(2)
        out = [dataclasses.replace(b, state_in=rng.standard_normal((4, state_size)))
               for b in out]  # fmt: skip
    return [frames(b) for b in out] if len(obs_shape) == 3 else out


def in_group(
    world: int, fn: Callable[[int, Collective], Any], bucket_bytes: int = BUCKET_BYTES
) -> list[Any]:
    """fn(rank, collective) on `world` threads that form one gloo group; their results."""
    store = dist.HashStore()  # type: ignore[attr-defined]
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            with one_torch_thread():
                collective = Collective.join(
                    Rendezvous("127.0.0.1", 0, world), rank, torch.device("cpu"),
                    local_host="127.0.0.1", store=store, timeout_seconds=60,
                    bucket_bytes=bucket_bytes,
                )  # fmt: skip
                results[rank] = fn(rank, collective)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results


def flat_state(learner: Learner) -> tuple[np.ndarray, np.ndarray]:
    """(weights, optimiser state) as float64 vectors."""
    weights = np.concatenate([p.detach().reshape(-1).numpy() for p in learner.params])
    opt = [
        v.detach().reshape(-1).double().numpy()
        for o in learner.optimizers
        for s in o.state_dict()["state"].values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.numel() > 1
    ]
    return weights, np.concatenate(opt)


def step_on_mean_of_halves(reference: Learner, steps: list[TrainBatch], half: int) -> None:
    """DDP's definition, on one learner: per batch, one step on the mean of the gradients of
    its first `half` columns and of the rest (clipped after the mean)."""
    step_on_mean_of_parts(reference, steps, [(0, half), (half, steps[0].num_columns)])


def step_on_mean_of_parts(
    reference: Learner, steps: list[TrainBatch], parts: list[tuple[int, int]]
) -> None:
    """DDP's definition for len(parts) learners: per batch, one step on the mean of the
    gradients of its column ranges `parts` (clipped after the mean)."""
    for batch in steps:
        grads = []
        for start, stop in parts:
            reference._backward_on(slice_columns(batch, start, stop), reference.coefficients())
            grads.append([p.grad.clone() for p in reference.params])  # type: ignore[union-attr]
        for i, p in enumerate(reference.params):
            p.grad = sum(g[i] for g in grads) / len(parts)  # type: ignore[assignment]
        reference._clip_gradients()
        reference._step()


@pytest.mark.parametrize("bucket_bytes", [BUCKET_BYTES, 1], ids=["buckets", "bucket-a-param"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_two_learners_on_halves_step_as_one_on_the_mean_gradient(
    kind: str, bucket_bytes: int
) -> None:
    model, obs_shape = MODELS[kind]
    spec = learner_spec(gradClip=1.0, **{"lr": 0.01})
    spec = spec.model_copy(update={"model": spec.model.model_validate(model)})

    def learner_of(rank: int) -> Learner:
        torch.manual_seed(100 + rank)  # different weights: join must give rank 0's to all
        return Learner(LearnerConfig.of(spec), obs_shape, ACTIONS, dtype=torch.float64)

    learners = [learner_of(0), learner_of(1)]  # torch's seed is global: not on the threads
    steps = batches(obs_shape, 3, learners[0].model.state_size)
    half = steps[0].num_columns // 2  # whole columns: an LSTM's sequences are never split

    def train(rank: int, collective: Collective) -> tuple[np.ndarray, np.ndarray]:
        learner = learners[rank]
        learner.join(collective)
        for batch in steps:
            part = slice_columns(batch, 0, half) if rank == 0 else slice_columns(
                batch, half, batch.num_columns
            )
            learner.learn_on_batch(part)
        return flat_state(learner)

    (w0, o0), (w1, o1) = in_group(2, train, bucket_bytes)
    np.testing.assert_array_equal(w0, w1)  # one set of weights, bit for bit
    np.testing.assert_array_equal(o0, o1)

    reference = learner_of(0)
    step_on_mean_of_halves(reference, steps, half)
    w, o = flat_state(reference)
    np.testing.assert_allclose(w0, w, rtol=0, atol=1e-6)
    np.testing.assert_allclose(o0, o, rtol=0, atol=1e-6)
    untrained = np.concatenate([p.detach().reshape(-1).numpy() for p in learner_of(0).params])
    assert not np.allclose(w, untrained)  # it did learn


def test_buckets_follow_backward_and_start_before_it_ends() -> None:
    """The buckets hold the parameters in reverse (backward's) order, never split one, and with
    several buckets the late layers' all-reduce is under way when backward returns."""
    spec = learner_spec(lr=0.01)
    spec = spec.model_copy(update={"model": spec.model.model_validate(MODELS["cnn"][0])})
    learners = [Learner(LearnerConfig.of(spec), (4, 84, 84), ACTIONS,
                        dtype=torch.float64) for _ in range(2)]  # fmt: skip
    sizes = [p.numel() * p.element_size() for p in learners[0].params]
    plan = plan_buckets(learners[0].params, 4096)
    assert sorted(i for bucket in plan for i in bucket) == list(range(len(sizes)))
    assert [i for bucket in plan for i in bucket] == list(reversed(range(len(sizes))))
    assert all(sum(sizes[i] for i in bucket) >= 4096 for bucket in plan[:-1])
    (batch,) = batches((4, 84, 84), 1)

    def started_during_backward(rank: int, collective: Collective) -> int:
        learner = learners[rank]
        learner.join(collective)
        assert learner.reducer is not None and len(learner.reducer.buckets) > 1
        learner._backward_on(batch, learner.coefficients())
        started = len(learner.reducer._started)
        learner._clip_gradients()
        learner._step()
        return started

    started = in_group(2, started_during_backward, bucket_bytes=4096)
    assert all(n >= 1 for n in started), started  # all but the last can start in backward
    # The gradient hooks hold their reducer weakly: a learner out of its group frees the group.
    reducer = weakref.ref(learners[0].reducer)  # type: ignore[arg-type]
    learners[0].reducer = learners[0].collective = None
    gc.collect()
    assert reducer() is None
    assert plan_buckets([], BUCKET_BYTES) == []


def test_three_learners_in_one_bucket_each_step_as_one_on_the_mean_gradient() -> None:
    """Three learners on uneven column ranges (1, 1 and 2 columns), a bucket per parameter:
    the mean over three, the stop flag in the last bucket of each step, weights equal on all."""
    spec = learner_spec(gradClip=1.0, lr=0.01)
    torch.manual_seed(11)
    learners = [Learner(LearnerConfig.of(spec), (4,), ACTIONS,
                        dtype=torch.float64) for _ in range(3)]  # fmt: skip
    steps = batches((4,), 3)
    parts = [(0, 1), (1, 2), (2, steps[0].num_columns)]

    def train(rank: int, collective: Collective) -> np.ndarray:
        learner = learners[rank]
        learner.join(collective)
        for batch in steps:
            learner.learn_on_batch(slice_columns(batch, *parts[rank]))
        return flat_state(learner)[0]

    w0, w1, w2 = in_group(3, train, bucket_bytes=1)
    np.testing.assert_array_equal(w0, w1)
    np.testing.assert_array_equal(w0, w2)
    torch.manual_seed(11)
    reference = Learner(LearnerConfig.of(spec), (4,), ACTIONS, dtype=torch.float64)
    step_on_mean_of_parts(reference, steps, parts)
    np.testing.assert_allclose(w0, flat_state(reference)[0], rtol=0, atol=1e-6)


def test_towers_inside_each_learner_sum_before_the_group_averages() -> None:
    """Two learners with two CPU towers each (learner.fakeDevices) equal one learner of two
    towers stepping on the mean of the two learners' summed tower gradients."""
    spec = learner_spec(lr=0.01, learner={"fakeDevices": 2})
    steps = batches((4,), 2)
    half = steps[0].num_columns // 2

    torch.manual_seed(7)
    learners = [MultiDeviceLearner(LearnerConfig.of(spec), (4,), ACTIONS,
                                   dtype=torch.float64) for _ in range(2)]  # fmt: skip

    def train(rank: int, collective: Collective) -> np.ndarray:
        learner = learners[rank]
        learner.join(collective)
        for batch in steps:
            cols = (0, half) if rank == 0 else (half, batch.num_columns)
            learner.learn_on_batch(slice_columns(batch, *cols))
        tower = np.concatenate([p.detach().reshape(-1).numpy()
                                for p in learner.towers[1].parameters()])  # fmt: skip
        np.testing.assert_array_equal(tower, flat_state(learner)[0])  # towers re-synced
        return flat_state(learner)[0]

    w0, w1 = in_group(2, train)
    np.testing.assert_array_equal(w0, w1)

    torch.manual_seed(7)
    reference = Learner(LearnerConfig.of(spec), (4,), ACTIONS, dtype=torch.float64)
    step_on_mean_of_halves(reference, steps, half)
    np.testing.assert_allclose(w0, flat_state(reference)[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("bucket_bytes", [BUCKET_BYTES, 1], ids=["buckets", "bucket-a-param"])
def test_a_stopping_learner_stops_its_peers_after_the_same_step(bucket_bytes: int) -> None:
    """Learner 1 stops between steps (`leave`) while learner 0 is in a step: the step is taken
    by neither, both end with the weights of before it, and neither waits on the other."""
    spec = learner_spec(lr=0.01)
    torch.manual_seed(3)
    learners = [Learner(LearnerConfig.of(spec), (4,), ACTIONS,
                        dtype=torch.float64) for _ in range(2)]  # fmt: skip
    (batch,) = batches((4,), 1)

    def train(rank: int, collective: Collective) -> tuple[int, bool]:
        learner = learners[rank]
        learner.join(collective)
        learner.learn_on_batch(batch)  # one step together
        if rank == 1:
            learner.leave_group()
            return learner.policy_version, collective.left
        with pytest.raises(GroupStopped):
            learner.learn_on_batch(batch)
        learner.leave_group()  # already left: no further all-reduce to wait on
        return learner.policy_version, collective.left

    assert in_group(2, train, bucket_bytes) == [(1, True), (1, True)]
    w0, w1 = (flat_state(learner)[0] for learner in learners)
    np.testing.assert_array_equal(w0, w1)
