"""Elastic membership and learner restart of a multi-pod job, as local processes.

One run goes through what a cluster does to a job: a rollout pod dies (SIGKILL of its whole
process tree), a new one joins, one is scaled down (SIGTERM: it drains), and the learner pod is
killed and restarted with `--resume`. Each step is checked in status.json / history.jsonl, which
is what the sidecar and the operator read.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.multipod_cluster import LocalJob, healthy
from tests.support.jobs import job_manifest

pytestmark = [pytest.mark.slow, pytest.mark.train]

MANIFEST: dict[str, Any] = job_manifest(
    "multipod-elastic",
    env={"id": "CartPole-v1", "numEnvsPerWorker": 4},
    model={"type": "mlp", "hidden": [32]},
    training={"trainBatchSize": 400, "rolloutFragmentLength": 50},
    rollouts={"workersPerPod": 1},
    aggregators={"minReplicas": 1, "maxReplicas": 1},
    # Never reached: the test ends the run itself.
    stop={"timesteps": 10**10, "timeLimitSeconds": 3000},
    checkpoint={"intervalSeconds": 5, "keep": 3},
)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[LocalJob]:
    local = LocalJob(tmp_path, MANIFEST)
    try:
        yield local
    finally:
        local.close()


def steps(status: dict[str, Any]) -> int:
    return int(status["counters"]["num_env_steps_sampled"])


def nodes_of(status: dict[str, Any], role: str = "rollout") -> set[str]:
    return {m["node_id"] for m in healthy(status, role)}


def history_after(job: LocalJob, t: float) -> list[dict[str, Any]]:
    return [point for point in job.history() if point["time"] > t]


def latest_checkpoint_steps(job: LocalJob) -> int:
    ckpts = sorted((job.run_dir / "checkpoints").glob("ckpt-*"))
    state = json.loads((ckpts[-1] / "state.json").read_text())
    return int(state["counters"]["num_env_steps_sampled"])


def test_pods_die_join_drain_and_the_learner_restarts(job: LocalJob) -> None:
    job.start("learner", "learner")
    job.start("rollout-a", "rollout")
    job.start("rollout-b", "rollout")
    job.start("aggregator", "aggregator")
    status = job.wait_for(
        "2 rollout nodes and the aggregator sampling",
        lambda s: len(nodes_of(s)) == 2 and len(healthy(s, "aggregator")) == 1 and steps(s) > 0,
        timeout=600,
    )
    first_nodes = nodes_of(status)

    # 1. A rollout pod dies: its node and actors go, training goes on with the other pod.
    job.kill("rollout-a")
    status = job.wait_for(
        "the dead pod's actor dropped",
        lambda s: len(nodes_of(s)) == 1 and s["membership"]["rollout_nodes"] == 1,
        timeout=180,
    )
    survivor = nodes_of(status).pop()
    dead_node = (first_nodes - {survivor}).pop()
    assert any(
        m["node_id"] == dead_node and m["state"] == "dead" for m in status["membership"]["members"]
    )
    after_kill = steps(status)
    job.wait_for("training to continue", lambda s: steps(s) > after_kill + 4000, timeout=180)

    # 2. A new rollout pod joins: it gets an actor within seconds of its node appearing.
    job.start("rollout-c", "rollout")
    status = job.wait_for(
        "an actor on the new pod", lambda s: len(nodes_of(s) - first_nodes) == 1, timeout=300
    )
    newcomer = (nodes_of(status) - first_nodes).pop()

    # 3. Scale-down: SIGTERM drains the pod, its in-flight fragments are collected, none lost.
    job.terminate("rollout-b")
    assert job.procs["rollout-b"].wait(timeout=120) == 0, job.tail("rollout-b")
    status = job.wait_for(
        "the drained actor released",
        lambda s: any(
            m["node_id"] == survivor and m["state"] == "dead" for m in s["membership"]["members"]
        ),
        timeout=60,
    )
    drained = [m for m in status["membership"]["members"] if m["node_id"] == survivor]
    assert drained and all(m["state"] == "dead" for m in drained)
    for m in drained:
        # What the actor says it sampled is what the driver received from it: every fragment,
        # including the ones in flight when the pod got SIGTERM, reached the learner.
        assert m["env_steps"] > 0
        assert m["env_steps_produced"] == m["env_steps"], m
    assert nodes_of(status) == {newcomer}

    # 4. The learner pod dies and comes back with --resume: counters continue from the newest
    #    checkpoint, and the rollout and aggregator pods rejoin the new head by themselves.
    job.wait_for(
        "a checkpoint",
        lambda s: (
            s.get("checkpoint") is not None
            and s["checkpoint"]["num_env_steps_sampled"] > after_kill
        ),
        timeout=120,
    )
    job.kill("learner")
    killed_at = time.time()
    checkpoint_steps = latest_checkpoint_steps(job)
    job.start("learner", "learner", resume=True)
    status = job.wait_for(
        "the restarted learner training with both pods back",
        lambda s: (
            s["updated_at"] > killed_at
            and steps(s) > checkpoint_steps + 4000
            and len(healthy(s)) == 1
            and len(healthy(s, "aggregator")) == 1
        ),
        timeout=600,
    )
    history = history_after(job, killed_at)
    # The restarted learner's first record is the checkpoint's counters exactly, then they grow.
    assert history[0]["env_steps"] == checkpoint_steps
    assert all(b["env_steps"] >= a["env_steps"] for a, b in itertools.pairwise(history))
    assert status["wall_seconds"] > 0

    # 5. The aggregator pod is scaled down: it drains like a rollout pod (the fragments it still
    #    buffers go to the driver), and with no aggregator left the driver builds the batches.
    job.terminate("aggregator")
    assert job.procs["aggregator"].wait(timeout=120) == 0, job.tail("aggregator")
    status = job.wait_for(
        "the aggregator released",
        lambda s: not healthy(s, "aggregator") and s["membership"]["aggregator_nodes"] == 0,
        timeout=60,
    )
    trained = status["counters"]["num_env_steps_trained"]
    job.wait_for(
        "training on without aggregators",
        lambda s: s["counters"]["num_env_steps_trained"] > trained + 4000,
        timeout=180,
    )

    # 6. SIGTERM stops the learner cleanly (final checkpoint and summary).
    job.terminate("learner")
    assert job.procs["learner"].wait(timeout=120) == 130, job.tail("learner")
    summary = job.summary()
    assert summary is not None and summary["phase"] == "Stopped"
    assert summary["timesteps"] >= steps(status)
    final_checkpoint = latest_checkpoint_steps(job)
    assert final_checkpoint == summary["timesteps"]
