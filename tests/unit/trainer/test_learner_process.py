"""The learner thread in a process of its own (learner.process: separate), through a real process
forked from the forkserver: updates, weights and state come back; the inqueue keeps its bound; a
checkpoint loads before the start; starvation and a killed process reach the driver as clear
errors."""

from __future__ import annotations

import logging
import os
import queue
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch

from impala_trainer.learners import forkserver
from impala_trainer.learners.learner_thread import LearnerStarvedError
from impala_trainer.learners.process import LearnerProcess, LearnerProcessError
from impala_trainer.learning.learner import Learner, LearnerConfig
from tests.support.jobs import make_spec
from tests.support.learner import learner_spec, make_batch, one_torch_thread

SEED = 3


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _process(obs_shape: tuple[int, ...] = (4,), **training: Any) -> LearnerProcess:
    return LearnerProcess(LearnerConfig.of(learner_spec(**training)), obs_shape, 2, SEED,
                          intra_op_threads=1)  # fmt: skip


def _wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _updates(process: LearnerProcess, n: int) -> list[tuple[int, dict[str, float]]]:
    out: list[tuple[int, dict[str, float]]] = []

    def more() -> bool:
        while True:
            try:
                out.append(process.outqueue.get_nowait())
            except queue.Empty:
                return len(out) >= n

    _wait_until(more)
    return out


def _close(process: LearnerProcess) -> None:
    process.stop()
    process.join(timeout=30)
    assert not process.is_alive()


@pytest.mark.parametrize(
    "obs_shape",
    # Small batches go pickled through the queue; observations of 16 KiB and more go through
    # shared-memory slots (learners/batch_slots.py).
    [(4,), (512,)],
    ids=["pickled", "slots"],
)
def test_updates_weights_and_state_come_back_as_from_a_learner_in_the_driver(
    obs_shape: tuple[int, ...],
) -> None:
    batches = [make_batch(obs_shape=obs_shape, seed=i) for i in range(3)]
    # A rate that falls with the env steps trained: equal weights below also mean the process
    # kept the schedules' clock as the driver does.
    training = {"numSgdIter": 2, "lrSchedule": [[0, 0.01], [2000, 0.0]]}
    process = _process(obs_shape, **training)
    try:
        assert process.learner.policy_version == 0 and process.learner.weights_nbytes() > 0
        process.learner.global_timestep = 1000  # a resumed run's trained steps
        process.start()
        for batch in batches:
            process.inqueue.put(batch)
        updates = _updates(process, 6)
        # numSgdIter passes over each batch; its env steps counted on the first only.
        assert [steps for steps, _ in updates] == [40, 0] * 3
        assert all(np.isfinite(stats["total_loss"]) for _, stats in updates)
        assert process.learner.policy_version == 6
        state = process.state_dict()
        assert state["policy_version"] == 6 and state["global_timestep"] == 1000 + 120
        _wait_until(lambda: process.stats()["num_learner_updates"] == 6)
        assert set(process.learner_queue_size.stats()) >= {"size_mean", "size_quantiles"}
    finally:
        _close(process)
    # The same seed and batches in a learner here: the same initial weights, the same updates.
    torch.manual_seed(SEED)
    here = Learner(LearnerConfig.of(learner_spec(**training)), obs_shape, 2)
    here.global_timestep = 1000
    for batch in batches:
        here.learn_on_batch(batch, keep=True)
        here.global_timestep += 40  # counted when its first pass is reported
        here.learn_on_batch(batch)
    expected = here.get_weights()
    sent = process.learner.get_weights()
    assert sent.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(sent[name], value, rtol=0, atol=1e-6, err_msg=name)
    final = process.state_dict()  # sent by the process as it ended, for the last checkpoint
    assert final["policy_version"] == 6
    for name, value in expected.items():
        np.testing.assert_allclose(final["model"][name].numpy(), value, rtol=0, atol=1e-6)


