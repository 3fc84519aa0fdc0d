"""The learners and learner threads on a real CUDA device.

CI has no GPU: these run where `torch.cuda.is_available()` (the `device` machine of a session that
has one; docs/testing.md says how) and are skipped elsewhere. Each checks the CUDA path against
the CPU learner the rest of the suite proves: same weights in, same update out.
"""

from __future__ import annotations

import dataclasses
import pickle
import queue
import time
from typing import Any

import numpy as np
import pytest
import torch

from impala_trainer.batches import TrainBatch
from impala_trainer.learners.learner_thread import LearnerThread
from impala_trainer.learners.multi_gpu_learner_thread import MultiGPULearnerThread
from impala_trainer.learners.process import LearnerProcess
from impala_trainer.learners.threads import make_learner_thread
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.learning.towers import MultiDeviceLearner
from impala_trainer.rundir.checkpoint import DriverState, load_checkpoint, save_checkpoint
from tests.support.jobs import make_spec
from tests.support.learner import learner_spec, make_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CNN: dict[str, Any] = {"model": {"type": "cnn"}}
CNN_OBS = (4, 84, 84)


def cnn_batch(T: int = 8, B: int = 4, seed: int = 0) -> TrainBatch:
    """A Pong-shaped batch: uint8 frames, as the rollout workers send them."""
    batch = make_batch(T=T, B=B, obs_shape=(1,), A=6, seed=seed)
    rng = np.random.default_rng(seed)
    frames = lambda *shape: rng.integers(0, 256, shape, dtype=np.uint8)  # noqa: E731
    return dataclasses.replace(
        batch,
        obs=frames(T, B, *CNN_OBS),
        final_obs=frames(len(batch.final_steps), *CNN_OBS),
        bootstrap_obs=frames(B, *CNN_OBS),
    )


def twin_learners(spec_cpu, spec_cuda, obs_shape, actions, cuda_cls=Learner, **kw):
    """A CPU learner and a CUDA learner holding the same float64 weights."""
    torch.manual_seed(0)
    cpu = Learner(LearnerConfig.of(spec_cpu), obs_shape, actions, dtype=torch.float64)
    if cuda_cls is Learner:
        cuda = Learner(LearnerConfig.of(spec_cuda), obs_shape, actions, device="cuda:0",
                       dtype=torch.float64)  # fmt: skip
    else:
        cuda = cuda_cls(LearnerConfig.of(spec_cuda), obs_shape, actions, dtype=torch.float64)
    cuda.set_weights(cpu.get_weights())
    return cpu, cuda


