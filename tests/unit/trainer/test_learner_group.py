"""The driver's LearnerGroup: learner.replicas learners on the in-process backend.

`LocalBackend` runs each learner's calls on threads of its own and forms their gloo group in a
store of this process, so the whole driver with N learners runs here: batches routed to the
learners, one set of weights, the counters, checkpoints that resume at another N, a learner
lost or never placed.
"""

from __future__ import annotations

import concurrent.futures
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import impala_trainer.learners.group as group_mod
import impala_trainer.learning.collective as collective_mod
from impala_api.roles import COLLECTIVE_PORT_ENV, LEARNER_PORTS
from impala_api.spec import DEFAULT_POLICY, ImpalaJob
from impala_trainer.driver.impala import ImpalaDriver
from impala_trainer.driver.launch import Wiring, build_driver
from impala_trainer.driver.local_backend import LocalBackend, LocalRef
from impala_trainer.learners.group import LearnerActors, LocalLearners
from impala_trainer.learners.worker import LearnerWorker
from impala_trainer.learning.collective import Rendezvous
from impala_trainer.learning.learner import LearnerConfig, LearnerPolicy
from impala_trainer.rundir.checkpoint import list_checkpoints
from impala_trainer.rundir.writer import RunDir
from tests.support.jobs import make_job


def _job(replicas: int, timesteps: int = 3_000, **training: Any) -> ImpalaJob:
    return make_job(
        "group",
        {
            "env": {"id": "CartPole-v1", "numEnvsPerWorker": 4},
            "model": {"type": "mlp", "hidden": [16]},
            "stop": {"timesteps": timesteps},
        },
        training={"rolloutFragmentLength": 8, "trainBatchSize": 32, "seed": 3, **training},
        learner={"replicas": replicas},
    )


def _run(job: ImpalaJob, run_dir: RunDir, resume: bool = False) -> ImpalaDriver:
    backend = LocalBackend(rollout_units=2)
    driver = build_driver(job, run_dir, backend, Wiring(rollout_workers=2, resume=resume))
    assert isinstance(driver, ImpalaDriver)
    result = driver.run()
    assert (result.phase, result.stopped_by) == ("Succeeded", "timesteps"), result.message
    replicas = job.spec.learner.replicas
    assert len(backend.learners) == (replicas if replicas > 1 else 0)  # one: the driver's thread
    assert all(a.error is not None for a in backend.learners)  # every learner ended with the run
    return driver


def _same_weights(backend: LocalBackend) -> None:
    weights = [pickle.loads(a.learner.weights(DEFAULT_POLICY)) for a in backend.learners]  # type: ignore[union-attr]
    for other in weights[1:]:
        for k, v in weights[0].items():
            np.testing.assert_array_equal(v, other[k])


def test_one_learner_is_a_local_group_and_more_are_distributed(tmp_path: Path) -> None:
    for replicas, kind in ((1, LocalLearners), (2, LearnerActors)):
        backend = LocalBackend(rollout_units=1)
        driver = build_driver(_job(replicas), RunDir(tmp_path / str(replicas)), backend,
                              Wiring(rollout_workers=1))  # fmt: skip
        assert isinstance(driver, ImpalaDriver)
        assert isinstance(driver.group, kind)
        driver.manager.shutdown()
        driver.group.close(5)


def test_two_learners_train_one_set_of_weights_on_batches_of_their_own(tmp_path: Path) -> None:
    job = _job(2)
    backend = LocalBackend(rollout_units=2)
    run_dir = RunDir(tmp_path / "run")
    run_dir.prepare(job)
    driver = build_driver(job, run_dir, backend, Wiring(rollout_workers=2))
    assert isinstance(driver, ImpalaDriver)
    assert isinstance(driver.group, LearnerActors)
    fed: list[int] = []
    real_call = backend.learner_call

    def counting(handle: Any, method: Any, *args: Any) -> Any:
        if method == "train":
            fed.append(backend.learners.index(handle))
        return real_call(handle, method, *args)

    backend.learner_call = counting  # type: ignore[method-assign]
    result = driver.run()
    assert result.phase == "Succeeded", result.message
    c = driver.stats.counters
    versions = [a.learner.learners[DEFAULT_POLICY].policy_version for a in backend.learners]  # type: ignore[union-attr]
    assert versions == [c.policy_version] * 2, (versions, fed)
    # Each step trains a batch on each learner: the steps count once, the env steps twice.
    assert c.learner_updates >= 1
    assert c.num_env_steps_trained == 2 * 32 * c.learner_updates
    assert abs(fed.count(0) - fed.count(1)) <= job.spec.training.learner_queue_size
    assert c.policy_version == c.learner_updates
    _same_weights(backend)


