"""The product as users run it, on a real node: nothing on this path is faked.

`helm install` puts the operator in a pod (the chart's ServiceAccount, no admin kubeconfig), the
CartPole example is `kubectl apply`d with a checkpoint claim, and the learner pod (Ray head,
driver, learner thread, status sidecar) and the rollout pods (joining through the learner
Service's DNS name) train it in real containers: containerd + runc, the kubelet, CNI, kube-proxy
and CoreDNS (harness/cluster/node.py), from the image `hack/build-image.sh` builds.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import queues
from harness.cluster import Kube, build_binaries, monitoring, wait_for
from harness.cluster import kueue as kueue_harness
from harness.cluster.controlplane import SERVICE_CIDR
from harness.cluster.node import HOST_IP, NODE_NAME, RealNode
from harness.cluster.s3 import S3Server
from impala_api.names import STATUS_ACCESS_LABEL
from impala_api.roles import LEARNER_PORTS, METRICS_PORT, STATUS_PORT, RayPorts
from tests.support.jobs import EXAMPLES, example_documents, example_manifest, static_volume
from tests.support.plugin import kubectl_impalajob

from .conftest import REAL_NODE_REPORT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "impala-operator"
OPERATOR_NS = "impala-system"
RUN_AS = 1000
GREEDY_TRAINED = 150
"""Greedy return that tells the example's trained CartPole policy from an untrained one (~10):
the example stops on its sampled 100-episode mean, and greedy play of that policy varies."""


def log(msg: str) -> None:
    """Progress on the test log, and in the session's summary (CI's log shows it)."""
    line = f"[real-node {time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    REAL_NODE_REPORT.append(line)


def diagnose(kube: Kube, namespace: str) -> str:
    """What a failure message needs, the essentials first (CI shows a failure's output cut in
    the middle): each pod's phase, deletion and containers' exits; each job's status; events;
    then the learners' and the operator's logs."""
    pods = kube.pods(namespace)
    parts = ["$ pods (phase, deletionTimestamp, containers: state exit reason finishedAt)"]
    parts += [_pod_line(pod) for pod in pods]
    jobs = kube.get("ij", "-n", namespace).get("items", [])
    for job in jobs:
        status = job.get("status", {})
        brief = {k: status.get(k) for k in ("phase", "reason", "message", "learner", "admission")}
        conds = [
            f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
            for c in status.get("conditions", [])
        ]
        name = job["metadata"]["name"]
        parts.append(f"$ ij {name}: {json.dumps(brief)}\n  " + "\n  ".join(conds))
    for args in (
        ("get", "events", "-n", namespace, "--sort-by=.lastTimestamp"),
        ("logs", "-n", OPERATOR_NS, "deployment/impala-impala-operator", "--tail=40"),
    ):
        proc = kube.kubectl(*args, check=False)
        parts.append(f"$ kubectl {' '.join(args)}\n{proc.stdout}{proc.stderr}")
    for pod in pods:
        for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
            proc = kube.kubectl(
                "logs", "-n", namespace, pod["metadata"]["name"], "-c", c["name"], "--tail=30",
                check=False,
            )  # fmt: skip
            parts.append(f"--- {pod['metadata']['name']}/{c['name']}\n{proc.stdout}{proc.stderr}")
    return "\n".join(parts)


def _pod_line(pod: dict[str, Any]) -> str:
    """One pod: `name phase [deleting since T]; container: state exit reason finishedAt, ...`."""
    meta, status = pod["metadata"], pod.get("status", {})
    deleting = f" deleting since {meta['deletionTimestamp']}" if "deletionTimestamp" in meta else ""
    containers = []
    for c in [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]:
        state = c.get("state", {})
        kind = next(iter(state), "?")
        t = state.get(kind, {})
        containers.append(
            f"{c['name']}: {kind} {t.get('exitCode', '')} {t.get('reason', '')} "
            f"{t.get('finishedAt', '')}".rstrip()
        )
    return f"{meta['name']} {status.get('phase')}{deleting}; " + ", ".join(containers)


@contextlib.contextmanager
def diagnosed(kube: Kube, namespace: str) -> Iterator[None]:
    """Print `diagnose` when the block fails (the failure report shows captured output)."""
    try:
        yield
    except BaseException:
        try:
            print(diagnose(kube, namespace))
        except Exception as exc:  # the test's own failure is what the report must show
            print(f"diagnose failed: {exc!r}")
        raise


def wait_finished(kube: Kube, namespace: str, name: str, timeout: float = 900) -> dict[str, Any]:
    """The job's status once its phase is Succeeded or Failed."""

    def done() -> dict[str, Any] | None:
        st = job_status(kube, namespace, name)
        return st if st.get("phase") in ("Succeeded", "Failed") else None

    return wait_for(done, timeout=timeout, interval=3, what=f"ImpalaJob {name} to finish")


def operator_leader(kube: Kube) -> str:
    """The operator pod holding the leader Lease ("" while none does)."""
    proc = kube.kubectl("get", "lease", "impala-operator", "-n", OPERATOR_NS, "-o", "json",
                        check=False)  # fmt: skip
    if proc.returncode != 0:
        return ""
    return str(json.loads(proc.stdout)["spec"].get("holderIdentity") or "")


MONITORING_NS = "monitoring"


@pytest.fixture(scope="module")
def operator(real_kube: Kube) -> Iterator[None]:
    """The chart installed into `impala-system` with its monitoring on (under the Prometheus
    Operator's CRDs, scraped every 5 s by the Prometheus of `monitoring`), its operator pod
    Running on the real node."""
    monitoring.install_crds(real_kube, real_kube.bin_dir or build_binaries(quiet=True))
    real_kube.helm(
        "install", "impala", str(CHART), "-n", OPERATOR_NS, "--create-namespace",
        "--set", "reconcileInterval=2",
        "--set", f"monitoring.namespace={MONITORING_NS}",
        "--set", "monitoring.serviceMonitor.enabled=true",
        "--set", "monitoring.serviceMonitor.interval=5s",
        "--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.podMonitor.interval=5s",
        "--set", "monitoring.rules.enabled=true", "--set", "monitoring.dashboards.enabled=true",
        "--wait", "--timeout", "5m", timeout=360,
    )  # fmt: skip
    pods = real_kube.pods(OPERATOR_NS)
    # The chart's two replicas, one leading on the Lease.
    assert [p["spec"]["nodeName"] for p in pods] == [NODE_NAME, NODE_NAME]
    leader = wait_for(lambda: operator_leader(real_kube), timeout=60, what="an operator leader")
    log(f"operator pods {[p['metadata']['name'] for p in pods]} Running; {leader} leads")
    yield
    real_kube.helm("uninstall", "impala", "-n", OPERATOR_NS, "--wait", check=False)


def provisioned_path(kube: Kube, namespace: str, claim: str) -> Path:
    """The host directory of the volume the default StorageClass provisioned for a claim."""
    pvc = kube.get("pvc", claim, "-n", namespace)
    assert pvc["status"]["phase"] == "Bound", pvc["status"]
    pv = kube.get("pv", pvc["spec"]["volumeName"])
    log(f"claim {claim}: {pvc['spec'].get('storageClassName')} volume {pv['metadata']['name']}")
    return Path(pv["spec"]["hostPath"]["path"])


def volume_for(kube: Kube, namespace: str, claim: str, size: str = "1Gi") -> Path:
    """A static hostPath PersistentVolume on the real node reserved for `namespace/claim`; its
    directory on the host. hostPath volumes ignore fsGroup, so the directory is made the pods'
    user's here, as an administrator would for a static volume."""
    path = kube.workdir / "volumes" / f"{namespace}-{claim}"
    path.mkdir(parents=True)
    os.chown(path, RUN_AS, RUN_AS)
    kube.apply(static_volume(namespace, claim, str(path), size))
    return path


@pytest.fixture(scope="module")
def s3_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3-compatible server (versitygw) on the host, where pods reach it (HOST_IP), with
    a `results` bucket."""
    with S3Server(tmp_path_factory.mktemp("s3"), host=HOST_IP) as server:
        store_client(server).create_bucket(Bucket="results")
        yield server


def store_client(server: S3Server) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name="us-east-1",
    )


def store_json(server: S3Server, key: str) -> Any:
    return json.loads(store_client(server).get_object(Bucket="results", Key=key)["Body"].read())


def store_checkpoints(server: S3Server, prefix: str) -> list[str]:
    """Keys of the complete checkpoints' state.json under `prefix`, oldest first."""
    listed = store_client(server).list_objects_v2(Bucket="results", Prefix=f"{prefix}/checkpoints/")
    return sorted(o["Key"] for o in listed.get("Contents", ()) if o["Key"].endswith("/state.json"))


def checkpoint_claim(
    kube: Kube, namespace: str, name: str, size: str = "1Gi", *, tmpfs: bool = False
) -> Path:
    """A PersistentVolumeClaim bound to a static volume on the real node; its host directory.
    `tmpfs`: the volume is a filesystem of exactly `size` of its own (a tmpfs under the work
    dir, unmounted with the node), so it can really fill up."""
    path = volume_for(kube, namespace, name, size)
    if tmpfs:
        mib = int(size.removesuffix("Mi"))
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={mib}m,uid={RUN_AS},gid={RUN_AS},mode=0755",
             f"impala-{name}", str(path)],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": f"{namespace}-{name}",
                "resources": {"requests": {"storage": size}},
            },
        }
    )
    return path


def job_status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return dict(kube.get("ij", name, "-n", namespace).get("status") or {})


