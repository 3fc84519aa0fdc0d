"""A multi-pod job as local processes learns CartPole: learner + 2 rollout nodes + 1 aggregator.

Each process runs the command line `roles.role_command` renders for its pod (what the operator's
pod builders put in the containers), with the learner's Service name replaced by 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.multipod_cluster import LocalJob, healthy
from tests.support.jobs import job_manifest

pytestmark = [pytest.mark.slow, pytest.mark.train]

MANIFEST: dict[str, Any] = job_manifest(
    "multipod-cartpole",
    env={"id": "CartPole-v1", "numEnvsPerWorker": 16},
    model={"type": "mlp", "hidden": [64, 64]},
    training={"trainBatchSize": 800, "rolloutFragmentLength": 50, "seed": 7},
    rollouts={"minReplicas": 2, "maxReplicas": 4, "workersPerPod": 1},
    aggregators={"minReplicas": 1, "maxReplicas": 1},
    # A step count, not a return: the run must outlast the second rollout pod's start. CartPole
    # reaches 400 in ~500K steps, ~5 s of sampling at 100-180K/s, which the second pod's worker
    # once missed (its node joined, but it sampled nothing before the stop). 3M steps sample for
    # ~20 s. The time limit only stops a run that fails to sample.
    stop={"timesteps": 3_000_000, "timeLimitSeconds": 900},
    checkpoint={"intervalSeconds": 60},
    # The learner computes with the CPUs reserved for it (node/cpus.py), not the node's cores.
    learner={"resources": {"requests": {"cpu": "1500m"}, "limits": {"cpu": "4"}}},
)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[LocalJob]:
    local = LocalJob(tmp_path, MANIFEST)
    try:
        yield local
    finally:
        local.close()


def test_learner_two_rollout_pods_and_an_aggregator_learn_cartpole(job: LocalJob) -> None:
    learner = job.start("learner", "learner")
    # The aggregator joins first: a learner with no rollout worker cannot finish, so the
    # aggregator is part of the run however fast the machine trains once sampling starts.
    job.start("aggregator", "aggregator")
    job.wait_for("the aggregator", lambda s: len(healthy(s, "aggregator")) == 1, timeout=600)
    job.start("rollout-a", "rollout")
    job.start("rollout-b", "rollout")

    assert learner.wait(timeout=1200) == 0, job.tail("learner")
    summary = job.summary()
    assert summary is not None
    assert summary["stopped_by"] == "timesteps"
    # It learned: the curve reached 400 (the last mean at a fixed step count moves a lot).
    curve = [p["episode_return_mean"] or 0.0 for p in job.history()]
    assert max(curve) >= 400, curve[-10:]

    final = job.status()
    assert final is not None
    # The two rollout pods were two Ray nodes, each with its one worker, next to the aggregator.
    assert final["membership"]["rollout_nodes"] == 2
    assert final["membership"]["aggregator_nodes"] == 1
    members = final["membership"]["members"]
    rollouts = [m for m in members if m["role"] == "rollout"]
    aggregators = [m for m in members if m["role"] == "aggregator"]
    # Both pods sampled, and the fragments went through the aggregator (by object reference):
    # with an aggregator alive the driver does not build batches itself.
    assert len({m["node_id"] for m in rollouts if m["env_steps"] > 0}) == 2
    assert sum(m["env_steps"] for m in rollouts) == final["counters"]["num_env_steps_sampled"]
    assert aggregators and aggregators[0]["env_steps"] > 0
    assert final["counters"]["num_env_steps_trained"] > 0
    log = (job.run_dir / "trainer.log").read_text()
    assert "learner: 1 intra-op thread (the learner's CPU request 1.5; " in log