def test_the_inqueue_holds_learner_queue_size_batches() -> None:
    process = _process(learnerQueueSize=2)
    try:
        process.inqueue.put_nowait(make_batch(seed=0))
        process.inqueue.put_nowait(make_batch(seed=1))
        with pytest.raises(queue.Full):  # what the driver counts as num_times_learner_queue_full
            process.inqueue.put_nowait(make_batch(seed=2))
        with pytest.raises(queue.Full):
            process.inqueue.put(make_batch(seed=2), timeout=0.05)
        process.start()
        _updates(process, 2)
        _wait_until(lambda: process.inqueue.qsize() == 0)
        process.inqueue.put_nowait(make_batch(seed=2))  # room again
        _updates(process, 1)
        assert process.stats()["learner_queue_capacity"] == 2
    finally:
        _close(process)


def test_a_checkpoint_state_loads_before_the_start_and_not_after() -> None:
    first = _process()
    try:
        first.start()
        for i in range(2):
            first.inqueue.put(make_batch(seed=i))
        _updates(first, 2)
    finally:
        _close(first)
    state = first.state_dict()
    second = _process()
    try:
        second.load_state_dict(state)
        assert second.learner.policy_version == 2
        for name, value in first.learner.get_weights().items():
            np.testing.assert_array_equal(second.learner.get_weights()[name], value)
        second.start()
        second.inqueue.put(make_batch(seed=5))
        _updates(second, 1)
        assert second.learner.policy_version == 3  # optimiser steps continue
        with pytest.raises(RuntimeError, match="before it starts"):
            second.load_state_dict(state)
    finally:
        _close(second)


def test_a_bad_state_is_refused_and_the_process_goes_on() -> None:
    process = _process()
    try:
        with pytest.raises(LearnerProcessError, match="failed"):
            process.load_state_dict({"model": {}, "optimizers": [], "policy_version": 1})
        assert process.is_alive() and process.learner.policy_version == 0
        process.start()
        process.inqueue.put(make_batch(seed=0))
        _updates(process, 1)
    finally:
        _close(process)


def test_ctrl_c_is_the_drivers_to_act_on_not_the_learner_process() -> None:
    """A terminal's Ctrl-C reaches the whole process group; the driver still needs the learner's
    state for the run's last checkpoint after it."""
    process = _process()
    try:
        process.start()
        pid = process._process.pid
        assert pid is not None
        os.kill(pid, signal.SIGINT)
        os.kill(pid, signal.SIGTERM)
        process.inqueue.put(make_batch(seed=0))
        _updates(process, 1)
        assert process.is_alive()
    finally:
        _close(process)
    assert process.state_dict()["policy_version"] == 1


def test_a_starved_learner_reports_its_error_and_still_gives_its_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    process = _process(learnerQueueTimeout=1)
    process.start()
    _wait_until(lambda: process.error is not None)
    assert isinstance(process.error, LearnerStarvedError)
    assert "learnerQueueTimeout" in str(process.error)
    # The process logs through the driver's logging (the run's log), not to its own stderr.
    logged = [r for r in caplog.records if r.name.endswith("learner_thread")]
    assert logged and "learner starved" in logged[0].getMessage()
    assert logged[0].levelno == logging.ERROR
    process.stop()
    process.join(timeout=30)
    assert not process.is_alive()
    assert process.state_dict()["policy_version"] == 0  # the run's last checkpoint still writes


def test_a_killed_learner_process_is_not_alive_and_its_state_request_says_why() -> None:
    process = _process()
    process.start()
    pid = process._process.pid
    assert pid is not None
    # What `top` shows in a learner pod.
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "impala-learner"
    os.kill(pid, signal.SIGKILL)
    _wait_until(lambda: not process.is_alive())
    with pytest.raises(LearnerProcessError, match=r"exited \(code -9\)"):
        process.state_dict()
    assert process.stopped_reason() == "the learner process was killed by SIGKILL (out of memory?)"
    process.stop()  # harmless on a dead process
    process.join(timeout=5)


def test_the_process_is_forked_from_a_forkserver_that_imported_torch_beforehand() -> None:
    """Not spawned from the driver after Ray: forked from the process `start_early` began, which
    already holds torch (learners/forkserver.py)."""
    forkserver.start_early(learner_spec(learner={"process": "separate"}))
    process = _process()
    try:
        pid = process._process.pid
        assert pid is not None
        server = psutil.Process(pid).parent()
        assert server is not None and server.pid != os.getpid()
        assert "forkserver" in " ".join(server.cmdline())
        assert any("libtorch" in Path(m.path).name for m in server.memory_maps())
        process.start()
        process.inqueue.put(make_batch())
        assert len(_updates(process, 1)) == 1
    finally:
        _close(process)


