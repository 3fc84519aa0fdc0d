"""The driver's sampling half (ImpalaDriver._step) on the in-process backend.

`LocalBackend` runs real RolloutWorkers in this process and completes every call at once, so what
is checked is the driver's bookkeeping: which actor is asked for what, and when. The bug these
guard against cost 4x of the CartPole throughput: an actor whose batch had room in the learner
queue was parked anyway and only asked again after the loop had slept through a whole wait with
nothing in flight.
"""

from __future__ import annotations

import json
import pickle
import queue
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import impala_trainer.driver.impala as driver_mod
import impala_trainer.driver.impala as impala_mod
from impala_api.spec import ImpalaJob
from impala_trainer.batches import Fragment, FragmentMeta
from impala_trainer.driver.impala import ImpalaDriver
from impala_trainer.driver.launch import Wiring, build_driver
from impala_trainer.driver.local_backend import LocalActor, LocalBackend, LocalRef
from impala_trainer.learners.learner_thread import POLICY_LAG
from impala_trainer.rollouts.worker import RolloutWorker
from impala_trainer.rundir.writer import RunDir


def _thread(driver: ImpalaDriver) -> Any:
    """The driver's one learner thread (learner.replicas 1, learner.process driver)."""
    return driver.group.threads["default"]  # type: ignore[attr-defined]


def _learner(driver: ImpalaDriver) -> Any:
    """The learner of the job's one policy, `default`."""
    return driver.learner.learners["default"]  # type: ignore[attr-defined]


def _job(**training: Any) -> ImpalaJob:
    return ImpalaJob.model_validate(
        {
            "apiVersion": "impala.dev/v1alpha1",
            "kind": "ImpalaJob",
            "metadata": {"name": "sampling"},
            "spec": {
                "env": {"id": "CartPole-v1", "numEnvsPerWorker": 4},
                "model": {"type": "mlp", "hidden": [16]},
                "training": {
                    "rolloutFragmentLength": 8,
                    "trainBatchSize": 32,
                    "learnerQueueSize": 2,
                    "maxRequestsInFlightPerWorker": 1,
                    **training,
                },
                "stop": {"timesteps": 10**9},
            },
        }
    )


def _driver(
    tmp_path: Path, job: ImpalaJob, actors: int = 2, aggregators: int = 0
) -> tuple[ImpalaDriver, LocalBackend, list[LocalActor]]:
    backend = LocalBackend(rollout_units=actors, aggregator_units=aggregators)
    wiring = Wiring(rollout_workers=actors, aggregator_workers=aggregators)
    driver = build_driver(job, RunDir(tmp_path / "run"), backend, wiring)
    assert isinstance(driver, ImpalaDriver)
    # What run() does first, without starting the learner thread: its queue then fills up, and
    # _step only needs to see it alive.
    _thread(driver).is_alive = lambda: True
    for actor in driver._new_actors:
        driver.on_new_actor(actor)
    driver.manager.poll()
    return driver, backend, backend.actors


def test_an_actor_is_asked_again_as_soon_as_its_batch_enters_the_learner_queue(
    tmp_path: Path,
) -> None:
    driver, _, handles = _driver(tmp_path, _job())
    # Each 4x8 fragment completes a 32-step batch; the queue holds 2, so the first two go in.
    driver._step()
    assert _thread(driver).inqueue.qsize() == 2
    assert not driver.ledger.parked
    # Both actors were asked for their next fragment in the same step, before any wait.
    assert all(h.calls.count("sample") == 2 for h in handles)
    assert driver.ledger.samples_out() == 2