def impalajob(
    kube: Kube, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> str:
    """`impalajob ARGS...` from outside the cluster with the admin kubeconfig; its stdout."""
    proc = subprocess.run(
        [sys.executable, "-m", "impala_cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**kube.env, **(env or {})},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def impalajob_status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    """`impalajob status NAME -n NS --json` from outside the cluster (a port-forward)."""
    return dict(json.loads(impalajob(kube, "status", name, "-n", namespace, "--json")))


def status_counters(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The counters `impalajob status` reports, or None while it cannot (a pod starting)."""
    proc = subprocess.run(
        [sys.executable, "-m", "impala_cli.main", "status", name, "-n", namespace, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=kube.env,
        check=False,
    )
    return dict(json.loads(proc.stdout)["counters"]) if proc.returncode == 0 else None


def test_cartpole_trains_in_real_pods(real_kube: Kube, operator: None) -> None:
    """The example as a user applies it trains to Succeeded in real pods, and its policy comes
    back out of the claim."""
    kube = real_kube
    with kube.namespace("cartpole") as ns:
        # The example as a user applies it: the job and its results claim, which the cluster's
        # default StorageClass provisions (the local-path provisioner, on the job's node).
        t0 = time.monotonic()
        kube.kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "cartpole.yaml"))
        log(f"applied manifests/examples/cartpole.yaml in {ns}")
        seen: list[int] = []
        running: set[str] = set()
        with diagnosed(kube, ns):

            def watch() -> dict[str, Any] | None:
                st = job_status(kube, ns, "cartpole")
                steps = int((st.get("progress") or {}).get("timesteps") or 0)
                if steps and (not seen or steps != seen[-1]):
                    seen.append(steps)
                    table = kube.kubectl("get", "ij", "-n", ns).stdout.strip().splitlines()[-1]
                    log(f"kubectl get ij: {table}")
                for p in kube.pods(ns):
                    if p["status"]["phase"] == "Running" and p["metadata"]["name"] not in running:
                        running.add(p["metadata"]["name"])
                        log(f"pod {p['metadata']['name']} ({p['status'].get('podIP')}) on node "
                            f"{p['spec'].get('nodeName')}: Running")  # fmt: skip
                return st if st.get("phase") in ("Succeeded", "Failed") else None

            st = wait_for(watch, timeout=900, interval=3, what="cartpole to finish")
        elapsed = time.monotonic() - t0
        results = provisioned_path(kube, ns, "cartpole-results")
        pods = kube.pods(ns)
        progress = st.get("progress") or {}
        ret, steps = progress.get("episodeReturnMean"), progress.get("timesteps")
        log(f"phase {st['phase']} after {elapsed:.0f} s; final return {ret} at {steps} steps")
        assert st["phase"] == "Succeeded", diagnose(kube, ns)
        assert float(progress["episodeReturnMean"]) >= 450
        # CartPole may finish between two looks (it trains in ~10 s): progress rising and the
        # live status are asserted on the longer job below.
        assert seen == sorted(seen), seen
        assert {p["spec"]["nodeName"] for p in pods} <= {NODE_NAME}
        # The learner and both rollout pods ran.
        assert {"cartpole-learner-0"} < running and len(running) >= 3, running
        # The results outlive the pods, on the claim, written by the pods' user: the final
        # checkpoint, the summary and the learning curve.
        summary = json.loads((results / "summary.json").read_text())
        assert summary["phase"] == "Succeeded", summary
        assert (results / "history.jsonl").read_text().count("\n") >= 3
        assert sorted(p.name for p in (results / "checkpoints").glob("ckpt-*"))
        assert (results / "summary.json").stat().st_uid == RUN_AS

        # cleanPodPolicy's default keeps the finished learner pod, so its log is still there. The
        # job is Succeeded once the learner container exits; the pod's phase follows only after the
        # kubelet has stopped the sidecar, so it is waited for (and must not be deleted meanwhile).
        def learner_phase() -> str | None:
            phase = kube.get("pod", "cartpole-learner-0", "-n", ns)["status"]["phase"]
            return phase if phase != "Running" else None

        t_done = time.monotonic()
        phase = wait_for(learner_phase, timeout=120, interval=1, what="the learner pod to end")
        log(f"learner pod {phase} {time.monotonic() - t_done:.0f} s after the job")
        assert phase == "Succeeded"
        assert "reached after" in impalajob(kube, "logs", "cartpole", "-n", ns)
        # No CPU request in the example: one intra-op thread, whatever the node's cores.
        assert "learner: 1 intra-op thread (learner.resources has no CPU request; " in (
            results / "trainer.log"
        ).read_text()
        # cleanPodPolicy scaled the rollouts to 0: status says so once they are gone (it once kept
        # `ready: 1` with desired 0, `kubectl get ij` ROLLOUTS 1/0).
        wait_for(
            lambda: job_status(kube, ns, "cartpole")["rollouts"]["summary"] == "0/0",
            timeout=120, interval=2, what="ROLLOUTS 0/0 after the job",
        )  # fmt: skip

        # The job still answers once it is over (its sidecar has gone with the learner's
        # containers): the final status from the CR, and the results on the claim.
        final = json.loads(impalajob(kube, "status", "cartpole", "-n", ns, "--json"))
        assert final["phase"] == "Succeeded" and final["progress"]["timesteps"] == steps, final
        assert final["results"] == {"volumeClaim": "cartpole-results"}, final
        # The policy out of the claim, by the job's name: a reader pod streams its config and
        # newest checkpoint to this machine, which plays it greedily and exports it.
        t_eval = time.monotonic()
        played = json.loads(impalajob(kube, "evaluate", "cartpole", "-n", ns, "--episodes", "5",
                                      "--json", timeout=300))  # fmt: skip
        log(f"impalajob evaluate cartpole (from the claim, {time.monotonic() - t_eval:.0f} s): "
            f"{played['episode_return_mean']} over {played['episodes']} episodes")  # fmt: skip
        # The trained policy, not an untrained one (greedy, that plays ~10): the run stopped on
        # its sampled mean of 450, and a policy there has played greedy for 223 (CI, 2026-11-27).
        assert played["episode_return_mean"] >= GREEDY_TRAINED, played
        newest = sorted(p.name for p in (results / "checkpoints").glob("ckpt-*"))[-1]
        assert played["checkpoint"] == newest, played
        assert not [p for p in kube.pods(ns) if "results" in p["metadata"]["name"]]  # cleaned up


def test_a_job_image_built_from_the_product_image_trains(real_kube: Kube, operator: None) -> None:
    """The cluster path for a user's own package (README): examples/custom/Dockerfile built FROM
    the product image (hack/build-job-image.sh), and manifests/examples/custom.yaml, whose
    spec.image names it, applied unchanged: the user's env (`my_impala.envs:TwinCorridor-v0`)
    and model (`model.type: custom`) are imported in the learner and rollout pods."""
    kube = real_kube
    with kube.namespace("custom") as ns, diagnosed(kube, ns):
        t0 = time.monotonic()
        kube.kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "custom.yaml"))
        st = wait_finished(kube, ns, "twin-corridor", timeout=600)
        progress = st.get("progress") or {}
        ret, steps = progress.get("episodeReturnMean"), progress.get("timesteps")
        log(f"custom: {st['phase']} {time.monotonic() - t0:.0f} s after apply; {ret} at {steps}")
        assert st["phase"] == "Succeeded", diagnose(kube, ns)
        # It stops on its evaluation, which ran in the learner pod (the user's package there).
        assert float(progress["evaluationReturnMean"]) >= 0.9, progress
        assert progress["bestCheckpoint"] == "checkpoints/best"
        images = {c["image"] for p in kube.pods(ns) for c in p["spec"]["containers"]}
        assert images == {"my-impala:0.1.0"}, images


def test_a_multi_agent_self_play_job_trains_in_real_pods(real_kube: Kube, operator: None) -> None:
    """manifests/examples/tictactoe.yaml (a PettingZoo AEC game from the image's multiagent
    extra, self-play against a snapshot pool) on two learner pods in lock step trains to
    Succeeded with its rollout pod, its policy's self-play games counted in the sidecar's
    status."""
    kube = real_kube
    small = {"requests": {"cpu": "200m"}}
    manifest = example_manifest(
        "tictactoe", stop={"timesteps": 150_000},
        learner={"replicas": 2, "resources": small},
        rollouts={"minReplicas": 1, "maxReplicas": 1, "autoscaling": {"enabled": False},
                  "resources": small},
    )  # fmt: skip
    with kube.namespace("agents") as ns, diagnosed(kube, ns):
        t0 = time.monotonic()
        kube.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(manifest))

        def playing() -> dict[str, Any] | None:
            st = job_status(kube, ns, "tictactoe")
            if st.get("phase") != "Running" or st.get("learner", {}).get("summary") != "2/2":
                return None
            try:
                snap = impalajob_status(kube, ns, "tictactoe")
            except AssertionError:  # the sidecar not reachable yet
                return None
            main = (snap.get("policies") or {}).get("main") or {}
            return snap if main.get("self_play_games") else None

        snap = wait_for(playing, timeout=600, interval=3, what="self-play games in /status")
        assert "main/total_loss" in snap["learner"], snap["learner"]
        st = wait_finished(kube, ns, "tictactoe", timeout=600)
        log(f"tictactoe: {st['phase']} {time.monotonic() - t0:.0f} s after apply")
        assert st["phase"] == "Succeeded", diagnose(kube, ns)


