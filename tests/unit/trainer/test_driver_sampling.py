"""The driver's sampling half (ImpalaDriver._step) against actors that answer at once.

`ray` inside impala_trainer.driver.impala is replaced by a small fake whose actor calls run a real
RolloutWorker eagerly, so what is checked is the driver's bookkeeping: which actor is asked for
what, and when. The bug these guard against cost 4x of the CartPole throughput: an actor whose
batch had room in the learner queue was parked anyway and only asked again after the loop had
slept through a whole wait with nothing in flight.
"""

from __future__ import annotations

import itertools
import queue
from pathlib import Path
from typing import Any

import pytest

import impala_trainer.driver.impala as driver_mod
from impala_trainer.driver.actor_manager import ManagedActor
from impala_trainer.driver.impala import ImpalaDriver
from impala_trainer.job.spec import ImpalaJob
from impala_trainer.rollouts.worker import RolloutWorker
from impala_trainer.rundir.writer import RunDir

_ids = itertools.count()


class _Ref:
    def __init__(self, value: Any) -> None:
        self.value = value
        self.id = next(_ids)

    def __hash__(self) -> int:
        return self.id


class _Method:
    def __init__(self, fn: Any, log: list[str], name: str) -> None:
        self.fn, self.log, self.name = fn, log, name

    def remote(self, *args: Any) -> Any:
        self.log.append(self.name)
        return self.fn(*args)


class _Handle:
    """An actor handle whose calls complete immediately (results held in refs)."""

    def __init__(self, worker: RolloutWorker) -> None:
        self.calls: list[str] = []
        self.worker = worker
        self.versions_sent: list[int | None] = []  # per sample request: the weights it carried

        def sample(weights: Any = None, policy_version: int = 0) -> tuple[_Ref, _Ref]:
            # Ray resolves a reference passed as an argument; small weights come inline.
            self.versions_sent.append(None if weights is None else policy_version)
            if weights is not None:
                values = weights.value if isinstance(weights, _Ref) else weights
                worker.set_weights(values, policy_version)
            fragment = worker.sample()
            return _Ref(fragment), _Ref(fragment.meta())

        self.sample = _Method(sample, self.calls, "sample")


class _FakeRay:
    class exceptions:  # mirrors ray.exceptions
        RayError = RuntimeError

    def __init__(self) -> None:
        self.puts = 0

    def wait(
        self, refs: list[_Ref], num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[_Ref], list[_Ref]]:
        return list(refs), []

    def get(self, ref: _Ref) -> Any:
        return ref.value

    def put(self, value: Any) -> _Ref:
        self.puts += 1
        return _Ref(value)


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


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> _FakeRay:
    fake = _FakeRay()
    monkeypatch.setattr(driver_mod, "ray", fake)
    return fake


def _driver(tmp_path: Path, job: ImpalaJob, actors: int = 2) -> tuple[ImpalaDriver, list[_Handle]]:
    driver = ImpalaDriver(job, RunDir(tmp_path / "run"), num_rollout_workers=actors)
    driver.obs_shape, driver.num_actions = (4,), 2
    driver._start()
    # The learner thread is built but never started, so its queue fills up; _step only needs
    # to see it alive.
    driver.thread.is_alive = lambda: True  # type: ignore[method-assign]
    handles = []
    for i in range(actors):
        handle = _Handle(RolloutWorker(job.spec, f"rollout-{i}", seed=i))
        actor = ManagedActor(f"rollout-{i}", "rollout", handle, seed=i, state="healthy")
        driver.manager.actors[actor.actor_id] = actor
        driver._on_new_actor(actor)
        handles.append(handle)
    return driver, handles