def assert_same_update(cpu: Learner, cuda: Learner, batches: list[TrainBatch], learn) -> None:
    for batch in batches:
        s_cpu = cpu.learn_on_batch(batch)
        s_cuda = learn(cuda, batch)
        for key in ("policy_loss", "vf_loss", "entropy", "total_loss", "grad_gnorm"):
            assert s_cuda[key] == pytest.approx(s_cpu[key], rel=1e-7, abs=1e-9), key
        for p_cpu, p_cuda in zip(cpu.model.parameters(), cuda.model.parameters(), strict=True):
            assert p_cuda.device.type == "cuda"
            torch.testing.assert_close(p_cuda.detach().cpu(), p_cpu.detach(), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize(
    "extra,obs_shape,actions,make",
    [
        ({}, (4,), 2, lambda s: make_batch(T=10, B=6, seed=s)),
        (CNN, CNN_OBS, 6, lambda s: cnn_batch(seed=s)),
    ],
    ids=["mlp", "cnn-uint8"],
)
def test_a_cuda_learner_makes_the_cpu_learners_update(extra, obs_shape, actions, make) -> None:
    spec = make_spec(extra or {"model": {"hidden": [32, 32]}})
    cpu, cuda = twin_learners(spec, spec, obs_shape, actions)
    assert_same_update(cpu, cuda, [make(s) for s in range(3)], Learner.learn_on_batch)
    assert cuda.policy_version == 3


def test_kept_passes_on_cuda_make_the_cpu_learners_updates() -> None:
    """numSgdIter passes over one batch: between them the CUDA learner keeps the batch's device
    copy and its prepared frames (float, channels-last, on the GPU), and still makes the CPU
    learner's updates, which prepares every pass afresh."""
    spec = make_spec(CNN, training={"numSgdIter": 3})
    cpu, cuda = twin_learners(spec, spec, CNN_OBS, 6)
    keeps = iter([True, True, False] * 2)

    def learn(learner: Learner, batch: TrainBatch) -> dict[str, float]:
        keep = next(keeps)
        stats = learner.learn_on_batch(batch, keep=keep)
        if keep:
            ((_, tensors, inputs),) = learner._kept.values()
            assert tensors.obs.device.type == "cuda" and inputs.device.type == "cuda"
            assert inputs.is_contiguous(memory_format=torch.channels_last)
        else:
            assert not learner._kept
        return stats

    batches = [cnn_batch(seed=0)] * 3 + [cnn_batch(seed=1)] * 3
    assert_same_update(cpu, cuda, batches, learn)


def test_one_gpu_with_two_tower_stacks_matches_the_cpu_learner() -> None:
    """gpus 1 + numMultiGpuTowerStacks 2: MultiDeviceLearner, batches loaded on a side stream."""
    cpu_spec = learner_spec(numMultiGpuTowerStacks=2)
    gpu_spec = learner_spec(learner={"gpus": 1}, numMultiGpuTowerStacks=2)
    cpu, cuda = twin_learners(cpu_spec, gpu_spec, (4,), 2, cuda_cls=MultiDeviceLearner)
    assert [d.type for d in cuda.devices] == ["cuda"]

    def learn(learner: MultiDeviceLearner, batch: TrainBatch) -> dict[str, float]:
        slot = learner.policy_version % 2
        assert learner.load_batch_into_buffer(batch, slot) == batch.env_steps
        return learner.learn_on_loaded_batch(slot)

    assert_same_update(cpu, cuda, [make_batch(T=6, B=8, seed=s) for s in range(4)], learn)


def test_make_learner_thread_puts_one_gpu_jobs_on_cuda() -> None:
    plain = make_learner_thread(LearnerConfig.of(learner_spec(learner={"gpus": 1})), (4,), 2)
    stacked = make_learner_thread(
        LearnerConfig.of(learner_spec(learner={"gpus": 1}, numMultiGpuTowerStacks=2)), (4,), 2
    )
    assert isinstance(plain, LearnerThread) and plain.learner.device.type == "cuda"
    assert isinstance(stacked, MultiGPULearnerThread)
    assert all(p.device.type == "cuda" for p in stacked.learner.model.parameters())


@pytest.mark.parametrize("stacks", [1, 2], ids=["learner-thread", "multi-gpu-thread"])
def test_the_learner_threads_train_every_batch_on_cuda(stacks: int) -> None:
    spec = learner_spec(learner={"gpus": 1}, numMultiGpuTowerStacks=stacks, numSgdIter=2)
    if stacks > 1:
        spec.training.num_gpu_loader_threads = 2
    thread = make_learner_thread(LearnerConfig.of(spec), (4,), 2)
    thread.start()
    batches = [make_batch(T=6, B=4, seed=i) for i in range(6)]
    for b in batches:
        thread.inqueue.put(b, timeout=10)
    out = [thread.outqueue.get(timeout=60) for _ in range(12)]
    stats = thread.stats()
    thread.stop()
    thread.join(timeout=10)
    assert not thread.is_alive() and thread.error is None
    assert sum(steps for steps, _ in out) == sum(b.env_steps for b in batches)
    assert thread.learner.policy_version == 12
    assert all(np.isfinite(s["total_loss"]) for _, s in out)
    assert stats["learner_load_time_ms"] >= 0.0
    with pytest.raises(queue.Empty):
        thread.outqueue.get_nowait()


@pytest.mark.parametrize("stacks", [1, 2], ids=["learner-thread", "multi-gpu-thread"])
def test_a_learner_process_trains_on_cuda(stacks: int) -> None:
    """learner.process: separate with a GPU: CUDA initialised in the spawned process, the frames
    copied to the device from the shared-memory slots they came in (learners/batch_slots.py)."""
    training = {"numMultiGpuTowerStacks": stacks, "numSgdIter": 2}
    spec = make_spec(CNN, training=training, learner={"gpus": 1})
    process = LearnerProcess(LearnerConfig.of(spec), CNN_OBS, 6, seed=0, intra_op_threads=1)
    try:
        assert process.learner.device.startswith("cuda")
        process.start()
        # An even number: with two stacks the passes alternate between them (RLlib's
        # MinibatchBuffer), so a third batch's second pass waits for a fourth batch (a lent H200
        # ran 3 batches here and got 5 updates, not 6).
        batches = [cnn_batch(seed=i) for i in range(4)]
        for b in batches:
            process.inqueue.put(b, timeout=10)
        got: list[tuple[int, dict[str, float]]] = []
        deadline = time.monotonic() + 120
        while len(got) < 8 and time.monotonic() < deadline:
            try:
                got.append(process.outqueue.get_nowait())
            except queue.Empty:
                time.sleep(0.01)
        assert sum(steps for steps, _ in got) == sum(b.env_steps for b in batches)
        assert all(np.isfinite(s["total_loss"]) for _, s in got)
        assert process.learner.policy_version == 8 and process.error is None
        assert process.inqueue.flat is not None  # the frames went through the slots
    finally:
        process.stop()
        process.join(timeout=60)
    assert process.state_dict()["policy_version"] == 8


def test_checkpoints_move_between_a_gpu_and_a_cpu_learner(tmp_path) -> None:
    """Rollout workers, `impalajob evaluate` and a CPU resume read what a GPU learner wrote, and a
    GPU learner resumes from a CPU run's checkpoint (optimiser state included)."""
    cuda = Learner(LearnerConfig.of(learner_spec(learner={"gpus": 1})), (4,), 2, device="cuda:0")
    cuda.learn_on_batch(make_batch())
    ckpt = save_checkpoint(tmp_path / "gpu", cuda.state_dict(), DriverState(), keep=2)
    cpu = Learner(LearnerConfig.of(learner_spec()), (4,), 2)
    cpu.load_state_dict(load_checkpoint(ckpt)[0])
    assert cpu.policy_version == 1
    for k, v in cuda.get_weights().items():
        np.testing.assert_array_equal(cpu.get_weights()[k], v)
    cpu.learn_on_batch(make_batch(seed=1))

    ckpt = save_checkpoint(tmp_path / "cpu", cpu.state_dict(), DriverState(), keep=2)
    again = Learner(LearnerConfig.of(learner_spec(learner={"gpus": 1})), (4,), 2, device="cuda:0")
    again.load_state_dict(load_checkpoint(ckpt)[0])
    stats = again.learn_on_batch(make_batch(seed=2))  # Adam's moments were moved onto the GPU
    assert again.policy_version == 3 and np.isfinite(stats["total_loss"])


def test_a_cuda_learners_pickled_broadcast_holds_its_weights() -> None:
    """The driver broadcasts `pickled_weights()` to rollout actors that have no GPU: host arrays."""
    cuda = Learner(LearnerConfig.of(learner_spec(learner={"gpus": 1})), (4,), 2, device="cuda:0")
    cuda.learn_on_batch(make_batch())
    sent = pickle.loads(cuda.pickled_weights())
    weights = cuda.get_weights()
    assert sent.keys() == weights.keys()
    for k, v in weights.items():
        assert isinstance(sent[k], np.ndarray)
        np.testing.assert_array_equal(sent[k], v)
    assert cuda.weights_nbytes() == sum(v.nbytes for v in weights.values())


def test_auto_precision_on_cuda_is_bfloat16_and_tracks_float32() -> None:
    """`learner.precision: auto` on a GPU with native bf16 (Ampere and later) autocasts the
    CNN's forward and backward; the first update agrees with float32 to bf16's precision and the
    weights, gradients and Adam's moments stay float32 on the device."""
    if not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip("this GPU has no native bfloat16")
    learners = []
    for precision in ("float32", "auto"):
        torch.manual_seed(0)
        spec = make_spec(CNN, learner={"gpus": 1, "precision": precision})
        learners.append(Learner(LearnerConfig.of(spec), CNN_OBS, 6, device="cuda:0"))
    full, mixed = learners
    assert full.autocast_dtype is None and mixed.autocast_dtype is torch.bfloat16
    batch = cnn_batch()
    a, b = full.learn_on_batch(batch), mixed.learn_on_batch(batch)
    for key in ("total_loss", "vf_loss", "policy_loss", "grad_gnorm"):
        assert b[key] == pytest.approx(a[key], rel=0.05, abs=0.05), key
    assert b["entropy"] == pytest.approx(a["entropy"], rel=0.01)
    for p in mixed.model.parameters():
        assert p.device.type == "cuda" and p.dtype == torch.float32
        assert p.grad is not None and p.grad.dtype == torch.float32
    for state in mixed.optimizers[0].state.values():
        assert all(v.dtype == torch.float32 for v in state.values() if v.is_floating_point())


def test_a_cuda_learner_in_an_nccl_group_of_one_makes_the_plain_learners_update() -> None:
    """learner.replicas on GPUs: a CUDA learner's group is NCCL over the rank-0 TCPStore, as
    each learner pod builds it. With one rank the broadcast and the gradients' average change
    nothing, so its update is the plain CUDA learner's; a stop then leaves the group at once."""
    from harness.net import free_port
    from impala_trainer.learning.collective import Collective, GroupStopped, Rendezvous

    spec = learner_spec(learner={"gpus": 1})
    torch.manual_seed(0)
    plain = Learner(LearnerConfig.of(spec), (4,), 3, device="cuda:0")
    torch.manual_seed(0)
    grouped = Learner(LearnerConfig.of(spec), (4,), 3, device="cuda:0")
    collective = Collective.join(
        Rendezvous("127.0.0.1", free_port(), 1), 0, torch.device("cuda:0"),
        local_host="127.0.0.1", timeout_seconds=60,
    )  # fmt: skip
    assert type(collective.group).__name__ == "ProcessGroupNCCL"
    grouped.join(collective)
    for seed in range(3):
        plain.learn_on_batch(make_batch(seed=seed))
        grouped.learn_on_batch(make_batch(seed=seed))
    for k, v in plain.get_weights().items():
        np.testing.assert_allclose(grouped.get_weights()[k], v, rtol=1e-6, atol=1e-7)
    collective.stopping.set()
    with pytest.raises(GroupStopped):
        grouped.learn_on_batch(make_batch(seed=9))
    assert collective.left and grouped.policy_version == 3