def test_two_learner_pods_train_one_policy_and_restart_together(
    real_kube: Kube, operator: None
) -> None:
    """learner.replicas 2 in real pods: rank 0 (Ray head, driver, sidecar) and rank 1 (a learner
    node joining it) train CartPole in lock step (`kubectl get ij` LEARNERS 2/2) under the job's
    NetworkPolicy, enforced: the learners reach each other's collective ports, a rollout pod of
    the same job does not, and gloo listens inside the range the policy opens. Deleting rank 1
    mid-run restarts the pair from the newest checkpoint: a disruption, announced, no retry
    used; the group forms again through the policy and the job still learns."""
    kube = real_kube
    node = RealNode(kube.bin_dir or Path(), kube.workdir)
    agent = network_policy_agent_kubeconfig(kube)
    with (
        kube.namespace("learners") as ns,
        node.network_policies_enforced(agent, SERVICE_CIDR),
    ):
        checkpoints = checkpoint_claim(kube, ns, "pair-checkpoints")
        small = {"requests": {"cpu": "200m"}}
        manifest = example_manifest(
            "cartpole", name="pair", namespace=ns,
            learner={"replicas": 2, "resources": small},
            rollouts={"minReplicas": 1, "maxReplicas": 1, "autoscaling": {"enabled": False},
                      "resources": small},
            checkpoint={"volumeClaim": "pair-checkpoints", "intervalSeconds": CHECKPOINT_SECONDS},
        )  # fmt: skip
        # A count of env steps, not the example's return of 450: CartPole is past 380 by the
        # first checkpoint here, and a pair that met 450 before rank 1 was gone finished instead
        # of restarting (one CI run). The return is asserted at the end.
        manifest["spec"]["stop"] = {"timesteps": 300_000, "timeLimitSeconds": 600}
        kube.apply(manifest)
        with diagnosed(kube, ns):
            t0 = time.monotonic()

            def paired() -> str | None:
                if job_status(kube, ns, "pair").get("learner", {}).get("summary") != "2/2":
                    return None
                if newest_checkpoint(checkpoints)[0] <= 0:  # both learners have trained
                    return None
                return kube.kubectl("get", "ij", "pair", "-n", ns).stdout.strip().splitlines()[-1]

            row = wait_for(paired, timeout=400, interval=2, what="two learners training")
            log(f"learners: both pods training {time.monotonic() - t0:.0f} s after apply; "
                f"kubectl get ij: {row}")  # fmt: skip
            assert " 2/2 " in f" {row} ", row
            _collective_ports_admit_learners_only(kube, ns)
            saved = newest_checkpoint(checkpoints)[0]
            kube.kubectl("delete", "pod", "pair-learner-0-1", "-n", ns, "--wait=false")
            restarted = wait_for(
                lambda: running_pods(kube, ns, "learner-peer")
                and [p["metadata"]["name"] for p in running_pods(kube, ns, "learner-peer")]
                == ["pair-learner-1-1"],
                timeout=300, interval=2, what="the pair's attempt 1",
            )  # fmt: skip
            assert restarted
            st = wait_finished(kube, ns, "pair", timeout=600)
        assert st["phase"] == "Succeeded", diagnose(kube, ns)
        learner = st["learner"]
        assert (learner["restarts"], learner["failures"], learner["disruptions"]) == (1, 0, 1)
        replaced = kube.get("events", "-n", ns, "--field-selector", "reason=LearnerReplaced")
        assert replaced["items"], "no Event announced the lost learner"
        log(f"learners: rank 1 deleted at >= {saved} steps; {replaced['items'][0]['message']}")
        log_text = (checkpoints / "trainer.log").read_text()
        assert "resumed from" in log_text, log_text[-3000:]
        # The rollouts' direct sample connections went through the policy (else the driver
        # falls back to Ray calls and says so).
        assert "cannot reach the driver's direct sample port" not in log_text, log_text[-3000:]
        progress = st.get("progress") or {}
        ret, steps = progress.get("episodeReturnMean"), progress.get("timesteps")
        best = progress.get("bestEpisodeReturnMean")
        log(f"learners: {st['phase']} {time.monotonic() - t0:.0f} s after apply, {ret} at {steps} "
            f"(best {best})")  # fmt: skip
        # Learned through the restart: 450 reached (the pair was at 320-430 when rank 1 went).
        # The return at the stop itself varies (356 in one CI run, 494 and 492 in others, best
        # 500 in all), so it is held to a policy far above random's ~22 rather than to the peak.
        assert float(best) >= 450 and float(ret) >= 200, progress


def pod_reaches(kube: Kube, namespace: str, pod: str, ip: str, port: int) -> bool:
    """Whether `pod` (any pod of the image: it has python3) opens a TCP connection to ip:port."""
    connect = f"import socket; socket.create_connection(('{ip}', {port}), timeout=3)"
    proc = kube.kubectl("exec", "-n", namespace, pod, "--", "python3", "-c", connect,
                        check=False, timeout=60)  # fmt: skip
    return proc.returncode == 0


# A pod's listening TCP ports (IPv4 and IPv6) from /proc: the image has no ss or netstat.
LISTENING = (
    "import pathlib; print(sorted({int(f[1].split(':')[1], 16) for t in ('tcp', 'tcp6') "
    "for f in (ln.split() for ln in pathlib.Path('/proc/net/' + t).read_text().splitlines()[1:]) "
    "if f[3] == '0A'}))"
)


def _collective_ports_admit_learners_only(kube: Kube, ns: str) -> None:
    """Under the enforced policy: rank 1 reaches rank 0's TCPStore, a rollout pod does not, and
    each learner pod's gloo listener is in the range the policy opens (their ephemeral range)."""
    (rank0,) = running_pods(kube, ns, "learner")
    (rank1,) = running_pods(kube, ns, "learner-peer")
    (rollout,) = running_pods(kube, ns, "rollout")
    ip, peer = rank0["status"]["podIP"], rank1["metadata"]["name"]
    store, (low, high) = LEARNER_PORTS.store, LEARNER_PORTS.pairs
    wait_for(lambda: not pod_reaches(kube, ns, rollout["metadata"]["name"], ip, store),
             timeout=120, what="the agent to enforce the job's NetworkPolicy")  # fmt: skip
    assert pod_reaches(kube, ns, peer, ip, store), "rank 1 no longer reaches rank 0's TCPStore"
    for pod in (rank0, rank1):
        name = pod["metadata"]["name"]
        out = kube.kubectl("exec", "-n", ns, name, "-c", "learner", "--", "python3", "-c",
                           LISTENING, timeout=60).stdout  # fmt: skip
        ports = json.loads(out)
        assert any(low <= p <= high for p in ports), f"{name} listens on {ports}"
    log(f"learners: under the enforced policy rank 1 reaches {ip}:{store}, the rollout pod "
        f"does not; gloo listens in {low}-{high} on both")  # fmt: skip


def test_a_learner_process_trains_on_pong_frames_in_a_real_pod(
    real_kube: Kube, operator: None
) -> None:
    """`learner.process: separate` in a learner pod: the spawned process, its semaphores and the
    frames' shared-memory slots in the pod's /dev/shm (a memory-backed emptyDir), as its user."""
    kube = real_kube
    with kube.namespace("pongsep") as ns, diagnosed(kube, ns):
        (claim,) = [d for d in example_documents("pong") if d["kind"] == "PersistentVolumeClaim"]
        claim["metadata"]["namespace"] = ns
        manifest = example_manifest(
            "pong", name="pong", namespace=ns,
            # The limit is the container's CFS quota: 1.5 CPUs, fewer than the node's 2 cores.
            learner={"process": "separate", "resources": {"limits": {"cpu": "1500m"}}},
            rollouts={"minReplicas": 1, "maxReplicas": 1}, stop={"timeLimitSeconds": 30},
        )  # fmt: skip
        t0 = time.monotonic()
        kube.apply(claim)
        kube.apply(manifest)
        st = wait_finished(kube, ns, "pong", timeout=600)
        steps = int((st.get("progress") or {}).get("timesteps") or 0)
        log(f"pong, learner process: {st['phase']} {time.monotonic() - t0:.0f} s after apply; "
            f"{steps} env steps")  # fmt: skip
        assert st["phase"] == "Succeeded", diagnose(kube, ns)
        results = provisioned_path(kube, ns, manifest["spec"]["checkpoint"]["volumeClaim"])
        trainer_log = (results / "trainer.log").read_text()
        assert "in a process of its own" in trainer_log, trainer_log[-3000:]
        assert "shared-memory slots" in trainer_log, trainer_log[-3000:]
        # The learner read its quota inside the container (node/cpus.py): 1 CPU usable of 2.
        threads = "learner: 1 intra-op thread (the learner's CPU request 1.5; 1 CPU usable)"
        assert threads in trainer_log, trainer_log[:3000]
        # Trained, not only sampled: the learner process took the batches out of the slots.
        last = json.loads((results / "history.jsonl").read_text().splitlines()[-1])
        assert last["learner_updates"] > 0 and last["env_steps"] > 0, last


# ---- faults on the real node --------------------------------------------------------------------

STORE_DOWN_SECONDS = 60

FAULT_JOB = "faulty"
CHECKPOINT_SECONDS = 5
FAULT_JOB_SECONDS = 510
FAULT_VOLUME = "64Mi"
"""The fault job's claim: a tmpfs of this size, so that a test can fill it."""
LEARNER_MEMORY = "3Gi"
"""The fault job's learner limit (~1.3 GiB used): what the OOM test exceeds."""
RESUMED_SECONDS = 60
"""Training seconds the fault job's attempt 1 runs after the OOM kill before its (brought
forward) time limit: long enough for the test to see it training."""


def progress_steps(kube: Kube, namespace: str, name: str) -> int:
    return int((job_status(kube, namespace, name).get("progress") or {}).get("timesteps") or 0)


def progress_moves(kube: Kube, namespace: str, *, timeout: float, what: str) -> None:
    """Wait until the steps the operator publishes for the fault job pass their current value."""
    before = progress_steps(kube, namespace, FAULT_JOB)
    wait_for(
        lambda: progress_steps(kube, namespace, FAULT_JOB) > before,
        timeout=timeout,
        interval=2,
        what=what,
    )