def test_an_actor_is_asked_again_as_soon_as_its_batch_enters_the_learner_queue(
    tmp_path: Path, fake_ray: _FakeRay
) -> None:
    driver, handles = _driver(tmp_path, _job())
    # Each 4x8 fragment completes a 32-step batch; the queue holds 2, so the first two go in.
    driver._step()
    assert driver.thread.inqueue.qsize() == 2
    assert not driver.parked
    # Both actors were asked for their next fragment in the same step, before any wait.
    assert all(h.calls.count("sample") == 2 for h in handles)
    assert sum(driver.in_flight.values()) == 2


def test_a_full_learner_queue_parks_actors_until_it_has_room(
    tmp_path: Path, fake_ray: _FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver_mod, "WAIT_SECONDS", 0.01)
    monkeypatch.setattr(ImpalaDriver, "_wait_on_learner", lambda self: None)
    driver, handles = _driver(tmp_path, _job())
    driver._step()  # queue full (2/2)
    driver._step()  # both fragments come back: one batch waits, its actor and the next park
    assert driver.pending and driver.thread.inqueue.full()
    assert driver.parked == {"rollout-0", "rollout-1"}
    assert sum(driver.in_flight.values()) == 0
    assert driver.stats.counters.learner_queue_full == 1  # counted once per waiting batch

    # The learner takes two batches: the next step feeds the waiting one and, with room left,
    # asks both parked actors again before it blocks on anything.
    driver.thread.inqueue.get_nowait()
    driver.thread.inqueue.get_nowait()
    driver._feed_learner()
    driver._unpark()
    assert not driver.pending and not driver.parked
    assert sum(driver.in_flight.values()) == 2
    assert all(h.calls.count("sample") == 3 for h in handles)


def test_the_learner_queue_is_never_overfilled(tmp_path: Path, fake_ray: _FakeRay) -> None:
    driver, _ = _driver(tmp_path, _job())
    for _ in range(5):
        driver._feed_learner()
        driver._unpark()
        driver._collect()
    q: queue.Queue[Any] = driver.thread.inqueue
    assert q.qsize() == 2
    # Everything sampled is either queued for the learner or waiting in `pending`.
    sampled = driver.stats.counters.env_steps_sampled
    assert sampled == 32 * (q.qsize() + len(driver.pending))


def test_broadcast_weights_ride_on_each_actors_next_sample_request(
    tmp_path: Path, fake_ray: _FakeRay
) -> None:
    driver, handles = _driver(tmp_path, _job())
    # An actor's first request carries the learner's initial weights.
    assert [h.versions_sent for h in handles] == [[0], [0]]
    driver._step()  # both fragments in, both actors asked again: nothing new to send
    assert [h.versions_sent for h in handles] == [[0, None], [0, None]]

    driver.learner.policy_version = 3  # as if the learner thread had taken three steps
    driver.thread.outqueue.put((32, {}))
    driver._drain_learner()  # broadcast: new weights taken, no call to any actor
    assert driver.stats.counters.weight_broadcasts == 1
    assert all(h.calls == ["sample", "sample"] for h in handles)
    driver.thread.inqueue.get_nowait()
    driver.thread.inqueue.get_nowait()
    driver._collect()  # the fragments return; each actor's next request carries version 3
    assert [h.versions_sent for h in handles] == [[0, None, 3], [0, None, 3]]
    assert all(h.worker.policy_version == 3 for h in handles)


def test_small_weights_go_inline_and_large_ones_through_the_object_store(
    tmp_path: Path, fake_ray: _FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver, handles = _driver(tmp_path, _job())  # a 16-unit MLP: ~1 KiB of weights
    assert fake_ray.puts == 0
    assert driver.weights_ref is not None and not isinstance(driver.weights_ref, _Ref)

    monkeypatch.setattr(driver_mod, "INLINE_WEIGHTS_BYTES", 100)
    driver.learner.policy_version = 1
    driver._put_weights()
    assert fake_ray.puts == 1 and isinstance(driver.weights_ref, _Ref)
    driver._collect()  # the next requests carry the reference; the actors load its weights
    assert [h.versions_sent[-1] for h in handles] == [1, 1]