@pytest.mark.parametrize("then", [1, 3])
def test_a_checkpoint_of_two_learners_resumes_at_another_count(tmp_path: Path, then: int) -> None:
    run_dir = RunDir(tmp_path / "run")
    job = _job(2)
    run_dir.prepare(job)
    first = _run(job, run_dir)
    (newest,) = list_checkpoints(run_dir.checkpoints)[-1:]
    saved = json.loads((newest / "state.json").read_text())["counters"]
    assert saved["learner_updates"] == first.stats.counters.learner_updates
    learner_state = torch.load(newest / "learner.pt", weights_only=False)
    policies = learner_state["policies"]
    assert policies[DEFAULT_POLICY]["policy_version"] == saved["learner_updates"]

    again = _run(_job(then, timesteps=6_000), run_dir, resume=True)
    c = again.stats.counters
    assert c.learner_updates > saved["learner_updates"]
    history = [json.loads(line) for line in run_dir.history_file.read_text().splitlines()]
    resumed = [h for h in history if h["env_steps"] == saved["num_env_steps_sampled"]]
    assert resumed, "the resumed run starts from the checkpoint's counters"
    # The optimiser state went on: the policy version counts every step of both runs.
    assert c.policy_version == c.learner_updates


def test_a_learner_that_dies_fails_the_run_naming_it(tmp_path: Path) -> None:
    job = _job(2, timesteps=10**9)
    backend = LocalBackend(rollout_units=2)
    run_dir = RunDir(tmp_path / "run")
    run_dir.prepare(job)
    driver = build_driver(job, run_dir, backend, Wiring(rollout_workers=2))
    real_call = backend.learner_call
    calls = {"train": 0}

    def crashing(handle: Any, method: Any, *args: Any) -> Any:
        if method == "train":
            calls["train"] += 1
            if calls["train"] == 20:
                backend.crash(backend.learners[1], "learner 1's node went away")
        return real_call(handle, method, *args)

    backend.learner_call = crashing  # type: ignore[method-assign]
    result = driver.run()
    assert result.phase == "Failed"
    assert "learner 1" in (result.message or "")
    assert list_checkpoints(run_dir.checkpoints), "learner 0's state is checkpointed"


def test_learners_that_never_join_fail_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(group_mod, "RENDEZVOUS_TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(collective_mod, "RENDEZVOUS_TIMEOUT_SECONDS", 1.0)
    backend = LocalBackend(rollout_units=1)
    real_call = backend.learner_call

    def never_joining(handle: Any, method: Any, *args: Any) -> Any:
        if method == "join" and handle is backend.learners[2]:  # its pod never scheduled
            return LocalRef(future=concurrent.futures.Future())
        return real_call(handle, method, *args)

    backend.learner_call = never_joining  # type: ignore[method-assign]
    with pytest.raises(group_mod.LearnerGroupError) as info:
        build_driver(_job(3), RunDir(tmp_path / "run"), backend, Wiring(rollout_workers=1))
    message = str(info.value)
    # Learners 0 and 1 wait for 2 as long as the group's timeout: none has joined.
    assert message.startswith("spec.learner.replicas 3: the learners did not form a group")
    assert "did not join" in message
    assert all(a.error is not None for a in backend.learners)  # none left behind


def test_the_other_learners_start_only_once_learner_0_is_placed(tmp_path: Path) -> None:
    """Learner 0 is pinned to the driver's node, which offers one unit of `learner`: a rank
    started beside it could take that unit while the learner pods are still joining, and
    learner 0 would never be placed. So the others are started once learner 0 has answered."""
    backend = LocalBackend(rollout_units=1)
    real_start, real_call = backend.start_learner, backend.learner_call
    answered: list[bool] = []
    address_refs: list[LocalRef] = []

    def start(*args: Any) -> Any:
        rank = args[2]
        if rank > 0:
            answered.append(bool(address_refs) and address_refs[0].done())
        return real_start(*args)

    def call(handle: Any, method: Any, *args: Any) -> Any:
        ref = real_call(handle, method, *args)
        if method == "address":
            address_refs.append(ref)
        return ref

    backend.start_learner = start  # type: ignore[method-assign]
    backend.learner_call = call  # type: ignore[method-assign]
    driver = build_driver(_job(3), RunDir(tmp_path / "run"), backend, Wiring(rollout_workers=1))
    assert isinstance(driver, ImpalaDriver)
    try:
        assert answered == [True, True]
    finally:
        driver.group.close(timeout=30)


def test_rank_0_meets_its_peers_on_the_port_its_pod_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    """The TCPStore's port: the one the operator pins in learner pods (the NetworkPolicy opens
    it to learner pods alone), else a free one."""
    policy = LearnerPolicy(LearnerConfig.of(_job(2).spec), (4,), 2)
    worker = LearnerWorker({DEFAULT_POLICY: policy}, seed=0, rank=0, intra_op_threads=1)
    monkeypatch.setenv(COLLECTIVE_PORT_ENV, str(LEARNER_PORTS.store))
    assert worker.address("10.1.2.3") == Rendezvous("10.1.2.3", LEARNER_PORTS.store, 0)
    monkeypatch.delenv(COLLECTIVE_PORT_ENV)
    assert worker.address("10.1.2.3").port > 0