def running_pods(kube: Kube, namespace: str, component: str) -> list[dict[str, Any]]:
    """Pods of one component that are Running and not being deleted."""
    return [
        p
        for p in kube.pods(namespace, f"app.kubernetes.io/component={component}")
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def newest_checkpoint(path: Path) -> tuple[int, float]:
    """(env steps sampled, mtime) of the newest complete checkpoint on the claim (the run
    directory: checkpoints/ckpt-*)."""
    states = sorted(path.glob("checkpoints/ckpt-*/state.json"), key=lambda p: p.stat().st_mtime)
    if not states:
        return 0, 0.0
    state = json.loads(states[-1].read_text())
    return int(state["counters"]["num_env_steps_sampled"]), states[-1].stat().st_mtime


@pytest.fixture(scope="module")
def faulty_job(real_kube: Kube, operator: None) -> Iterator[tuple[str, Path]]:
    """A CartPole job that trains for a fixed 510 s of training time (faults do not shorten it;
    in CI, under the three small jobs, the faults before the OOM kill took ~380 s of it, and the
    Prometheus scrape ~40 s; the OOM test, the last, brings its end forward),
    checkpointing every 5 s to a claim on a 64 MiB filesystem of its own, with exactly two
    rollout pods and a learner memory limit."""
    kube = real_kube
    with kube.namespace("faults") as ns:
        checkpoints = checkpoint_claim(kube, ns, "faulty-checkpoints", FAULT_VOLUME, tmpfs=True)
        manifest = example_manifest(
            "cartpole",
            name=FAULT_JOB,
            namespace=ns,
            rollouts={"minReplicas": 2, "maxReplicas": 2, "autoscaling": {"enabled": False}},
            learner={"resources": {"limits": {"memory": LEARNER_MEMORY}}},
            checkpoint={"volumeClaim": "faulty-checkpoints", "intervalSeconds": CHECKPOINT_SECONDS},
            stop={"timeLimitSeconds": FAULT_JOB_SECONDS},
        )
        del manifest["spec"]["stop"]["episodeReturnMean"]
        kube.apply(manifest)
        with diagnosed(kube, ns):
            wait_for(
                lambda: (
                    progress_steps(kube, ns, FAULT_JOB) > 0
                    and len(running_pods(kube, ns, "rollout")) == 2
                ),
                timeout=300,
                interval=2,
                what="the faulty job training with two rollout pods",
            )
        yield ns, checkpoints


TEAMS = ("team-a", "team-b", "team-c")
"""Namespaces of the three small jobs that share the node with the fault job."""


def small_job(kube: Kube, namespace: str) -> None:
    """A small CartPole job (one rollout pod, 30,000 env steps, results on an emptyDir) in
    `namespace`."""
    manifest = example_manifest(
        "cartpole", name="small", namespace=namespace,
        rollouts={"minReplicas": 1, "maxReplicas": 1}, stop={"timesteps": 30_000},
    )  # fmt: skip
    del manifest["spec"]["checkpoint"]["volumeClaim"]
    del manifest["spec"]["stop"]["episodeReturnMean"]
    kube.apply(manifest)


@pytest.fixture(scope="module")
def team_jobs(real_kube: Kube, faulty_job: tuple[str, Path]) -> Iterator[list[str]]:
    """Three small jobs of other teams, applied once the fault job trains: four learners and five
    rollout pods share the 2-core node, through the faults that follow (the API server and the
    kubelet restart under all four)."""
    with contextlib.ExitStack() as teams:
        namespaces = [teams.enter_context(real_kube.namespace(team)) for team in TEAMS]
        for ns in namespaces:
            small_job(real_kube, ns)
        log(f"applied 3 small jobs beside {FAULT_JOB}: {namespaces}")
        yield namespaces


def test_progress_rises_and_reads_live(
    real_kube: Kube, faulty_job: tuple[str, Path], team_jobs: list[str], tmp_path: Path
) -> None:
    """`kubectl get ij` shows steps rising; `impalajob status` reads the sidecar mid-run (the
    token from the job's Secret, through a port-forward), ahead of or equal to what the operator
    last published; the sidecar refuses a wrong token."""
    kube, (ns, _) = real_kube, faulty_job
    seen: list[int] = []

    def rising() -> bool:
        row = kube.kubectl("get", "ij", FAULT_JOB, "-n", ns).stdout.strip().splitlines()[-1]
        steps = progress_steps(kube, ns, FAULT_JOB)
        if not seen or steps != seen[-1]:
            seen.append(steps)
            log(f"kubectl get ij: {row}")
        return len(seen) >= 3

    wait_for(rising, timeout=120, interval=2, what="three distinct progress values")
    assert seen == sorted(seen), seen
    live = json.loads(kubectl_impalajob(kube, "status", FAULT_JOB, "-n", ns, "--json"))
    log(f"kubectl impalajob status {FAULT_JOB} (mid-run): {live['counters']}")
    assert live["phase"] == "Running"
    assert live["counters"]["num_env_steps_sampled"] >= seen[-1]
    # Security is on: the operator made the job's Secret, and a wrong token gets nothing.
    secret = kube.get("secret", f"{FAULT_JOB}-auth", "-n", ns)
    assert set(secret["data"]) == {"status-token", "ray-token"}
    wrong = tmp_path / "wrong-token"
    wrong.write_text("wrong")
    refused = subprocess.run(
        [sys.executable, "-m", "impala_cli.main", "status", FAULT_JOB, "-n", ns,
         "--token-file", str(wrong)],
        capture_output=True, text=True, timeout=60, env=kube.env, check=False,
    )  # fmt: skip
    assert refused.returncode == 1 and "answered 401" in refused.stderr, refused.stderr

    # `impalajob logs` finds the pods by the job's name: the learner's progress lines, and each
    # rollout pod's lines under its pod's name.
    learner_log = impalajob(kube, "logs", FAULT_JOB, "-n", ns, "--tail", "20")
    assert f"[{FAULT_JOB}]" in learner_log and "steps" in learner_log, learner_log
    rollout_log = impalajob(kube, "logs", FAULT_JOB, "-n", ns, "--role", "rollout", "--tail", "5")
    assert f"[{FAULT_JOB}-rollout-" in rollout_log, rollout_log


NETPOL_AGENT = "network-policies"


def network_policy_agent_kubeconfig(kube: Kube) -> Path:
    """A kubeconfig for kube-router's policy controller (the API server at the address the node
    reaches): a service account that may read what NetworkPolicies select on."""
    rules = [
        {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes", "services", "endpoints"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
         "verbs": ["get", "list", "watch"]},
    ]  # fmt: skip
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NETPOL_AGENT}
    subject = {"kind": "ServiceAccount", "name": NETPOL_AGENT, "namespace": "kube-system"}
    for obj in (
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": NETPOL_AGENT, "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": NETPOL_AGENT}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": NETPOL_AGENT}, "roleRef": ref, "subjects": [subject]},
    ):  # fmt: skip
        kube.apply(obj)
    return kube.sa_kubeconfig("kube-system", NETPOL_AGENT, duration="1h")


def test_network_policy_admits_the_status_port_only_to_labelled_pods(
    real_kube: Kube, faulty_job: tuple[str, Path]
) -> None:
    """With a NetworkPolicy agent on the node (the bridge CNI enforces none), the job's policy
    is what lets traffic through: a pod of the namespace reaches neither the learner's status
    port nor its Ray port until it carries `impala.dev/status-access`, and then only the status
    port; the job's own Ray traffic and the operator's status reads (another namespace, the
    label) go on, so the job keeps training and reporting."""
    kube, (ns, _) = real_kube, faulty_job
    learner = running_pods(kube, ns, "learner")[0]
    ip, image = learner["status"]["podIP"], learner["spec"]["containers"][0]["image"]
    restricted = {
        "runAsNonRoot": True, "runAsUser": RUN_AS, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    client = {
        "name": "client", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-c", "import time; time.sleep(86400)"],
        "securityContext": restricted,
    }  # fmt: skip
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "client", "namespace": ns},
            "spec": {"containers": [client], "terminationGracePeriodSeconds": 1},
        }
    )
    wait_for(
        lambda: kube.get("pod", "client", "-n", ns)["status"].get("phase") == "Running",
        timeout=120,
        what="the client pod",
    )

    def reaches(port: int) -> bool:
        return pod_reaches(kube, ns, "client", ip, port)

    status_port, ray_port = STATUS_PORT, RayPorts().gcs
    # No agent yet: the policy exists but nothing enforces it.
    assert reaches(status_port) and reaches(ray_port)
    agent_kubeconfig = network_policy_agent_kubeconfig(kube)
    node = RealNode(kube.bin_dir or Path(), kube.workdir)
    agent_log = node.dir / "network-policies" / "agent.log"

    def enforced() -> bool:
        assert agent.poll() is None, agent_log.read_text()[-3000:]
        return not reaches(status_port)

    with node.network_policies_enforced(agent_kubeconfig, SERVICE_CIDR) as agent:
        wait_for(
            enforced,
            timeout=120,
            fatal=(AssertionError,),
            what="the agent to enforce the job's NetworkPolicy",
        )
        assert not reaches(ray_port)
        log(f"NetworkPolicy enforced: an unlabelled pod reaches neither {ip}:{status_port} nor "
            f":{ray_port}")  # fmt: skip
        kube.kubectl("label", "pod", "client", "-n", ns, f"{STATUS_ACCESS_LABEL}=true")
        wait_for(lambda: reaches(status_port), timeout=60, what="the labelled pod admitted")
        assert not reaches(ray_port)  # status access is not Ray access
        # The job's own traffic (rollout nodes to the learner's Ray) and the operator's status
        # reads pass: the steps the operator publishes keep rising.
        progress_moves(kube, ns, timeout=60, what="progress under the enforced policy")
        assert agent.poll() is None, agent_log.read_text()[-3000:]
    log("labelled pod admitted to the status port only; the job trained on under the policy")
    # Stopped and its rules cleaned up, the node enforces nothing again.
    assert agent.returncode is not None and reaches(ray_port)
    kube.kubectl("delete", "pod", "client", "-n", ns, "--wait=false")


# Dashboard series a job has only with what this one lacks: an evaluation (spec.evaluation),
# policies (a PettingZoo env), a failed reconcile.
NEEDS_MORE = {
    "impala_evaluation_return_mean", "impala_evaluation_win_rate",
    "impala_policy_episode_return_mean", "impala_operator_reconcile_errors_total",
}  # fmt: skip
DASHBOARD = CHART / "dashboards" / "impalajob.json"


def test_prometheus_scrapes_the_job_through_its_network_policy_and_fills_the_dashboard(
    real_kube: Kube, faulty_job: tuple[str, Path]
) -> None:
    """A Prometheus in `monitoring`, configured as the Prometheus Operator renders the chart's
    ServiceMonitor and PodMonitor, scrapes the operator and the job's sidecar on its metrics
    port while the job's NetworkPolicy is enforced (the port is admitted; the status port is
    not); every dashboard query returns series for this job."""
    kube, (ns, _) = real_kube, faulty_job
    bin_dir = kube.bin_dir or build_binaries(quiet=True)
    learner = running_pods(kube, ns, "learner")[0]
    ip, image = learner["status"]["podIP"], learner["spec"]["containers"][0]["image"]
    config = {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "scrape_configs": [
            *(monitoring.service_monitor_scrape(m)
              for m in kube.get("servicemonitor", "-n", OPERATOR_NS)["items"]),
            *(monitoring.pod_monitor_scrape(m)
              for m in kube.get("podmonitor", "-n", OPERATOR_NS)["items"]),
        ],
    }  # fmt: skip
    kube.kubectl("create", "namespace", MONITORING_NS)
    try:
        for obj in monitoring.prometheus_objects(MONITORING_NS, image, bin_dir, config):
            kube.apply(obj)
        wait_for(lambda: kube.get("pod", "prometheus", "-n", MONITORING_NS)["status"]
                 .get("phase") == "Running", timeout=120, what="the Prometheus pod")  # fmt: skip
        _scraped_through_the_policy(kube, ns, ip)
        _dashboard_has_series(kube, ns)
    finally:
        kube.kubectl("delete", "namespace", MONITORING_NS, "--wait=false", check=False)
        kube.kubectl("delete", "clusterrole,clusterrolebinding", f"{MONITORING_NS}-prometheus",
                     check=False)  # fmt: skip


def prometheus_query(kube: Kube, query: str) -> list[dict[str, Any]]:
    """An instant query, through the API server's proxy to the Prometheus pod."""
    path = (f"/api/v1/namespaces/{MONITORING_NS}/pods/prometheus:9090/proxy/api/v1/query?"
            + urllib.parse.urlencode({"query": query}))  # fmt: skip
    proc = kube.kubectl("get", "--raw", path, check=False, timeout=30)
    return list(json.loads(proc.stdout)["data"]["result"]) if proc.returncode == 0 else []