def test_a_full_learner_queue_parks_actors_until_it_has_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver_mod, "WAIT_SECONDS", 0.01)
    monkeypatch.setattr(ImpalaDriver, "_wait_on_learner", lambda self: None)
    driver, _, handles = _driver(tmp_path, _job())
    driver._step()  # queue full (2/2)
    driver._step()  # both fragments come back: one batch waits, its actor and the next park
    assert driver.ledger.backlog and _thread(driver).inqueue.full()
    assert driver.ledger.parked == {"rollout-0", "rollout-1"}
    assert driver.ledger.samples_out() == 0
    assert driver.stats.counters.num_times_learner_queue_full == 1  # counted once per waiting batch

    # The learner takes two batches: the next step feeds the waiting one and, with room left,
    # asks both parked actors again before it blocks on anything.
    _thread(driver).inqueue.get_nowait()
    _thread(driver).inqueue.get_nowait()
    driver._feed_learner()
    driver._unpark()
    assert not driver.ledger.backlog and not driver.ledger.parked
    assert driver.ledger.samples_out() == 2
    assert all(h.calls.count("sample") == 3 for h in handles)


def test_the_actors_busy_seconds_reach_the_status_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sample = RolloutWorker.sample

    def stamped(self: RolloutWorker) -> Fragment:
        fragment = sample(self)
        fragment.busy_seconds = 0.25
        return fragment

    monkeypatch.setattr(RolloutWorker, "sample", stamped)
    clock = [0.0]
    monkeypatch.setattr("impala_trainer.rundir.stats.time.monotonic", lambda: clock[0])
    driver, _, _ = _driver(tmp_path, _job(learnerQueueSize=8))
    driver._snapshot("Running")
    before = driver.stats.counters.num_env_steps_sampled
    for _ in range(3):
        driver._step()
    fragments = (driver.stats.counters.num_env_steps_sampled - before) // 32
    clock[0] += 10.0
    snap = driver._snapshot("Running")
    assert fragments >= 2
    # 0.25 s per fragment over 10 s of 2 actors' time.
    assert snap.throughput.rollout_busy_fraction == pytest.approx(0.25 * fragments / 20.0)


@pytest.mark.parametrize("aggregators", [0, 1])
def test_a_sample_is_one_object_unless_an_aggregator_may_take_its_fragment(
    tmp_path: Path, aggregators: int
) -> None:
    """Without aggregator actors the driver reads every fragment itself, so each request asks
    for one object, (fragment, meta); with them the meta comes alone and the fragment stays a
    reference an aggregator can take unread."""
    driver, backend, _ = _driver(tmp_path, _job(), aggregators=aggregators)
    refs = driver.ledger.waiting_on()
    assert len(refs) == 2
    for ref in refs:
        value = backend.get(ref)
        if aggregators:
            assert isinstance(value, FragmentMeta)
        else:
            fragment, meta = value
            assert isinstance(fragment, Fragment) and meta == fragment.meta()
    for _ in range(1 + aggregators):  # an aggregator's batches come back a step later
        driver._step()
    assert _thread(driver).inqueue.qsize() == 2 and driver.ledger.samples_out() == 2


def test_with_an_aggregator_an_actor_is_asked_again_once_its_fragment_is_aggregated(
    tmp_path: Path,
) -> None:
    # Asked again as soon as its fragment went to the aggregator, each actor had one fragment
    # more in the system than without one: a policy lag of ~5 updates instead of ~3 on
    # CartPole's example, and twice the env steps to 450.
    driver, _, handles = _driver(tmp_path, _job(), aggregators=1)
    rollouts = [h for h in handles if h.aggregator is None]
    assert len(rollouts) == 2 and len(handles) == 3
    driver._step()  # both fragments in, sent to the aggregator; nobody asked again yet
    assert all(h.calls.count("sample") == 1 for h in rollouts)
    assert driver.ledger.samples_out() == 0 and len(driver.ledger.aggregations()) == 2
    driver._step()  # the batches are back and go into the learner queue: ask both again
    assert _thread(driver).inqueue.qsize() == 2 and not driver.ledger.aggregations()
    assert all(h.calls.count("sample") == 2 for h in rollouts)
    assert driver.ledger.samples_out() == 2


