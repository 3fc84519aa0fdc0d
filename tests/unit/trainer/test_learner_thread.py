"""LearnerThread: SGD passes, env-step accounting, starvation timeout, queue-full, stats."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from impala_trainer.batches import TrainBatch
from impala_trainer.learners.learner_thread import (
    POLICY_LAG,
    LearnerStarvedError,
    LearnerThread,
)
from impala_trainer.learners.minibatch_buffer import MinibatchBuffer
from impala_trainer.learners.multi_gpu_learner_thread import MultiGPULearnerThread
from impala_trainer.learners.threads import make_learner_thread
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.learning.towers import MultiDeviceLearner
from tests.support.jobs import make_job
from tests.support.learner import learner_spec, make_batch, one_torch_thread


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    """Tiny tensors: intra-op threads only add contention on a shared machine."""
    with one_torch_thread():
        yield


class CountingLearner:
    """Records which batches learn_on_batch saw, in order."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.seen: list[int] = []
        self.kept: list[bool] = []
        self.fail_after = fail_after
        self.policy_version = 0

    def learn_on_batch(self, batch: TrainBatch, keep: bool = False) -> dict[str, float]:
        if self.fail_after is not None and len(self.seen) >= self.fail_after:
            raise FloatingPointError("loss is nan")
        self.seen.append(id(batch))
        self.kept.append(keep)
        self.policy_version += 1
        return {"total_loss": float(len(self.seen))}


def drain(thread: LearnerThread, n: int, timeout: float = 10.0) -> list[tuple[int, dict]]:
    return [thread.outqueue.get(timeout=timeout) for _ in range(n)]


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll `condition` until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def stop(thread: LearnerThread) -> None:
    thread.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_each_batch_is_replayed_num_sgd_iter_times_with_steps_counted_once() -> None:
    learner = CountingLearner()
    thread = LearnerThread(
        learner, 1, num_sgd_iter=3, learner_queue_size=8, learner_queue_timeout=30
    )
    batches = [make_batch(T=5, B=2 + i) for i in range(3)]
    thread.start()
    for b in batches:
        thread.inqueue.put(b)
    out = drain(thread, 9)
    stop(thread)
    assert learner.seen == [id(b) for b in batches for _ in range(3)]
    # The learner keeps a batch's tensors for its next pass, and lets them go on its last.
    assert learner.kept == [True, True, False] * 3
    assert [steps for steps, _ in out] == [10, 0, 0, 15, 0, 0, 20, 0, 0]
    assert [s["total_loss"] for _, s in out] == list(range(1, 10))
    assert thread.num_steps == 9 and thread.error is None


def test_a_batchs_first_update_reports_its_policy_lag_with_the_queue_wait() -> None:
    # Three batches sampled by policy 0 (columns by versions 0 and 2 for the last), queued
    # together: each waited while the learner made numSgdIter updates on the ones before it,
    # which the lag counts (the IMPALA paper's policy lag, at the update).
    learner = CountingLearner()
    thread = LearnerThread(
        learner, 1, num_sgd_iter=2, learner_queue_size=8, learner_queue_timeout=30
    )
    batches = [make_batch(T=3, B=2, seed=i) for i in range(3)]
    batches[2].policy_versions[:] = [0, 2]
    for b in batches:
        thread.inqueue.put(b)
    thread.start()
    out = drain(thread, 6)
    stop(thread)
    assert [s.get(POLICY_LAG) for _, s in out] == [0.0, None, 2.0, None, 3.0, None]
    assert POLICY_LAG not in thread.learner_info  # the stats of the update itself are unchanged


def test_minibatch_buffer_interleaves_slots() -> None:
    q: queue.Queue[str] = queue.Queue()
    for item in "AB":
        q.put(item)
    buf = MinibatchBuffer(q, size=2, timeout=1.0, num_passes=2)
    got = [buf.get() for _ in range(4)]
    assert [g.item for g in got] == ["A", "B", "A", "B"]
    assert [g.first_pass for g in got] == [True, True, False, False]
    assert [g.released for g in got] == [False, False, True, True]
    with pytest.raises(queue.Empty):
        buf.get(timeout=0.01)


def test_starvation_records_a_clear_error_and_stops() -> None:
    thread = LearnerThread(CountingLearner(), 1, 1, learner_queue_size=4, learner_queue_timeout=0.3)
    thread.start()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert isinstance(thread.error, LearnerStarvedError)
    message = str(thread.error)
    assert "learner starved: no train batch for 0.3 s (learnerQueueTimeout)" in message
    assert "rollout workers alive" in message


def test_stop_is_prompt_and_not_an_error() -> None:
    thread = LearnerThread(CountingLearner(), 1, 1, learner_queue_size=4, learner_queue_timeout=300)
    thread.start()
    time.sleep(0.05)
    start = time.monotonic()
    stop(thread)
    assert time.monotonic() - start < 2.0
    assert thread.error is None