def _scraped_through_the_policy(kube: Kube, ns: str, ip: str) -> None:
    job = f'namespace="{ns}", job="{FAULT_JOB}"'
    wait_for(lambda: prometheus_query(kube, f"impala_env_steps_sampled_total{{{job}}}"),
             timeout=90, what="the first scrape of the job's sidecar")  # fmt: skip
    node = RealNode(kube.bin_dir or Path(), kube.workdir)
    with node.network_policies_enforced(network_policy_agent_kubeconfig(kube), SERVICE_CIDR):

        def reaches(port: int) -> bool:
            return pod_reaches(kube, MONITORING_NS, "prometheus", ip, port)

        wait_for(lambda: not reaches(STATUS_PORT), timeout=120,
                 what="the agent to enforce the job's NetworkPolicy")  # fmt: skip
        assert reaches(METRICS_PORT), "the monitoring namespace is admitted to the metrics port"
        enforced = time.time()
        fresh = f"timestamp(impala_env_steps_sampled_total{{{job}}}) > {enforced}"
        wait_for(lambda: prometheus_query(kube, fresh), timeout=60,
                 what="a scrape of the sidecar under the enforced policy")  # fmt: skip
    (sample,) = prometheus_query(kube, f"impala_env_steps_sampled_total{{{job}}}")
    log(f"Prometheus scraped {sample['metric']['pod']} through the NetworkPolicy: "
        f"{int(float(sample['value'][1]))} env steps")  # fmt: skip
    series = prometheus_query(kube, f"count({{{job}}})")
    log(f"Prometheus: {series[0]['value'][1]} series of job {ns}/{FAULT_JOB}")
    (phase,) = prometheus_query(kube, f'impala_operator_job_phase{{{job}, phase="Running"}}')
    assert phase["value"][1] == "1", phase
    assert prometheus_query(kube, "sum(impala_operator_leader)")[0]["value"][1] == "1"