def test_a_learner_that_cannot_be_built_fails_at_once_with_the_reason() -> None:
    spec = make_spec({"model": {"type": "custom", "import": "no_such_pkg.models:Net"}})
    with pytest.raises(LearnerProcessError, match="No module named 'no_such_pkg'"):
        LearnerProcess(LearnerConfig.of(spec), (4,), 2, SEED, intra_op_threads=1)


def test_the_multi_device_thread_runs_in_the_process_too() -> None:
    """fakeDevices: the MultiGPULearnerThread, its loader threads reading the process's inqueue."""
    spec = learner_spec(learner={"fakeDevices": 2}, numSgdIter=2, numGpuLoaderThreads=2)
    process = LearnerProcess(LearnerConfig.of(spec), (4,), 2, SEED, intra_op_threads=1)
    try:
        process.start()
        batches = [make_batch(T=6, B=4, seed=i) for i in range(3)]
        for batch in batches:
            process.inqueue.put(batch)
        updates = _updates(process, 6)
        assert sum(steps for steps, _ in updates) == sum(b.env_steps for b in batches)
        assert process.learner.policy_version == 6 and process.error is None
    finally:
        _close(process)


def test_shared_weights_keep_each_entrys_dtype_and_shape_in_one_buffer() -> None:
    import multiprocessing

    from impala_trainer.learners.shared_weights import SharedWeights

    state = {
        "w": torch.arange(6, dtype=torch.float32).view(2, 3),
        "steps": torch.tensor(7, dtype=torch.int64),  # a scalar buffer of another dtype
        "odd": torch.ones(3, dtype=torch.float64),  # after 8 bytes: alignment matters
        "empty": torch.zeros(0),
        "t": torch.arange(4, dtype=torch.float32).view(2, 2).t(),  # not contiguous
    }
    weights = SharedWeights.for_state(state, multiprocessing.get_context("spawn").Lock())
    assert weights.flat.is_shared()
    for name, tensor in state.items():
        weights.views[name].copy_(tensor)
    # What the driver builds from the layout alone, over the same memory.
    again = SharedWeights(weights.flat, weights.layout, weights.lock)
    arrays = again.arrays()
    for name, tensor in state.items():
        assert arrays[name].dtype == tensor.numpy().dtype and arrays[name].shape == tensor.shape
        np.testing.assert_array_equal(arrays[name], tensor.numpy())


def test_a_change_reaches_the_learner_in_the_process_while_it_runs() -> None:
    from impala_api.population.paths import with_values
    from impala_trainer.learning.learner import LearnerChange

    spec = learner_spec(lr=1e-3)
    winner = Learner(LearnerConfig.of(spec), (4,), 2)
    for i in range(3):
        winner.learn_on_batch(make_batch(seed=10 + i))
    process = _process(lr=1e-3)
    try:
        process.start()
        process.inqueue.put(make_batch(seed=0))
        (_, before), = _updates(process, 1)
        assert before["cur_lr"] == pytest.approx(1e-3)
        new = with_values(spec, {"training.lr": 4e-4}).training
        process.learner.change(LearnerChange(state=winner.state_dict(), training=new))
        # The change crosses the control pipe while batches cross the inqueue: batches until an
        # update shows it, however busy the machine.
        rates = [before["cur_lr"]]
        for i in range(50):
            process.inqueue.put(make_batch(seed=1 + i))
            (_, stats), = _updates(process, 1)
            rates.append(stats["cur_lr"])
            if stats["cur_lr"] == pytest.approx(4e-4):
                break
        after = [r for r in rates if r == pytest.approx(4e-4)]
        assert len(after) == 1 and rates[:-1] == [pytest.approx(1e-3)] * (len(rates) - 1)
        state = process.state_dict()
        assert state["policy_version"] == len(rates)  # its own updates, not the winner's too
        steps = state["optimizers"][0]["state"][0]["step"]
        assert float(torch.as_tensor(steps)) == 3 + 1  # the winner's 3 Adam steps, then one
    finally:
        _close(process)
