"""MultiGPULearnerThread and MultiDeviceLearner on fake CPU devices."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from impala_api.spec import ImpalaJobSpec
from impala_trainer.learners.learner_thread import POLICY_LAG
from impala_trainer.learners.multi_gpu_learner_thread import MultiGPULearnerThread
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.learning.losses import model_inputs
from impala_trainer.learning.towers import MultiDeviceLearner
from tests.support.learner import learner_spec, make_batch, one_torch_thread


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    """Tiny tensors: intra-op threads only add contention on a shared machine."""
    with one_torch_thread():
        yield


def fake_spec(devices: int, **training: Any) -> ImpalaJobSpec:
    return learner_spec(learner={"fakeDevices": devices}, **training)


def test_processes_every_batch_with_two_towers_two_stacks_two_loaders() -> None:
    spec = fake_spec(2, numMultiGpuTowerStacks=2, numGpuLoaderThreads=2, numSgdIter=2)
    learner = MultiDeviceLearner(LearnerConfig.of(spec), (4,), 2)
    thread = MultiGPULearnerThread(
        learner,
        num_sgd_iter=2,
        learner_queue_size=8,
        learner_queue_timeout=30,
        num_multi_gpu_tower_stacks=2,
        num_gpu_loader_threads=2,
    )
    thread.start()
    batches = [make_batch(T=6, B=4, seed=i) for i in range(6)]
    for b in batches:
        thread.inqueue.put(b)
    out = [thread.outqueue.get(timeout=20) for _ in range(12)]
    stats = thread.stats()
    thread.stop()
    thread.join(timeout=5)
    assert not thread.is_alive() and thread.error is None
    assert all(not t.is_alive() for t in thread.loader_threads)
    assert sum(steps for steps, _ in out) == sum(b.env_steps for b in batches)
    assert sum(1 for steps, _ in out if steps) == 6  # steps reported on first passes only
    # Every batch was sampled by policy 0: a first pass's lag is the updates made before it.
    lags = [s[POLICY_LAG] for steps, s in out if steps]
    assert lags == sorted(lags) and lags[0] in (0.0, 1.0) and lags[-1] <= 11.0
    assert all(POLICY_LAG not in s for steps, s in out if not steps)
    assert learner.policy_version == 12
    assert stats["learner_load_time_ms"] > 0.0
    # every stack went back to idle
    assert thread.idle_tower_stacks.qsize() == 2


def test_starvation_timeout_in_multi_device_mode() -> None:
    learner = MultiDeviceLearner(LearnerConfig.of(fake_spec(2)), (4,), 2)
    thread = MultiGPULearnerThread(learner, learner_queue_timeout=0.3, num_gpu_loader_threads=2)
    thread.start()
    thread.join(timeout=5)
    assert "learner starved" in str(thread.error)


def clone_learners(devices: int, dtype: torch.dtype, **training) -> tuple[Learner, Learner]:
    torch.manual_seed(0)
    single = Learner(LearnerConfig.of(learner_spec(**training)), (4,), 2, dtype=dtype)
    multi = MultiDeviceLearner(LearnerConfig.of(fake_spec(devices, **training)), (4,), 2,
                               dtype=dtype)  # fmt: skip
    multi.set_weights(single.get_weights())
    return single, multi


@pytest.mark.parametrize(
    "devices,columns,training",
    [
        (2, 8, {"gradClip": None}),
        (2, 8, {"gradClip": 0.05}),  # clipping applies to the averaged gradient
        (3, 9, {"optimizer": {"type": "rmsprop", "momentum": 0.5}, "gradClip": None}),
        (2, 5, {"gradClip": None}),  # uneven shards: 2 and 3 columns, weighted
        (3, 7, {"separateVfOptimizer": True, "lrVf": 1e-3}),
    ],
)
def test_fake_towers_match_one_device(devices: int, columns: int, training: dict) -> None:
    single, multi = clone_learners(devices, torch.float64, **training)
    for step in range(3):
        batch = make_batch(T=6, B=columns, seed=step)
        s_stats = single.learn_on_batch(batch)
        assert multi.load_batch_into_buffer(batch, 0) == batch.env_steps
        m_stats = multi.learn_on_loaded_batch(0)
        for ps, pm in zip(single.model.parameters(), multi.model.parameters(), strict=True):
            torch.testing.assert_close(pm.grad, ps.grad, rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(pm, ps, rtol=1e-9, atol=1e-12)
        for key in ("policy_loss", "vf_loss", "entropy", "total_loss", "grad_gnorm"):
            assert m_stats[key] == pytest.approx(s_stats[key], rel=1e-9)
    # the other towers were re-synced to the master
    for tower in multi.towers[1:]:
        for pt, pm in zip(tower.parameters(), multi.model.parameters(), strict=True):
            assert torch.equal(pt, pm)
    assert multi.policy_version == single.policy_version == 3


def test_towers_do_not_simply_see_the_whole_batch() -> None:
    """Guards the equivalence test: each tower's own gradient differs from the batch's."""
    single, multi = clone_learners(2, torch.float64, gradClip=None)
    batch = make_batch(T=6, B=8, seed=0)
    single.learn_on_batch(batch)
    multi.load_batch_into_buffer(batch, 0)
    shards = multi._stacks[0]
    assert [round(s.share, 3) for s in shards] == [0.5, 0.5]
    assert [s.tensors.actions.shape[1] for s in shards] == [4, 4]
    # Each shard's observations are prepared at load time, once for all its passes.
    for s in shards:
        torch.testing.assert_close(s.inputs, model_inputs(multi.towers[s.tower], s.tensors))


def test_set_weights_and_checkpoint_sync_every_tower() -> None:
    single, multi = clone_learners(3, torch.float32)
    single.learn_on_batch(make_batch())
    multi.load_state_dict(single.state_dict())
    assert multi.policy_version == 1
    obs = torch.randn(4, 4)
    expected = single.model(obs)
    for tower in multi.towers:
        torch.testing.assert_close(tower(obs), expected)


def test_learn_on_batch_convenience_and_buffer_bounds() -> None:
    _, multi = clone_learners(2, torch.float32)
    stats = multi.learn_on_batch(make_batch())
    assert stats["grad_gnorm"] > 0 and multi.policy_version == 1
    with pytest.raises(IndexError):
        multi.load_batch_into_buffer(make_batch(), 5)