def _dashboard_has_series(kube: Kube, ns: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    empty = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$namespace", ns).replace("$job", FAULT_JOB)
            expr = expr.replace('namespace=~"' + ns + '"', f'namespace="{ns}"')
            if any(name in expr for name in NEEDS_MORE):
                continue
            if not prometheus_query(kube, expr):
                empty.append(f"{panel['title']}: {expr}")
    assert not empty, f"panels without series for {ns}/{FAULT_JOB}: {empty}"
    log(f"every dashboard query of {ns}/{FAULT_JOB} returns series")


def _pins(lines: list[str]) -> dict[str, str]:
    """`name==version` lines (a lock's or pip's) as {normalised name: version}."""
    pins = (line.split()[0].split("==") for line in lines if "==" in line and line[0].isalnum())
    return {name.lower().replace("_", "-").replace(".", "-"): version for name, version in pins}


def test_the_image_runs_the_locked_versions(real_kube: Kube, faulty_job: tuple[str, Path]) -> None:
    """The product image, as a learner pod runs it, holds exactly requirements/runtime.lock's
    versions (hack/build-image.sh installs the lock, whatever Python ran the build)."""
    kube, (ns, _) = real_kube, faulty_job
    learner = running_pods(kube, ns, "learner")[0]["metadata"]["name"]
    pip_list = ["python3", "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"]
    proc = kube.kubectl("exec", "-n", ns, learner, "-c", "learner", "--", *pip_list, timeout=60)
    installed = _pins(proc.stdout.splitlines())
    locked = _pins((ROOT / "requirements" / "runtime.lock").read_text().splitlines())
    differ = {n: (v, installed.get(n)) for n, v in locked.items() if installed.get(n) != v}
    assert not differ, f"(locked, in the image): {differ}"
    extra = set(installed) - set(locked) - {"impalajob", "pip"}
    assert not extra, f"in the image but not in the lock: {sorted(extra)}"


def members(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    """The driver's actor membership, live from the sidecar (through a port-forward)."""
    return list(impalajob_status(kube, namespace, name)["membership"]["members"])


def test_deleted_rollout_pod_is_replaced(real_kube: Kube, faulty_job: tuple[str, Path]) -> None:
    kube, (ns, _) = real_kube, faulty_job
    pods = running_pods(kube, ns, "rollout")
    old = {p["metadata"]["name"] for p in pods}
    victim, victim_ip = pods[0]["metadata"]["name"], pods[0]["status"]["podIP"]
    before = progress_steps(kube, ns, FAULT_JOB)
    kube.kubectl("delete", "pod", "-n", ns, victim, "--wait=false")
    log(f"deleted rollout pod {victim} ({victim_ip}) at {before} steps")
    t0 = time.monotonic()
    seen = [before]

    def replaced() -> str | None:
        seen.append(progress_steps(kube, ns, FAULT_JOB))
        # The new pod by name: the list is sorted by name, so its position says nothing (taking
        # the last one picked the surviving pod half the time, whose actor had long sampled).
        new = [p for p in running_pods(kube, ns, "rollout") if p["metadata"]["name"] not in old]
        return new[0]["status"]["podIP"] if new else None

    new_ip = wait_for(replaced, timeout=180, interval=2, what="a new rollout pod")

    def joined() -> list[dict[str, Any]]:
        seen.append(progress_steps(kube, ns, FAULT_JOB))
        return [
            m
            for m in members(kube, ns, FAULT_JOB)
            if m["node_ip"] == new_ip and m["state"] == "healthy" and m["env_steps"] > 0
        ]

    wait_for(joined, timeout=180, interval=3, what=f"an actor on the new pod ({new_ip}) to sample")
    log(f"the new rollout pod's actor sampled {time.monotonic() - t0:.0f} s after the delete")
    listed: list[dict[str, Any]] = []

    def released() -> list[dict[str, Any]]:
        listed[:] = members(kube, ns, FAULT_JOB)
        gone = [m for m in listed if m["node_ip"] == victim_ip]
        return gone if gone and all(m["state"] == "dead" for m in gone) else []

    # The deleted pod drains: its actor is released once its in-flight fragment arrived, and
    # every env step it sampled reached the driver (its own count equals the driver's), so the
    # job's counters stay exact.
    try:
        gone = wait_for(released, timeout=60, interval=2, what=f"the actors on {victim_ip} to go")
    except TimeoutError as err:
        raise AssertionError(f"{err}; members: {listed}") from None
    assert all(m["env_steps_produced"] == m["env_steps"] > 0 for m in gone), gone
    assert seen == sorted(seen), seen
    assert job_status(kube, ns, FAULT_JOB)["phase"] == "Running"


def test_deleted_operator_pod_converges(real_kube: Kube, faulty_job: tuple[str, Path]) -> None:
    kube, (ns, _) = real_kube, faulty_job
    # The leader goes: the standby must take the Lease over and carry on.
    old = operator_leader(kube)
    assert old in [p["metadata"]["name"] for p in kube.pods(OPERATOR_NS)], old
    kube.kubectl("delete", "pod", "-n", OPERATOR_NS, old, "--wait=false")
    log(f"deleted the leading operator pod {old} at {progress_steps(kube, ns, FAULT_JOB)} steps")
    # Until the old pod is gone it may still write status; only the new one's writes count.
    wait_for(
        lambda: [p["metadata"]["name"] for p in kube.pods(OPERATOR_NS)] not in ([old], []),
        timeout=180,
        interval=2,
        what="a new operator pod",
    )
    wait_for(
        lambda: old not in [p["metadata"]["name"] for p in kube.pods(OPERATOR_NS)],
        timeout=180,
        interval=2,
        what=f"the old operator pod {old} to be gone",
    )
    new = wait_for(
        lambda: operator_leader(kube) not in ("", old) and operator_leader(kube),
        timeout=120,
        interval=2,
        what="another operator pod to lead",
    )
    log(f"{new} leads now")
    # The new operator picks the job up where it was: status moves again ...
    progress_moves(kube, ns, timeout=120, what="the new operator to report progress")
    # ... and creates nothing twice.
    learners = [p for p in kube.pods(ns, "app.kubernetes.io/component=learner")]
    assert [p["metadata"]["name"] for p in learners] == [f"{FAULT_JOB}-learner-0"]
    deployments = kube.get("deployments", "-n", ns)["items"]
    assert sorted(d["metadata"]["name"] for d in deployments) == [
        f"{FAULT_JOB}-aggregator",
        f"{FAULT_JOB}-rollout",
    ]
    assert len(running_pods(kube, ns, "rollout")) == 2
    assert job_status(kube, ns, FAULT_JOB)["phase"] == "Running"


def _pods(kube: Kube, ns: str) -> tuple[tuple[str, str, int], list[str]]:
    """The fault job's learner (pod uid, learner container id, restart count) and its running
    rollout pods' uids: equal before and after a fault means nothing was restarted."""
    pod = kube.get("pod", f"{FAULT_JOB}-learner-0", "-n", ns)
    (learner,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "learner"]
    rollouts = sorted(p["metadata"]["uid"] for p in running_pods(kube, ns, "rollout"))
    return (pod["metadata"]["uid"], learner["containerID"], learner["restartCount"]), rollouts


def operator_restarts(kube: Kube) -> dict[str, int]:
    """Container restarts of each operator pod."""
    return {
        p["metadata"]["name"]: int(p["status"]["containerStatuses"][0]["restartCount"])
        for p in kube.pods(OPERATOR_NS)
    }


def _api_ready(kube: Kube) -> bool:
    return kube.kubectl("get", "--raw", "/readyz", check=False).returncode == 0


def test_api_server_and_etcd_restart_mid_run(real_kube: Kube, faulty_job: tuple[str, Path]) -> None:
    """etcd and the API server stop for 10 s and start again: the pods train on meanwhile, the
    operator reconnects and publishes progress again, nothing is restarted or created twice."""
    kube, (ns, _) = real_kube, faulty_job
    assert kube.restart is not None
    pods_before, steps_before = _pods(kube, ns), progress_steps(kube, ns, FAULT_JOB)
    leader_before = operator_leader(kube)
    restarts_before = operator_restarts(kube)
    t0 = time.monotonic()
    kube.restart("etcd", "kube-apiserver", down=10)
    wait_for(lambda: _api_ready(kube), timeout=180, interval=1, what="the API server back")
    back = time.monotonic() - t0
    # Where the rest goes: a leader that could not renew its 15 s Lease while the API was away
    # stops leading (it exits, as client-go's leaders do) and the standby takes the Lease over.
    api_back = _utc(time.monotonic())

    def renewed() -> str | None:
        lease = kube.get("lease", "impala-operator", "-n", OPERATOR_NS)["spec"]
        fresh = str(lease.get("renewTime") or "") > api_back
        return str(lease.get("holderIdentity") or "") if fresh else None

    leading = wait_for(renewed, timeout=120, interval=1, what="the Lease renewed after the restart")
    led = time.monotonic() - t0
    progress_moves(kube, ns, timeout=180, what="progress published after the restart")
    reported = time.monotonic() - t0
    steps_after = progress_steps(kube, ns, FAULT_JOB)
    restarts = operator_restarts(kube)
    log(f"API server + etcd down 10 s: serving again after {back:.0f} s, Lease held by "
        f"{leading} (before: {leader_before}) at {led:.0f} s, operator container restarts "
        f"{restarts}, progress published after {reported:.0f} s; {steps_before} -> "
        f"{steps_after} steps")  # fmt: skip
    REAL_NODE_REPORT.append(
        f"fault: API server + etcd restart: API back {back:.0f} s, a leader {led:.0f} s "
        f"({'the same' if leading == leader_before else 'the standby'}), "
        f"progress published {reported:.0f} s after the stop, "
        f"{steps_after - steps_before} steps trained across it, no pod restarted"
    )
    assert _pods(kube, ns) == pods_before  # the same containers trained on
    st = job_status(kube, ns, FAULT_JOB)
    assert st["phase"] == "Running" and st["learner"]["restarts"] == 0, st
    # The leader may exit (its Lease could not be renewed); the standby waits the outage out.
    standbys = [name for name in restarts_before if name != leader_before]
    assert all(restarts[n] == restarts_before[n] for n in standbys), (restarts_before, restarts)


def test_kubelet_restart_keeps_the_pods_running(
    real_kube: Kube, faulty_job: tuple[str, Path]
) -> None:
    """The kubelet stops for 5 s and starts again (an upgrade, a crash): containers run on
    under containerd, the kubelet adopts them, the job goes on with no pod restarted."""
    kube, (ns, _) = real_kube, faulty_job
    assert kube.restart is not None
    pods_before, steps_before = _pods(kube, ns), progress_steps(kube, ns, FAULT_JOB)
    t0 = time.monotonic()
    kube.restart("kubelet", down=5)

    def node_ready() -> bool:
        node = kube.get("node", NODE_NAME)
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        heartbeat = ready[0].get("lastHeartbeatTime", "") if ready else ""
        return bool(ready) and ready[0]["status"] == "True" and heartbeat > _utc(t0)

    wait_for(node_ready, timeout=180, interval=2, what="the node Ready on a new heartbeat")
    progress_moves(kube, ns, timeout=120, what="progress after the kubelet restart")
    steps_after = progress_steps(kube, ns, FAULT_JOB)
    log(f"kubelet down 5 s: node Ready again and progress moving after "
        f"{time.monotonic() - t0:.0f} s; {steps_before} -> {steps_after} steps")  # fmt: skip
    REAL_NODE_REPORT.append(
        f"fault: kubelet restart: node Ready and progress moving {time.monotonic() - t0:.0f} s "
        f"after the stop, {steps_after - steps_before} steps trained across it"
    )
    assert _pods(kube, ns) == pods_before
    assert job_status(kube, ns, FAULT_JOB)["learner"]["restarts"] == 0


def _utc(monotonic_then: float) -> str:
    """The RFC 3339 time (UTC, seconds) of a past `time.monotonic()` reading."""
    wall = time.time() - (time.monotonic() - monotonic_then)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def _ctr(
    kube: Kube, *args: str, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`ctr` against the real node's containerd, in the CRI's namespace."""
    socket = RealNode(Path("."), kube.workdir).containerd_socket
    return subprocess.run(
        ["ctr", "--address", str(socket), "-n", "k8s.io", *args],
        check=check, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (status,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == name]
    return dict(status)


def _task_pid(kube: Kube, container_id: str) -> int:
    """The host PID of a running container's init process."""
    for line in _ctr(kube, "tasks", "ls").stdout.splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == container_id.removeprefix("containerd://"):
            return int(pid)
    raise AssertionError(f"no task for {container_id}")


CUT_SECONDS = 30


def _iptables(netns_fd: int, script: str) -> None:
    """A shell script of iptables commands in the network namespace `netns_fd` refers to (held
    open, so it outlives a container restart: the namespace is the pod sandbox's)."""
    subprocess.run(
        ["nsenter", f"--net=/proc/self/fd/{netns_fd}", "--", "sh", "-ec", script],
        check=True, capture_output=True, timeout=30, pass_fds=(netns_fd,),
    )  # fmt: skip


def test_network_cut_between_rollouts_and_learner_heals(
    real_kube: Kube, faulty_job: tuple[str, Path]
) -> None:
    """For 30 s every packet between the rollout pods and the learner pod is dropped (iptables
    in each rollout pod's network namespace; the learner's Service is headless, so that is all
    of their traffic), then the rules go. The GCS declares the rollout nodes dead, their actors
    fail, the rollout pods rejoin and get new actors, training goes on: no pod restarted, no
    actor left waiting, every env step counted once."""
    kube, (ns, _) = real_kube, faulty_job
    learner_before, _ = _pods(kube, ns)
    learner_ip = kube.get("pod", f"{FAULT_JOB}-learner-0", "-n", ns)["status"]["podIP"]
    rollouts = running_pods(kube, ns, "rollout")
    restarts = {p["metadata"]["name"]: _container(p, "rollout")["restartCount"] for p in rollouts}
    fds = [
        os.open(f"/proc/{_task_pid(kube, _container(p, 'rollout')['containerID'])}/ns/net",
                os.O_RDONLY)
        for p in rollouts
    ]  # fmt: skip
    steps_before = progress_steps(kube, ns, FAULT_JOB)
    try:
        cut = (
            f"iptables -N IMPALA-CUT; iptables -A IMPALA-CUT -s {learner_ip} -j DROP; "
            f"iptables -A IMPALA-CUT -d {learner_ip} -j DROP; "
            "iptables -I INPUT -j IMPALA-CUT; iptables -I OUTPUT -j IMPALA-CUT"
        )
        for fd in fds:
            _iptables(fd, cut)
        log(f"network cut between {sorted(restarts)} and the learner ({learner_ip})")
        time.sleep(CUT_SECONDS)
        steps_cut = progress_steps(kube, ns, FAULT_JOB)
    finally:
        for fd in fds:
            _iptables(fd, "iptables -D INPUT -j IMPALA-CUT; iptables -D OUTPUT -j IMPALA-CUT; "
                          "iptables -F IMPALA-CUT; iptables -X IMPALA-CUT")  # fmt: skip
            os.close(fd)
    healed = time.monotonic()
    progress_moves(kube, ns, timeout=180, what="progress after the network came back")
    moving = time.monotonic() - healed

    def rejoined() -> dict[str, Any] | None:
        live = impalajob_status(kube, ns, FAULT_JOB)
        ips = {p["status"]["podIP"] for p in running_pods(kube, ns, "rollout")}
        current = [m for m in live["membership"]["members"] if m["state"] != "dead"]
        sampling = {m["node_ip"] for m in current if m["state"] == "healthy" and m["env_steps"]}
        return live if len(current) == 2 and len(ips) == 2 and ips == sampling else None

    live = wait_for(rejoined, timeout=180, interval=3, what="one sampling actor per rollout pod")
    members_ = live["membership"]["members"]
    dead = [m["actor_id"] for m in members_ if m["state"] == "dead"]
    log(f"network healed: progress moving {moving:.0f} s later, actors {dead} replaced; steps "
        f"{steps_before} before, {steps_cut} at the heal")  # fmt: skip
    REAL_NODE_REPORT.append(
        f"fault: network cut {CUT_SECONDS} s: progress moving {moving:.0f} s after the heal, "
        f"{len(dead)} actors replaced on the rejoined rollout nodes, no pod restarted"
    )
    # Every env step the job counts came from exactly one actor's delivered fragments.
    assert sum(m["env_steps"] for m in members_) == live["counters"]["num_env_steps_sampled"]
    assert _pods(kube, ns)[0] == learner_before  # the learner trained on, unrestarted
    after = {p["metadata"]["name"]: _container(p, "rollout")["restartCount"]
             for p in running_pods(kube, ns, "rollout")}  # fmt: skip
    assert after == restarts  # the rollout pods rejoined in place
    assert job_status(kube, ns, FAULT_JOB)["phase"] == "Running"


def _fill(path: Path) -> int:
    """Write `path` until its filesystem is full; the bytes written."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 4096):
            with contextlib.suppress(OSError):
                while True:
                    written += os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    return written


def test_a_full_checkpoint_volume_trains_on(real_kube: Kube, faulty_job: tuple[str, Path]) -> None:
    """The claim's filesystem fills up for three checkpoint intervals: the learner says so and
    trains on (nothing restarted, no checkpoint pruned), and checkpoints again once there is
    room."""
    kube, (ns, checkpoints) = real_kube, faulty_job
    phase = job_status(kube, ns, FAULT_JOB)["phase"]
    assert phase == "Running", f"the fault job is {phase}: {FAULT_JOB_SECONDS} s was too short"
    pods_before = _pods(kube, ns)
    kept = sorted(p.name for p in checkpoints.glob("checkpoints/ckpt-*"))
    filler = checkpoints / "filler"
    filled = _fill(filler)
    full_at = time.time()
    try:
        time.sleep(3 * CHECKPOINT_SECONDS)
        newest_during = newest_checkpoint(checkpoints)[1]
        still = sorted(p.name for p in checkpoints.glob("checkpoints/ckpt-*"))
    finally:
        filler.unlink()
    freed_at = time.time()
    wait_for(
        lambda: newest_checkpoint(checkpoints)[1] > freed_at,
        timeout=6 * CHECKPOINT_SECONDS,
        what="a checkpoint once there is room",
    )
    recovered = time.time() - freed_at
    pod = f"{FAULT_JOB}-learner-0"
    learner_log = kube.kubectl("logs", pod, "-n", ns, "-c", "learner", "--since=2m").stdout
    log(f"volume full ({filled >> 20} MiB written) for {freed_at - full_at:.0f} s; a checkpoint "
        f"{recovered:.1f} s after it was freed")  # fmt: skip
    REAL_NODE_REPORT.append(
        f"fault: checkpoint volume full {freed_at - full_at:.0f} s: trained on, checkpointing "
        f"again {recovered:.1f} s after the space came back"
    )
    # A checkpoint that was being written as the volume filled may have landed; none after.
    assert newest_during <= full_at + 1
    assert set(kept) - set(still) <= set(kept[:1])  # pruning waits for new checkpoints
    assert "checkpoint not written (No space left on device)" in learner_log, learner_log[-2000:]
    assert _pods(kube, ns) == pods_before
    assert job_status(kube, ns, FAULT_JOB)["phase"] == "Running"


def test_oom_killed_learner_resumes_from_the_last_good_checkpoint(
    real_kube: Kube, faulty_job: tuple[str, Path]
) -> None:
    """The learner container goes over its memory limit (a process in it fills /dev/shm, where
    Ray keeps its object store, as a runaway object store would) and the kernel's OOM killer
    ends it: no final checkpoint. The newest checkpoint is then found truncated on the claim.
    The failure is counted and named (OOMKilled); attempt 1 sets the truncated checkpoint aside,
    says so, and resumes from the one before it."""
    kube, (ns, checkpoints) = real_kube, faulty_job
    wait_for(lambda: newest_checkpoint(checkpoints)[0] > 0, timeout=60, what="a first checkpoint")
    # The last fault of the fault job: instead of running out the rest of its training time
    # (~2 min in CI), its stop is brought forward. The running learner keeps the spec it
    # started with; attempt 1 reads the job's config afresh and stops RESUMED_SECONDS of
    # training after the point it resumes from.
    trained = float(impalajob_status(kube, ns, FAULT_JOB)["wall_seconds"])
    stop = {"spec": {"stop": {"timeLimitSeconds": int(trained) + RESUMED_SECONDS}}}
    kube.kubectl("patch", "ij", FAULT_JOB, "-n", ns, "--type=merge", "-p", json.dumps(stop))
    pod_name = f"{FAULT_JOB}-learner-0"
    container = _container(kube.get("pod", pod_name, "-n", ns), "learner")["containerID"]
    at_fill = progress_steps(kube, ns, FAULT_JOB)
    hog = (
        "import time\n"
        "with open('/dev/shm/oom', 'wb') as f:\n"
        "    for _ in range(1024):\n"
        "        f.write(b'x' * (16 << 20)); f.flush(); time.sleep(0.01)\n"
    )
    exec_ = _ctr(kube, "tasks", "exec", "--exec-id", "oom", container.removeprefix("containerd://"),
                 "/opt/impalajob/bin/python3", "-c", hog, check=False, timeout=120)  # fmt: skip
    killed_at = time.time()
    assert exec_.returncode != 0, "the container's memory limit was not reached"

    def terminated() -> dict[str, Any] | None:
        state = _container(kube.get("pod", pod_name, "-n", ns), "learner")["state"]
        return state.get("terminated")

    ended = wait_for(terminated, timeout=60, interval=0.5, what="the learner container to end")
    # The learner is gone, so nothing writes the claim: the newest checkpoint is cut in half,
    # as a volume that lost its last writes leaves it.
    ckpts = sorted(checkpoints.glob("checkpoints/ckpt-*"))
    assert len(ckpts) >= 2, ckpts
    newest, good = ckpts[-1], ckpts[-2]
    weights = newest / "learner.pt"
    with weights.open("r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    good_steps = json.loads((good / "state.json").read_text())["counters"]
    good_steps = int(good_steps["num_env_steps_sampled"])
    log(f"learner container {ended['reason']} (exit {ended['exitCode']}) at ~{at_fill} steps, "
        f"{killed_at - good.stat().st_mtime:.1f} s after {good.name} ({good_steps} steps); "
        f"{newest.name} truncated")  # fmt: skip
    assert (ended["reason"], ended["exitCode"]) == ("OOMKilled", 137), ended

    def resumed() -> int:
        st = job_status(kube, ns, FAULT_JOB)
        if (st.get("learner") or {}).get("restarts") != 1:
            return 0
        live = [
            p for p in running_pods(kube, ns, "learner") if p["metadata"]["name"].endswith("-1")
        ]
        if not live:
            return 0
        return impalajob_status(kube, ns, FAULT_JOB)["counters"]["num_env_steps_sampled"]

    wait_for(resumed, timeout=300, interval=3, what="the learner's attempt 1 pod to run")
    # The sidecar serves the run directory's status, which attempt 0 last wrote: attempt 1 has
    # resumed only once its own log says so (it may still be importing torch on a busy node).
    said = f"resumed from {good.name}, the newest readable checkpoint; set aside: {newest.name}"

    def resumed_log() -> str | None:
        text = kube.kubectl("logs", f"{FAULT_JOB}-learner-1", "-n", ns, "-c", "learner").stdout
        return text if "resumed from" in text else None

    attempt1 = wait_for(
        resumed_log,
        timeout=120,
        interval=2,
        what="attempt 1 to say which checkpoint it resumed from",
    )
    first = resumed()
    log(f"attempt 1 reports {first} steps")
    REAL_NODE_REPORT.append(
        f"fault: learner OOM-killed by its {LEARNER_MEMORY} limit, newest checkpoint truncated: "
        f"resumed from {good.name} ({good_steps} steps, "
        f"{killed_at - good.stat().st_mtime:.0f} s of learning lost at most)"
    )
    # The newer, truncated checkpoint was set aside (kept for a post-mortem) and said so.
    assert said in attempt1, attempt1[-3000:]
    assert (checkpoints / "checkpoints" / f".corrupt-{newest.name}").is_dir()
    assert first >= good_steps > 0
    events = kube.kubectl("get", "events", "-n", ns, "-o", "json").stdout
    assert "learner attempt 0 exited with code 137 (OOMKilled)" in events
    st = wait_finished(kube, ns, FAULT_JOB, timeout=400)
    assert st["phase"] == "Succeeded", diagnose(kube, ns)
    log(f"fault job Succeeded {time.time() - killed_at:.0f} s after the OOM kill")
    # An OOM kill is the container's own failure: counted against backoffLimit.
    learner = st["learner"]
    assert (learner["restarts"], learner["failures"], learner["disruptions"]) == (1, 1, 0)


def test_the_other_teams_jobs_all_succeed(real_kube: Kube, team_jobs: list[str]) -> None:
    """The three small jobs that shared the node with the fault job (and its faults) all
    Succeeded: none starved. Each one's time from its creation to its completion."""
    kube = real_kube

    def finished() -> list[float] | None:
        statuses = [kube.get("ij", "small", "-n", ns) for ns in team_jobs]
        for ns, job in zip(team_jobs, statuses, strict=True):
            assert job["status"].get("phase") != "Failed", diagnose(kube, ns)
        if any(job["status"].get("phase") != "Succeeded" for job in statuses):
            return None
        return sorted(
            (_time(job["status"]["completionTime"]) - _time(job["metadata"]["creationTimestamp"]))
            for job in statuses
        )

    took = wait_for(finished, timeout=600, interval=3, what="the small jobs to succeed",
                    fatal=(AssertionError,))  # fmt: skip
    times = ", ".join(f"{t:.0f} s" for t in took)
    log(f"3 small jobs beside {FAULT_JOB}: Succeeded {times} after their creation")
    REAL_NODE_REPORT.append(
        f"4 jobs on the node at once (3 small beside the fault job): the small ones Succeeded "
        f"{times} after their creation"
    )


def _time(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_aggregator_variant_trains_and_resumes_from_the_store(
    real_kube: Kube, operator: None, s3_store: S3Server
) -> None:
    """One aggregator pod in the data path; the run directory on an emptyDir, mirrored to a real
    S3-compatible store (checkpoint.storageUri + secretRef). The learner pod is deleted mid-run:
    its replacement starts on an empty run directory and continues from the store."""
    kube = real_kube
    with kube.namespace("aggregated") as ns:
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "s3", "namespace": ns},
                "stringData": {
                    "AWS_ACCESS_KEY_ID": s3_store.access_key,
                    "AWS_SECRET_ACCESS_KEY": s3_store.secret_key,
                    "AWS_ENDPOINT_URL": s3_store.endpoint,
                },
            }
        )
        kube.apply(
            example_manifest(
                "cartpole",
                namespace=ns,
                aggregators={"minReplicas": 1, "maxReplicas": 1},
                # Stopped by steps, not at the example's return of 450: the resumed learner
                # reached 450 within seconds of the store going down (CartPole now samples
                # ~80K env steps/s), so no training was left to do without the store. 600K steps
                # leave tens of seconds; the example's 280 s limit would end it mid-fault on a
                # busy node.
                stop={"timeLimitSeconds": 900, "episodeReturnMean": None, "timesteps": 600_000},
                checkpoint={
                    "volumeClaim": None,
                    "storageUri": "s3://results/aggregated",
                    "secretRef": {"name": "s3"},
                    "intervalSeconds": CHECKPOINT_SECONDS,
                },
            )
        )
        membership: dict[str, Any] = {}

        def note_membership() -> None:
            """The driver's membership, once it counts an aggregator actor (either attempt)."""
            if not membership.get("aggregator_workers"):
                with contextlib.suppress(AssertionError, KeyError, ValueError):
                    membership.update(impalajob_status(kube, ns, "cartpole")["membership"])

        def watch() -> dict[str, Any] | None:
            st = job_status(kube, ns, "cartpole")
            if (st.get("progress") or {}).get("timesteps") and st.get("phase") == "Running":
                note_membership()
            return st if st.get("phase") in ("Succeeded", "Failed") else None

        with diagnosed(kube, ns):
            # A checkpoint of some training in the store (the learner's first one can precede
            # any step), then the learner pod goes (a node drain would do this).
            def trained_checkpoints() -> list[str] | None:
                note_membership()
                keys = store_checkpoints(s3_store, "aggregated")
                steps = keys and store_json(s3_store, keys[-1])["counters"]["num_env_steps_sampled"]
                return keys if steps else None

            first = wait_for(
                trained_checkpoints, timeout=600, interval=2, what="a trained checkpoint stored"
            )
            learner = kube.get("pod", "cartpole-learner-0", "-n", ns)
            kube.kubectl("delete", "pod", "cartpole-learner-0", "-n", ns, "--wait=false")
            # SIGTERM: the learner writes a final checkpoint and uploads it before it exits.
            stored = wait_for(
                lambda: (k := store_checkpoints(s3_store, "aggregated")) != first and k,
                timeout=120,
                interval=1,
                what="the deleted learner's final checkpoint in the store",
            )
            saved = store_json(s3_store, stored[-1])["counters"]["num_env_steps_sampled"]
            assert saved > 0
            log(f"aggregated: learner pod deleted; the store's newest checkpoint has {saved} steps")

            def replacement() -> dict[str, Any] | None:
                for p in kube.pods(ns):
                    if (
                        p["metadata"]["labels"].get("app.kubernetes.io/component") == "learner"
                        and p["metadata"]["uid"] != learner["metadata"]["uid"]
                        and p["status"]["phase"] == "Running"
                        and not p["metadata"].get("deletionTimestamp")
                    ):
                        return p
                return None

            new = wait_for(replacement, timeout=300, interval=2, what="a new learner pod")
            resumed = wait_for(
                lambda: status_counters(kube, ns, "cartpole"),
                timeout=120,
                interval=2,
                what="the new learner's status",
            )
            log(f"aggregated: {new['metadata']['name']} on an empty run directory reports "
                f"{resumed['num_env_steps_sampled']} steps")  # fmt: skip
            assert resumed["num_env_steps_sampled"] >= saved, (resumed, saved)
            # The store goes away for 60 s: training goes on (to its end, if it gets there),
            # uploads fail and are retried, and the learner does not exit before its results
            # are in the store.
            # (Once the new learner trains: its rollout pods rejoin its Ray head first.)
            down_from = wait_for(
                lambda: max(0, progress_steps(kube, ns, "cartpole") - saved),
                timeout=300, interval=2, what="the new learner to train",
            ) + saved  # fmt: skip
            s3_store.stop()
            t_down = time.monotonic()
            try:
                wait_for(
                    lambda: progress_steps(kube, ns, "cartpole") > down_from,
                    timeout=STORE_DOWN_SECONDS, interval=2, what="training without the store",
                )  # fmt: skip
                time.sleep(max(0.0, STORE_DOWN_SECONDS - (time.monotonic() - t_down)))
                down_to = progress_steps(kube, ns, "cartpole")
                phase_down = job_status(kube, ns, "cartpole").get("phase")
            finally:
                s3_store.start()
            t_back = time.monotonic()
            st = wait_for(watch, timeout=900, interval=3, what="the aggregated job to finish")
            after = time.monotonic() - t_back
            log(f"aggregated: store down {t_back - t_down:.0f} s, trained {down_from} -> "
                f"{down_to} steps meanwhile (phase then {phase_down}); the job "
                f"{st['phase']} {after:.0f} s after the store was back")  # fmt: skip
            REAL_NODE_REPORT.append(
                f"fault: S3 store down {t_back - t_down:.0f} s: {down_to - down_from} steps "
                f"trained meanwhile, every upload in the store once it was back"
            )
        log(f"aggregated: {membership.get('aggregator_workers')} aggregator and "
            f"{membership.get('rollout_workers')} rollout actors mid-run")  # fmt: skip
        # The aggregator pod's actor was in the data path, not just scheduled.
        assert membership.get("aggregator_workers", 0) >= 1, membership
        progress = st.get("progress") or {}
        log(f"aggregated: {st['phase']}, return {progress.get('episodeReturnMean')} at "
            f"{progress.get('timesteps')} steps")  # fmt: skip
        assert st["phase"] == "Succeeded", diagnose(kube, ns)
        # Learned: the run stops at a step count, not a return, and the mean of its last 100
        # episodes there moves a lot (468.12, 437.81 and 226.85 in three runs of the same code,
        # 2026-11-28); the curve in the store shows whether it reached the example's 450.
        body = store_client(s3_store).get_object(Bucket="results", Key="aggregated/history.jsonl")
        curve = [json.loads(line) for line in body["Body"].read().decode().splitlines() if line]
        best = max((p["episode_return_mean"] or 0.0) for p in curve)
        log(f"aggregated: best 100-episode mean {best} over {len(curve)} points")
        assert best >= 450, curve[-3:]
        # The deletion was a disruption, not a failure, counted and announced; the results are
        # in the store.
        learner = st["learner"]
        assert (learner["restarts"], learner["failures"], learner["disruptions"]) == (1, 0, 1)
        replaced = kube.get("events", "-n", ns, "--field-selector", "reason=LearnerReplaced")
        assert [e["type"] for e in replaced["items"]] == ["Warning"], replaced["items"]
        summary = store_json(s3_store, "aggregated/summary.json")
        assert summary["phase"] == "Succeeded" and summary["timesteps"] >= down_to > down_from
        # Nothing trained during the outage is missing from the store: its newest checkpoint
        # holds the run's final count.
        final = store_json(s3_store, store_checkpoints(s3_store, "aggregated")[-1])
        assert final["counters"]["num_env_steps_sampled"] == summary["timesteps"], final
        owner = store_json(s3_store, "aggregated/run.json")
        uid = kube.get("ij", "cartpole", "-n", ns)["metadata"]["uid"]
        assert owner == {"job": "cartpole", "uid": uid}
        # The policy out of the store, by the job's name, with this machine's credentials.
        creds = {"AWS_ACCESS_KEY_ID": s3_store.access_key,
                 "AWS_SECRET_ACCESS_KEY": s3_store.secret_key,
                 "AWS_ENDPOINT_URL": s3_store.endpoint}  # fmt: skip
        played = json.loads(impalajob(kube, "evaluate", "cartpole", "-n", ns, "--episodes", "5",
                                      "--json", env=creds, timeout=300))  # fmt: skip
        log(f"impalajob evaluate cartpole (from the store): {played['episode_return_mean']}")
        assert played["episode_return_mean"] >= GREEDY_TRAINED, played
        # Both worker groups scaled to 0 by cleanPodPolicy, and the status says so.
        wait_for(
            lambda: [job_status(kube, ns, "cartpole")[g]["summary"]
                     for g in ("rollouts", "aggregators")] == ["0/0", "0/0"],
            timeout=120, interval=2, what="ROLLOUTS and AGGREGATORS 0/0 after the job",
        )  # fmt: skip


@pytest.fixture
def kueue_on_node(real_kube: Kube) -> Iterator[None]:
    """Kueue beside the control plane (harness/cluster/kueue.py), its flavor the real node; only
    for the test that needs it, so no other test's pods pass its webhooks."""
    with kueue_harness.running(real_kube, build_binaries(), real_kube.workdir / "kueue"):
        real_kube.apply(queues.resource_flavor("node", {"kubernetes.io/hostname": NODE_NAME}))
        for name, value in (("low", 100), ("high", 1000)):
            real_kube.apply(queues.priority_class(name, value))
        yield


def test_a_preempted_job_resumes_from_its_checkpoint_unfailed(
    real_kube: Kube, operator: None, kueue_on_node: None
) -> None:
    """Kueue admits a job; a higher-priority one preempts it: its learner checkpoints on SIGTERM
    and its pods go, the other trains to the end, then the first is readmitted and its same
    attempt resumes from the checkpoint on its claim, with no failure or disruption counted."""
    kube = real_kube
    with kube.namespace("queued") as ns:
        checkpoints = checkpoint_claim(kube, ns, "low-checkpoints")

        def job(name: str, priority: str, **sections: Any) -> dict[str, Any]:
            manifest = example_manifest(
                "cartpole", name=name, namespace=ns,
                learner={"resources": {"requests": {"cpu": "200m"}}},
                rollouts={"minReplicas": 1, "maxReplicas": 1, "autoscaling": {"enabled": False},
                          "resources": {"requests": {"cpu": "200m"}}},
                **sections,
            )  # fmt: skip
            del manifest["spec"]["stop"]["episodeReturnMean"]
            if name != "low":  # only the preempted job keeps a claim: its checkpoints
                del manifest["spec"]["checkpoint"]
            return queues.queued(manifest, "queued", priority)

        low = job(
            "low", "low",
            checkpoint={"volumeClaim": "low-checkpoints", "intervalSeconds": CHECKPOINT_SECONDS},
            stop={"timeLimitSeconds": 40},
        )  # fmt: skip
        high = job("high", "high", stop={"timeLimitSeconds": 15})
        preempt = {"preemption": {"withinClusterQueue": "LowerPriority"}}
        kube.apply(queues.cluster_queue("queued", "node", queues.quota_for(low), **preempt))
        kube.apply(queues.local_queue("queued", ns, "queued"))
        kube.apply(low)
        with diagnosed(kube, ns):
            wait_for(lambda: newest_checkpoint(checkpoints)[0] > 0, timeout=300, interval=2,
                     what="the low-priority job's first checkpoint")  # fmt: skip
            t0 = time.monotonic()
            kube.apply(high)
            wait_for(
                lambda: queues.condition(job_status(kube, ns, "low"), "Admitted").get("reason")
                == "EvictedPreempted",
                timeout=60, interval=1, what="the preemption",
            )  # fmt: skip
            wait_for(lambda: not kube.pods(ns, "app.kubernetes.io/instance=low"), timeout=180,
                     interval=2, what="the low-priority job's pods gone")  # fmt: skip
            stopped = time.monotonic() - t0
            at_stop = newest_checkpoint(checkpoints)[0]
            log(f"kueue: low preempted and its pods gone {stopped:.0f} s after the high-priority "
                f"job's apply; its newest checkpoint holds {at_stop} steps")  # fmt: skip
            st = wait_finished(kube, ns, "high", timeout=400)
            assert st["phase"] == "Succeeded", diagnose(kube, ns)
            t1 = time.monotonic()
            wait_for(lambda: queues.admitted(job_status(kube, ns, "low")), timeout=120,
                     interval=1, what="the low-priority job readmitted")  # fmt: skip

            def resumed() -> int:
                if not running_pods(kube, ns, "learner"):
                    return 0
                counters = status_counters(kube, ns, "low")
                return int(counters["num_env_steps_sampled"]) if counters else 0

            first = wait_for(resumed, timeout=300, interval=3, what="low training again")
            log(f"kueue: low readmitted and training {time.monotonic() - t1:.0f} s after high "
                f"ended, from {first} steps")  # fmt: skip
            assert first >= at_stop > 0
            st = wait_finished(kube, ns, "low", timeout=400)
        assert st["phase"] == "Succeeded", diagnose(kube, ns)
        learner = st["learner"]
        assert (learner["restarts"], learner["failures"], learner["disruptions"]) == (0, 0, 0)
        workload = kube.get("workloads.kueue.x-k8s.io", "impalajob-low", "-n", ns)
        assert queues.condition(workload["status"], "Finished").get("status") == "True"