def test_learner_exception_is_recorded() -> None:
    thread = LearnerThread(CountingLearner(fail_after=1), 1, 1, 4, 30)
    thread.start()
    thread.inqueue.put(make_batch())
    thread.inqueue.put(make_batch())
    thread.join(timeout=5)
    assert isinstance(thread.error, FloatingPointError)
    assert thread.outqueue.qsize() == 1


@pytest.mark.parametrize("learner", [{}, {"fakeDevices": 2}], ids=["plain", "multi-device"])
def test_the_inqueue_holds_learner_queue_size_batches_and_stats_report_its_fill(
    learner: dict[str, int],
) -> None:
    # The bound is what makes the driver's put_nowait fail; the driver counting those failures
    # as num_times_learner_queue_full (once per waiting batch) is tested in test_driver_sampling.py.
    config = LearnerConfig.of(learner_spec(learnerQueueSize=3, learner=learner))
    thread = make_learner_thread(config, (4,), 2)
    assert thread.inqueue.maxsize == 3
    for _ in range(3):
        thread.inqueue.put_nowait(make_batch())
    assert thread.inqueue.full()
    stats = thread.stats()
    assert stats["learner_queue_capacity"] == 3.0
    assert stats["learner_queue_size_now"] == 3.0
    assert not thread.is_alive()  # nothing consumed: the thread was never started


def test_stats_keys_and_values() -> None:
    thread = LearnerThread(CountingLearner(), 1, 1, learner_queue_size=4, learner_queue_timeout=30)
    thread.start()
    for _ in range(3):
        thread.inqueue.put(make_batch())
    drain(thread, 3)
    # With no batch left the thread waits, and a wait in progress counts as idle time, so the
    # idle fraction climbs past the busy share of the three updates.
    wait_until(lambda: thread.stats()["learner_idle_fraction"] > 0.5)
    stats = thread.stats()
    stop(thread)
    assert set(stats) == {
        "learner_dequeue_time_ms",
        "learner_grad_time_ms",
        "learner_load_time_ms",
        "learner_load_wait_time_ms",
        "learner_queue_size_mean",
        "learner_queue_size_max",
        "learner_queue_size_now",
        "learner_queue_capacity",
        "learner_idle_fraction",
        "num_learner_updates",
    }
    assert stats["num_learner_updates"] == 3.0
    assert 0.5 < stats["learner_idle_fraction"] <= 1.0
    assert stats["learner_dequeue_time_ms"] > 0.0
    result = thread.add_learner_metrics({"info": {}})
    assert result["info"]["learner"] == {"total_loss": 3.0}
    assert set(result["info"]["timing_breakdown"]) == {
        "learner_dequeue_time_ms",
        "learner_grad_time_ms",
        "learner_load_time_ms",
        "learner_load_wait_time_ms",
    }


def test_with_a_real_learner() -> None:
    learner = Learner(LearnerConfig.of(learner_spec()), (4,), 2)
    thread = LearnerThread(learner, 1, 2, 4, 30)
    thread.start()
    thread.inqueue.put(make_batch(T=8, B=3))
    out = drain(thread, 2)
    stop(thread)
    assert [steps for steps, _ in out] == [24, 0]
    assert learner.policy_version == 2
    assert {"policy_loss", "vf_loss", "grad_gnorm"} <= set(out[0][1])


def test_make_learner_thread_picks_by_devices() -> None:
    plain = make_learner_thread(LearnerConfig.of(learner_spec()), (4,), 2)
    assert type(plain) is LearnerThread and type(plain.learner) is Learner
    multi = make_learner_thread(LearnerConfig.of(learner_spec(learner={"fakeDevices": 2})), (4,), 2)
    assert isinstance(multi, MultiGPULearnerThread)
    assert isinstance(multi.learner, MultiDeviceLearner) and len(multi.learner.towers) == 2
    assert threading.active_count() >= 1  # nothing started until .start()
    assert not multi.is_alive()


def test_the_learner_thread_computes_with_the_threads_the_main_thread_gives_up() -> None:
    import torch

    from impala_trainer.learners.threads import make_learner_thread

    job = make_job("threads", env={"id": "CartPole-v1"}, stop={"timesteps": 1000})
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        thread = make_learner_thread(LearnerConfig.of(job.spec), (4,), 2)
        assert torch.get_num_threads() == 1  # the calling thread: no OpenMP team of its own
        assert thread.intra_op_threads == 2
        seen: list[int] = []

        def step() -> None:
            seen.append(torch.get_num_threads())
            thread.stop()

        thread.step = step  # type: ignore[method-assign]
        thread.start()
        thread.join(timeout=10)
        assert seen == [2]
        # A second learner in the same process gets the same count, not the main thread's 1.
        assert make_learner_thread(LearnerConfig.of(job.spec), (4,), 2).intra_op_threads == 2
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
