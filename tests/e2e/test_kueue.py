"""ImpalaJobs queued by a real Kueue (v0.17.0, built from its Go module, its webhooks served to
the test API server with Kueue's own certificates; harness/cluster/kueue.py) on kwok nodes.

The operator runs as the manifests' ServiceAccount (manifests/rbac.yaml), so its Kueue rules are
proven too. Each test has its own ClusterQueue and LocalQueue; quotas are computed from the
jobs' own pod sets, so a change to the pods' requests cannot make a test pass by accident.
"""

from __future__ import annotations

import datetime
import json
import statistics
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from harness import queues
from harness.cluster import Kube, build_binaries, wait_for
from harness.cluster import kueue as kueue_harness
from harness.queues import admitted
from impala_operator.build import kueue_workload
from tests.support.jobs import job_manifest
from tests.support.operator_suite import Operator, OperatorSuite

from .conftest import REAL_NODE_REPORT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
FLAVOR = "kwok-pool"
TOLERATION = {"key": "impala.dev/kueue-test", "operator": "Exists", "effect": "NoSchedule"}
JOB: dict[str, Any] = {
    "env": {"id": "CartPole-v1", "numEnvsPerWorker": 4},
    "learner": {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
    "rollouts": {
        "minReplicas": 1,
        "maxReplicas": 1,
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
    },
}
wait_status = OperatorSuite().wait_status
ij = OperatorSuite.ij
condition = OperatorSuite.condition


def queued_job(
    name: str, queue: str, *, priority: str | None = None, **sections: Any
) -> dict[str, Any]:
    return queues.queued(job_manifest(name, JOB, **sections), queue, priority)


def seconds_since(start: float) -> float:
    return round(time.monotonic() - start, 1)


@pytest.fixture(scope="module")
def kueue(kube: Kube) -> Iterator[None]:
    if not kube.is_local:
        pytest.skip("runs Kueue beside the local control plane")
    bin_dir = build_binaries("kueue", "kueue-manifests")
    with kueue_harness.running(kube, bin_dir, kube.workdir / "kueue"):
        kube.apply(queues.resource_flavor(FLAVOR, {"type": "kwok"}, tolerations=[TOLERATION]))
        for name, value in (("impala-low", 100), ("impala-high", 1000)):
            kube.apply(queues.priority_class(name, value))
        yield


@pytest.fixture(scope="module")
def ns(kube: Kube, kueue: None) -> Iterator[str]:
    with kube.namespace("kueue") as name:
        yield name


@pytest.fixture(scope="module")
def operator(kube: Kube, ns: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    kube.kubectl("apply", "-f", str(MANIFESTS))
    identity = kube.sa_kubeconfig("impala-system", "impala-operator")
    with Operator.running(kube, identity, ns, tmp_path_factory.mktemp("operator")) as op:
        yield op


def make_queue(kube: Kube, ns: str, name: str, quota: Mapping[str, str], **extra: Any) -> str:
    """ClusterQueue `name` with `quota` on the kwok flavor and LocalQueue `name` in `ns`."""
    kube.apply(queues.cluster_queue(name, FLAVOR, quota, **extra))
    kube.apply(queues.local_queue(name, ns, name))
    return name


def learner_pods(kube: Kube, ns: str, job: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={job},app.kubernetes.io/component=learner"
    return [p for p in kube.pods(ns, selector) if not p["metadata"].get("deletionTimestamp")]


def workload(kube: Kube, ns: str, job: str) -> dict[str, Any]:
    result: dict[str, Any] = kube.get(
        "workloads.kueue.x-k8s.io", kueue_workload.workload_name(job), "-n", ns
    )
    return result


def wait_learner(kube: Kube, ns: str, job: str, timeout: float = 60) -> dict[str, Any]:
    pods: dict[str, Any] = wait_for(
        lambda: (learner_pods(kube, ns, job) or [None])[0], timeout=timeout, interval=0.5,
        what=f"{job}'s learner pod",
    )  # fmt: skip
    return pods


def test_a_full_queue_holds_the_second_job_until_the_first_finishes(
    kube: Kube, ns: str, operator: Operator
) -> None:
    first, second = queued_job("q-first", "one-job"), queued_job("q-second", "one-job")
    queue = make_queue(kube, ns, "one-job", queues.quota_for(first))
    started = time.monotonic()
    OperatorSuite.create(kube, ns, first)
    status = wait_status(kube, ns, "q-first", admitted, "admitted by Kueue")
    assert status["admission"]["clusterQueue"] == queue
    pod = wait_learner(kube, ns, "q-first")
    # The flavor's node labels and tolerations reach the pods, as jobframework injects them.
    assert pod["spec"]["nodeSelector"]["type"] == "kwok"
    assert TOLERATION in pod["spec"]["tolerations"]
    rollout = kube.get("deployment", "q-first-rollout", "-n", ns)["spec"]["template"]["spec"]
    assert rollout["nodeSelector"]["type"] == "kwok"
    first_admitted = seconds_since(started)

    OperatorSuite.create(kube, ns, second)
    held = wait_status(
        kube, ns, "q-second", lambda s: condition(s, "Admitted").get("status") == "False",
        "held by its queue",
    )  # fmt: skip
    assert held["phase"] == "Pending"
    assert f"LocalQueue {queue}" in condition(held, "Admitted")["message"]
    time.sleep(3)  # a few reconciles: still nothing runs
    assert learner_pods(kube, ns, "q-second") == []
    assert kube.get("deployment", "q-second-rollout", "-n", ns)["spec"]["replicas"] == 0
    assert workload(kube, ns, "q-second")["spec"]["queueName"] == queue

    ended = time.monotonic()
    kube.end_pod(ns, pod["metadata"]["name"], exit_code=0)
    wait_status(kube, ns, "q-first", lambda s: s.get("phase") == "Succeeded", "Succeeded")
    finished = condition(workload(kube, ns, "q-first")["status"], "Finished")
    assert finished.get("status") == "True", finished
    wait_status(kube, ns, "q-second", admitted, "admitted once the first finished")
    wait_learner(kube, ns, "q-second")
    REAL_NODE_REPORT.append(
        f"kueue: first job admitted {first_admitted}s after apply; second admitted and its "
        f"learner created {seconds_since(ended)}s after the first ended"
    )


def test_a_higher_priority_job_preempts_and_the_preempted_one_resumes_unfailed(
    kube: Kube, ns: str, operator: Operator
) -> None:
    low = queued_job("p-low", "preempt", priority="impala-low")
    high = queued_job("p-high", "preempt", priority="impala-high")
    make_queue(
        kube,
        ns,
        "preempt",
        queues.quota_for(low),
        preemption={"withinClusterQueue": "LowerPriority"},
    )
    OperatorSuite.create(kube, ns, low)
    wait_status(kube, ns, "p-low", admitted, "admitted")
    low_pod = wait_learner(kube, ns, "p-low")["metadata"]["name"]
    assert workload(kube, ns, "p-low")["spec"]["priority"] == 100

    started = time.monotonic()
    OperatorSuite.create(kube, ns, high)
    evicted = wait_status(
        kube, ns, "p-low", lambda s: condition(s, "Admitted").get("reason") == "EvictedPreempted",
        "evicted by the preemption",
    )  # fmt: skip
    wait_for(lambda: not learner_pods(kube, ns, "p-low"), timeout=60, what="p-low's pods gone")
    wait_status(kube, ns, "p-high", admitted, "admitted after the preemption")
    wait_learner(kube, ns, "p-high")
    preempted_after = seconds_since(started)
    # Stopped, not failed: no retry used, the same attempt resumes from its checkpoint later.
    status = ij(kube, ns, "p-low")["status"]
    assert status["phase"] == "Pending", status
    assert status["learner"]["failures"] == 0 and status["learner"]["restarts"] == 0
    assert "checkpoint is kept" in condition(evicted, "Admitted")["message"]
    low_workload = workload(kube, ns, "p-low")["status"]
    assert "admission" not in low_workload
    assert condition(low_workload, "Requeued").get("status") == "True"

    resumed = time.monotonic()
    high_pod = learner_pods(kube, ns, "p-high")[0]["metadata"]["name"]
    kube.end_pod(ns, high_pod, exit_code=0)
    wait_status(kube, ns, "p-low", admitted, "readmitted once the high-priority job ended")
    again = wait_learner(kube, ns, "p-low")
    assert again["metadata"]["name"] == low_pod  # attempt 0 again: resumed, not retried
    status = ij(kube, ns, "p-low")["status"]
    assert status["learner"]["failures"] == 0
    events = OperatorSuite.events(kube, ns, "p-low")
    assert any("EvictedPreempted" in e for e in events) and any("Admitted" in e for e in events)
    REAL_NODE_REPORT.append(
        f"kueue: preemption stopped the low-priority job and started the high one in "
        f"{preempted_after}s; readmitted {seconds_since(resumed)}s after it ended"
    )


def test_rollouts_are_admitted_partially_and_autoscale_within_the_admitted_count(
    kube: Kube, ns: str, operator: Operator
) -> None:
    job = queued_job(
        "partial", "partial", rollouts={"minReplicas": 1, "maxReplicas": 4, "replicas": 4}
    )
    make_queue(kube, ns, "partial", queues.quota_for(job, rollouts=2))
    OperatorSuite.create(kube, ns, job)
    status = wait_status(kube, ns, "partial", admitted, "admitted")
    counts = {s["name"]: s["count"] for s in status["admission"]["podSets"]}
    assert counts == {"learner": 1, "rollout": 2}, counts
    assert workload(kube, ns, "partial")["spec"]["podSets"][1]["minCount"] == 1
    # The request is 4 rollouts; the quota admitted 2, which bounds them.
    wait_for(
        lambda: kube.get("deployment", "partial-rollout", "-n", ns)["spec"]["replicas"] == 2,
        timeout=60, what="rollouts at the admitted count",
    )  # fmt: skip
    time.sleep(3)
    assert kube.get("deployment", "partial-rollout", "-n", ns)["spec"]["replicas"] == 2
    assert ij(kube, ns, "partial")["status"]["rollouts"]["desired"] == 2


def test_learners_beyond_what_the_queue_could_ever_hold_fail_naming_the_field(
    kube: Kube, ns: str, operator: Operator
) -> None:
    """Two learner pods on a ClusterQueue sized for one job of one learner: Kueue's own verdict
    ("> maximum capacity") fails the job at once, naming spec.learner.replicas, and its
    Workload is Finished (out of the queue), instead of a job Pending forever."""
    one = queued_job("too-many", "small")
    make_queue(kube, ns, "small", queues.quota_for(one))
    job = queued_job("too-many", "small", learner={**JOB["learner"], "replicas": 2})
    OperatorSuite.create(kube, ns, job)
    status = wait_status(
        kube, ns, "too-many", lambda s: s.get("phase") == "Failed", "Failed by its queue"
    )
    assert condition(status, "Failed")["reason"] == "ExceedsQuota", status
    assert "lower spec.learner.replicas or spec.learner.resources" in status["message"]
    assert "maximum capacity" in status["message"]
    assert learner_pods(kube, ns, "too-many") == []
    wait_for(
        lambda: condition(workload(kube, ns, "too-many")["status"], "Finished").get("status")
        == "True", timeout=30, what="the Workload Finished",
    )  # fmt: skip
    assert any("ExceedsQuota" in e for e in OperatorSuite.events(kube, ns, "too-many"))


def test_a_missing_priority_class_is_named_and_nothing_is_queued(
    kube: Kube, ns: str, operator: Operator
) -> None:
    job = queued_job("no-class", "one-job", priority="no-such-class")
    OperatorSuite.create(kube, ns, job)
    status = wait_status(
        kube, ns, "no-class",
        lambda s: "no-such-class" in condition(s, "Admitted").get("message", ""),
        "the missing class named",
    )  # fmt: skip
    assert status["phase"] == "Pending"
    assert "create it or change the label kueue.x-k8s.io/priority-class" in json.dumps(status)
    assert learner_pods(kube, ns, "no-class") == []


def test_many_jobs_share_a_queue_and_none_starves(kube: Kube, ns: str, operator: Operator) -> None:
    """24 jobs on a queue with room for 6 at a time: each runs when Kueue admits it, finishes and
    hands its quota on; all 24 succeed, never more than 6 at once, and every learner starts
    within seconds of its admission (the operator starves none).
    (200 jobs are the benchmark's: bench/operator_queue.py, docs/benchmarks.md "Operator".)"""
    jobs = [queued_job(f"many-{i:02d}", "many") for i in range(24)]
    make_queue(kube, ns, "many", queues.quota_for(jobs[0], jobs=6))
    started = time.monotonic()
    kube.apply({"apiVersion": "v1", "kind": "List", "items": jobs}, "-n", ns)
    names = [j["metadata"]["name"] for j in jobs]
    admitted_at: dict[str, float] = {}
    done: set[str] = set()
    most_running = 0

    def step() -> bool:
        nonlocal most_running
        running = 0
        for item in kube.get("ij", "-n", ns)["items"]:
            name, status = item["metadata"]["name"], item.get("status") or {}
            if name not in names:
                continue
            if admitted(status) and name not in admitted_at:
                admitted_at[name] = time.monotonic() - started
            if status.get("phase") == "Succeeded":
                done.add(name)
            elif status.get("phase") == "Running":
                running += 1
                # A job that runs is ended at once (its learner exits 0): the queue turns over.
                for pod in learner_pods(kube, ns, name):
                    kube.end_pod(ns, pod["metadata"]["name"], exit_code=0)
        most_running = max(most_running, running)
        return len(done) == len(names)

    wait_for(step, timeout=600, interval=1, what="all 24 jobs to succeed")
    assert most_running <= 6, most_running  # never more than the quota holds
    # None starves on the operator's side: each job's learner pod follows Kueue's admission of
    # its Workload (the Admitted condition's time) within a few reconciles.
    workloads = {
        w["metadata"]["ownerReferences"][0]["name"]: w
        for w in kube.get("workloads.kueue.x-k8s.io", "-n", ns)["items"]
    }
    lags = {}
    for name in names:
        kueue_admitted = queues.condition(workloads[name]["status"], "Admitted")
        pod = kube.get("pod", f"{name}-learner-0", "-n", ns)
        lags[name] = _seconds(pod["metadata"]["creationTimestamp"]) - _seconds(
            kueue_admitted["lastTransitionTime"]
        )
    assert max(lags.values()) <= 10, lags
    REAL_NODE_REPORT.append(
        f"kueue: 24 jobs through a 6-job quota in {seconds_since(started)}s; last admitted "
        f"{max(admitted_at.values()):.1f}s after the apply; learner pod created "
        f"{statistics.median(lags.values()):.1f}s (median), {max(lags.values()):.1f}s (max) "
        "after Kueue admitted its Workload"
    )


def _seconds(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