def test_an_actor_whose_fragment_died_with_its_aggregator_samples_again(tmp_path: Path) -> None:
    driver, _, _ = _driver(tmp_path, _job(), aggregators=1)
    driver._step()
    (aggregator_id,) = {a.aggregator_id for a in driver.ledger.aggregations()}
    driver.forget(aggregator_id)  # what a failed or released aggregator gets
    assert not driver.ledger.aggregations() and driver.ledger.parked == {"rollout-0", "rollout-1"}
    driver._unpark()
    assert driver.ledger.samples_out() == 2


def test_the_learner_queue_is_never_overfilled(tmp_path: Path) -> None:
    driver, _, _ = _driver(tmp_path, _job())
    for _ in range(5):
        driver._feed_learner()
        driver._unpark()
        driver._collect()
    q: queue.Queue[Any] = _thread(driver).inqueue
    assert q.qsize() == 2
    # Everything sampled is either queued for the learner or waiting in `pending`.
    sampled = driver.stats.counters.num_env_steps_sampled
    assert sampled == 32 * (q.qsize() + len(driver.ledger.backlog))


def test_schedules_run_on_env_steps_trained_not_sampled(tmp_path: Path) -> None:
    """RLlib's old stack feeds its schedules NUM_AGENT_STEPS_TRAINED: batches waiting in the
    learner queue do not move the learning rate."""
    job = _job(lrSchedule=[[0, 1e-3], [64, 0.0]])
    driver, _, _ = _driver(tmp_path, job)
    driver._step()
    assert driver.stats.counters.num_env_steps_sampled == 64 and driver.learner.global_timestep == 0
    assert _learner(driver).lr_schedule(driver.learner.global_timestep) == 1e-3
    _thread(driver).outqueue.put((32, {}))  # the learner thread trained on one batch
    driver._drain_learner()
    assert driver.learner.global_timestep == driver.stats.counters.num_env_steps_trained == 32
    assert _learner(driver).lr_schedule(driver.learner.global_timestep) == 5e-4


def test_policy_lag_is_the_learners_at_a_batchs_first_update(tmp_path: Path) -> None:
    """The lag the status reports is taken when the learner trains on a batch, so the time a
    batch waited in a full learner queue counts; the driver's enqueue records none."""
    driver, _, _ = _driver(tmp_path, _job())
    driver._step()  # two batches into the learner queue
    assert driver.stats.policy_lag_mean == 0.0
    _thread(driver).outqueue.put((32, {POLICY_LAG: 0.0}))
    _thread(driver).outqueue.put((0, {}))  # a second pass reports no lag
    _thread(driver).outqueue.put((32, {POLICY_LAG: 2.0}))
    driver._drain_learner()
    assert driver.stats.policy_lag_mean == 1.0


def test_broadcast_weights_ride_on_each_actors_next_sample_request(
    tmp_path: Path,
) -> None:
    driver, _, handles = _driver(tmp_path, _job())
    # An actor's first request carries the learner's initial weights.
    assert [h.versions_sent for h in handles] == [[0], [0]]
    driver._step()  # both fragments in, both actors asked again: nothing new to send
    assert [h.versions_sent for h in handles] == [[0, None], [0, None]]

    _learner(driver).policy_version = 3  # as if the learner thread had taken three steps
    _thread(driver).outqueue.put((32, {}))
    driver._drain_learner()  # broadcast: new weights taken, no call to any actor
    assert driver.stats.counters.num_weight_broadcasts == 1
    assert all(h.calls == ["node_info", "sample", "sample"] for h in handles)
    _thread(driver).inqueue.get_nowait()
    _thread(driver).inqueue.get_nowait()
    driver._collect()  # the fragments return; each actor's next request carries version 3
    assert [h.versions_sent for h in handles] == [[0, None, 3], [0, None, 3]]
    assert all(h.worker.policy_version == 3 for h in handles)


