"""Train batches through shared-memory slots (learners/batch_slots.py): the bytes arrive intact, a
slot is free only once the learner dropped every view of it, and a full set of slots reads as a
full learner queue. Both ends in this process; test_learner_process.py crosses a real process."""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import queue
import threading

import numpy as np
import pytest
import torch

from impala_trainer.batches import TrainBatch
from impala_trainer.learners.batch_slots import MIN_SLOT_BYTES, SlotQueue, SlotReader, slot_count
from impala_trainer.learners.threads import batches_held_by_learner
from impala_trainer.learning.learner import LearnerConfig
from tests.support.learner import learner_spec, make_batch

FRAMES = (4, 84, 84)


def frames_batch(
    seed: int = 0, T: int = 5, B: int = 3, truncations: int | None = None
) -> TrainBatch:
    """Pong-shaped: uint8 frames (large), small per-step fields, episode lists."""
    batch = make_batch(T=T, B=B, obs_shape=(1,), A=6, seed=seed)
    rng = np.random.default_rng(seed)
    final_steps = batch.final_steps
    if truncations is not None:
        final_steps = np.array([(t % T, t % B) for t in range(truncations)], np.int64)
    return dataclasses.replace(
        batch,
        obs=rng.integers(0, 256, (T, B, *FRAMES), dtype=np.uint8),
        final_obs=rng.integers(0, 256, (len(final_steps), *FRAMES), dtype=np.uint8),
        final_steps=final_steps,
        bootstrap_obs=rng.integers(0, 256, (B, *FRAMES), dtype=np.uint8),
        episode_returns=[1.0, -21.0],
        episode_lengths=[800, 764],
        worker_ids=["w0"],
    )


def pair(count: int = 3, maxsize: int = 8) -> tuple[SlotQueue, SlotReader]:
    ctx = multiprocessing.get_context("spawn")
    sender = SlotQueue(ctx, maxsize, count)
    return sender, SlotReader(*sender.reader_args())


def assert_same(got: TrainBatch, sent: TrainBatch) -> None:
    for field in dataclasses.fields(sent):
        a, b = getattr(got, field.name), getattr(sent, field.name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, field.name
            np.testing.assert_array_equal(a, b, err_msg=field.name)
        else:
            assert a == b, field.name


def taken(sender: SlotQueue) -> int:
    return sum(sender.states[i] for i in range(sender.count))


def test_a_batch_arrives_intact_its_large_arrays_as_views_of_a_slot() -> None:
    sender, reader = pair()
    sent = frames_batch(seed=1)
    sender.put(sent)
    got = reader.get(timeout=10)
    assert_same(got, sent)
    assert sender.flat is not None and reader.flat is not None
    for name in ("obs", "bootstrap_obs"):
        array = getattr(got, name)
        # No copy on the learner's side: the array lives in the shared buffer, and is writable
        # (torch.from_numpy takes it without a warning).
        assert not np.shares_memory(array, getattr(sent, name))
        assert array.flags.writeable and array.flags.c_contiguous
        start = reader.flat.data_ptr()
        assert start <= array.ctypes.data < start + sender.count * sender.slot_bytes
    assert got.actions.nbytes < MIN_SLOT_BYTES  # small fields ride in the message


def test_a_slot_is_free_only_when_every_view_of_it_is_gone() -> None:
    sender, reader = pair(count=2)
    sender.put(frames_batch(seed=0))
    sender.put(frames_batch(seed=1))
    assert taken(sender) == 2
    with pytest.raises(queue.Full):  # what the driver counts as a full learner queue
        sender.put_nowait(frames_batch(seed=2))
    with pytest.raises(queue.Full):
        sender.put(frames_batch(seed=2), timeout=0.05)
    first = reader.get(timeout=10)
    second = reader.get(timeout=10)
    kept = torch.from_numpy(first.obs[1:3])  # the learner's tensors of a batch outlive it
    del first
    gc.collect()
    assert taken(sender) == 2
    del kept
    assert taken(sender) == 1
    sender.put_nowait(frames_batch(seed=2))  # room again
    third = reader.get(timeout=10)
    assert_same(third, frames_batch(seed=2))
    assert_same(second, frames_batch(seed=1))  # its slot was not written over


def test_a_field_too_large_for_a_slot_goes_in_the_message() -> None:
    sender, reader = pair()
    sender.put(frames_batch(seed=0, truncations=0))  # sizes the slots
    larger = frames_batch(seed=1, truncations=12)  # 12 final frames more than the slot holds
    sender.put(larger)
    reader.get(timeout=10)
    got = reader.get(timeout=10)
    assert_same(got, larger)
    assert sender.oversized_fields == 1
    start = reader.flat.data_ptr()
    assert start <= got.obs.ctypes.data < start + sender.count * sender.slot_bytes


def test_a_batch_of_small_arrays_goes_whole_and_makes_no_slots() -> None:
    sender, reader = pair()
    sent = make_batch(seed=0)  # CartPole-sized
    sender.put(sent)
    assert_same(reader.get(timeout=10), sent)
    assert sender.flat is None and taken(sender) == 0


def test_the_queue_bound_holds_with_free_slots() -> None:
    sender, reader = pair(count=4, maxsize=1)
    sender.put_nowait(frames_batch(seed=0))
    with pytest.raises(queue.Full):
        sender.put_nowait(frames_batch(seed=1))
    assert taken(sender) == 1  # the refused batch gave its slot back
    assert sender.qsize() == 1
    assert_same(reader.get(timeout=10), frames_batch(seed=0))
    sender.put_nowait(frames_batch(seed=1))
    assert_same(reader.get(timeout=10), frames_batch(seed=1))


def test_slot_count_covers_a_full_queue_and_what_the_learner_holds() -> None:
    assert slot_count(learner_queue_size=8, held_by_learner=1) == 11
    # The learner thread holds its minibatch buffer's batches; the multi-GPU thread one per
    # loader thread waiting for a stack and one per loaded stack.
    assert batches_held_by_learner(LearnerConfig.of(learner_spec(minibatchBufferSize=4))) == 4
    multi = learner_spec(
        learner={"fakeDevices": 2}, numMultiGpuTowerStacks=2, numGpuLoaderThreads=3
    )
    assert batches_held_by_learner(LearnerConfig.of(multi)) == 5


def test_a_batch_read_before_the_buffer_it_lives_in_waits_for_it() -> None:
    """The multi-GPU thread's loaders get concurrently, and a multiprocessing queue unpickles
    after it lets the next reader in: the second batch can be in one loader's hands while the
    first, which carries the buffer, is still unpickling in another's."""
    sender, _ = pair()
    messages: list[tuple[object, ...]] = []

    class Capture:
        def put(self, message: tuple[object, ...], block: bool, timeout: float | None) -> None:
            messages.append(message)

    sender.queue = Capture()
    sender.put(frames_batch(seed=0))
    sender.put(frames_batch(seed=1))

    class Reversed:  # the second message first
        def get(self, block: bool, timeout: float | None) -> tuple[object, ...]:
            return messages.pop()

    reader = SlotReader(Reversed(), sender.states, sender.free)
    got: list[TrainBatch] = []
    loader = threading.Thread(target=lambda: got.append(reader.get()))
    loader.start()
    loader.join(timeout=0.2)
    assert loader.is_alive() and not got  # waiting for the buffer, not failing on it
    first = reader.get()
    loader.join(timeout=10)
    assert_same(first, frames_batch(seed=0))
    assert_same(got[0], frames_batch(seed=1))