def test_small_weights_go_inline_and_large_ones_through_the_object_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver, backend, handles = _driver(tmp_path, _job())  # a 16-unit MLP: ~1 KiB of weights
    assert backend.puts == 0
    # Pickled once for every actor's request, not a dict Ray would pickle per request.
    assert isinstance(driver.weights_ref, bytes)
    sent = pickle.loads(driver.weights_ref)
    learner_weights = driver.learner.get_weights()
    assert sent.keys() == learner_weights.keys()
    for name, array in learner_weights.items():
        np.testing.assert_array_equal(sent[name], array)
    for h in handles:  # the actors loaded what was sent
        for name, array in h.worker.get_weights().items():
            np.testing.assert_array_equal(array, learner_weights[name])

    monkeypatch.setattr(driver_mod, "INLINE_WEIGHTS_BYTES", 100)
    _learner(driver).policy_version = 1
    driver._put_weights()
    assert backend.puts == 1 and isinstance(driver.weights_ref, LocalRef)
    driver._collect()  # the next requests carry the reference; the actors load its weights
    assert [h.versions_sent[-1] for h in handles] == [1, 1]


def test_a_dead_actor_is_replaced_with_a_new_seed_and_fresh_weights(tmp_path: Path) -> None:
    driver, backend, handles = _driver(tmp_path, _job())
    backend.crash(handles[0])
    for _ in range(3):
        driver._feed_learner()
        driver._unpark()
        driver._collect()
        driver.manager.poll()
    assert driver.manager.restarts == 1
    assert set(driver.manager.actors) == {"rollout-1", "rollout-2"}
    replacement = backend.actors[2]
    assert replacement.actor_id == "rollout-2" and replacement.worker is not None
    assert replacement.worker.sampler.rng is not handles[0].worker.sampler.rng  # type: ignore[union-attr]
    assert driver.manager.actors["rollout-2"].seed != driver.manager.actors["rollout-1"].seed
    # Its first request carried the learner's current weights; it has sampled since.
    assert replacement.versions_sent[0] == driver.learner.policy_version
    assert driver.manager.actors["rollout-2"].env_steps > 0
    assert [m.state for m in driver.manager.membership().members if m.actor_id == "rollout-0"] == [
        "dead"
    ]


def test_a_whole_run_in_process_trains_and_writes_its_run_directory(tmp_path: Path) -> None:
    """run(): the real learner thread, two in-process workers, the stop criterion, the summary."""
    job = _job(learnerQueueSize=4)
    job.spec.stop.timesteps = 2_000
    backend = LocalBackend(rollout_units=2)
    run_dir = RunDir(tmp_path / "run")
    run_dir.prepare(job)
    driver = build_driver(job, run_dir, backend, Wiring(rollout_workers=2))
    result = driver.run()
    assert (result.phase, result.stopped_by) == ("Succeeded", "timesteps"), result.message
    c = driver.stats.counters
    assert c.num_env_steps_sampled >= 2_000 and c.learner_updates >= 1
    assert c.num_env_steps_trained == 32 * c.learner_updates
    assert all(a.error is not None for a in backend.actors)  # every actor killed at the end
    summary = json.loads(run_dir.summary_file.read_text())
    assert summary["phase"] == "Succeeded" and summary["timesteps"] >= 2_000
    assert list(run_dir.checkpoints.glob("*")), "the final checkpoint is written"


def test_a_run_on_a_full_volume_trains_on_and_resumes_from_the_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Checkpoint writes fail with ENOSPC for a while: the run goes on and says so; then the
    newest checkpoint is truncated on disk: the next run says so and resumes from the one
    before it."""
    import errno

    import impala_trainer.driver.base as base_mod
    from impala_trainer.rundir import checkpoint as ckpt_mod

    job = _job(learnerQueueSize=4)
    job.spec.stop.timesteps = 2_000
    object.__setattr__(job.spec.checkpoint, "interval_seconds", 0)  # every iteration tries one
    run_dir = RunDir(tmp_path / "run")
    run_dir.prepare(job)
    real_save, failures = ckpt_mod.save_checkpoint, []

    def flaky_save(*args: Any, **kwargs: Any) -> Path:
        if len(failures) < 3:
            failures.append(1)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(*args, **kwargs)

    monkeypatch.setattr(base_mod, "save_checkpoint", flaky_save)
    driver = build_driver(job, run_dir, LocalBackend(rollout_units=2), Wiring(rollout_workers=2))
    result = driver.run()
    assert result.phase == "Succeeded", result.message
    assert "checkpoint not written (No space left on device)" in caplog.text
    saved = ckpt_mod.list_checkpoints(run_dir.checkpoints)
    assert len(saved) >= 2

    newest = saved[-1]
    (newest / "learner.pt").write_bytes((newest / "learner.pt").read_bytes()[:100])
    before = json.loads((saved[-2] / "state.json").read_text())["counters"]
    job.spec.stop.timesteps = 4_000
    again = build_driver(
        job, run_dir, LocalBackend(rollout_units=2), Wiring(rollout_workers=2, resume=True)
    )
    caplog.clear()
    lines = len(run_dir.history_file.read_text().splitlines())
    assert again.run().phase == "Succeeded"
    assert f"resumed from {saved[-2].name}, the newest readable checkpoint" in caplog.text
    # The resumed run's first point is the older checkpoint's counters.
    first = json.loads(run_dir.history_file.read_text().splitlines()[lines])
    assert first["env_steps"] == before["num_env_steps_sampled"]


def test_a_run_whose_volume_is_full_to_its_end_keeps_its_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every write to the run directory fails with ENOSPC, the final ones included: the run
    trains to its stop and returns Succeeded (a learner that raised here exited 1 on the real
    node, a finished run counted as a failure), saying what was not written."""
    import errno

    import impala_trainer.driver.base as base_mod
    from impala_trainer.rundir import writer as writer_mod

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    job = _job(learnerQueueSize=4)
    job.spec.stop.timesteps = 2_000
    object.__setattr__(job.spec.checkpoint, "interval_seconds", 0)
    run_dir = RunDir(tmp_path / "run")
    run_dir.prepare(job)
    for module, name in (
        (base_mod, "save_checkpoint"),
        (writer_mod, "write_json_atomic"),
        (writer_mod, "append_history"),
    ):
        monkeypatch.setattr(module, name, full)
    driver = build_driver(job, run_dir, LocalBackend(rollout_units=2), Wiring(rollout_workers=2))
    result = driver.run()
    assert result.phase == "Succeeded", result.message
    assert "status not written (No space left on device)" in caplog.text
    assert "the run ended (Succeeded) but its final status and summary were not written" in (
        caplog.text
    )
    assert not run_dir.summary_file.exists()


def test_the_actors_start_before_the_learner_is_built_and_go_if_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A learner process (or a GPU's context) takes a second or more to build; the actors start
    first, so their start-up overlaps it. A learner that cannot be built takes them down."""
    backend = LocalBackend(rollout_units=2)
    started: list[int] = []
    real = impala_mod.make_learner_group

    def build(*args: Any, **kwargs: Any) -> Any:
        started.append(len(backend.actors))
        return real(*args, **kwargs)

    monkeypatch.setattr(impala_mod, "make_learner_group", build)
    driver = build_driver(_job(), RunDir(tmp_path / "run"), backend, Wiring(rollout_workers=2))
    assert started == [2]
    assert [a.actor_id for a in driver._new_actors] == ["rollout-0", "rollout-1"]

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError("the learner does not fit")

    monkeypatch.setattr(impala_mod, "make_learner_group", fail)
    again = LocalBackend(rollout_units=2)
    with pytest.raises(MemoryError):
        build_driver(_job(), RunDir(tmp_path / "again"), again, Wiring(rollout_workers=2))
    assert len(again.actors) == 2 and all(a.error is not None for a in again.actors)
