"""ImpalaJob apply -> all children created -> status Running, for 1 and for N jobs.

Runs the e2e control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok: fake
nodes take pods to Running at once), installs the CRD, starts `impalajob operator` as a local
process and applies jobs. A watcher in this process records when each job's children first exist
(ConfigMap, 2 Services, NetworkPolicy, 2 Deployments, the learner pod) and when its
`status.phase` first reads Running. Reports p50/p95 per job, the time until the last job is
Running, and the operator's RSS (peak while the jobs start, and steady afterwards).

    python bench/operator_apply.py                     # 5 rounds of 1 job, then 100 jobs
    python bench/operator_apply.py --jobs 20 --single-rounds 3 --interval 1

No peer: nothing else runs ImpalaJobs. `--interval` is the operator's reconcile interval (the
timer that creates the learner and notices it Running), so it bounds the time to Running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client, config, watch

REPO = Path(__file__).resolve().parent.parent
# The e2e control plane is the shared harness package (harness/cluster, the tests' too), imported
# from the repository root.
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from common import RESULTS_DIR, machine_info, percentile  # noqa: E402
from harness.cluster import ControlPlane, Kube, build_binaries  # noqa: E402

CHILD_KINDS = ("ConfigMap", "Service", "NetworkPolicy", "Deployment", "Pod")
CHILDREN_PER_JOB = {"ConfigMap": 1, "Service": 2, "NetworkPolicy": 1, "Deployment": 2, "Pod": 1}
SELECTOR = "app.kubernetes.io/managed-by=impala-operator"
OPERATOR_PACKAGES = ("kopf", "kubernetes")
"""The versions this scenario records (the operator's client stack)."""


def job_manifest(name: str) -> dict[str, Any]:
    """A small job (1 rollout pod, no aggregators): children count as in CHILDREN_PER_JOB."""
    return {
        "apiVersion": "impala.dev/v1alpha1",
        "kind": "ImpalaJob",
        "metadata": {"name": name},
        "spec": {"rollouts": {"minReplicas": 1, "maxReplicas": 2}, "stop": {"timesteps": 100_000}},
    }


class Recorder:
    """Watches children and jobs in one namespace; first-seen times per job."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.lock = threading.Lock()
        self.seen: dict[str, dict[str, set[str]]] = {}  # job -> kind -> names
        self.children_at: dict[str, float] = {}
        self.running_at: dict[str, float] = {}
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        core, apps = client.CoreV1Api(self.api), client.AppsV1Api(self.api)
        net = client.NetworkingV1Api(self.api)
        custom = client.CustomObjectsApi(self.api)
        ns = self.namespace
        lists = {
            "ConfigMap": (core.list_namespaced_config_map, {"label_selector": SELECTOR}),
            "Service": (core.list_namespaced_service, {"label_selector": SELECTOR}),
            "NetworkPolicy": (net.list_namespaced_network_policy, {"label_selector": SELECTOR}),
            "Deployment": (apps.list_namespaced_deployment, {"label_selector": SELECTOR}),
            "Pod": (
                core.list_namespaced_pod,
                {"label_selector": SELECTOR + ",app.kubernetes.io/component=learner"},
            ),
        }
        for kind, (fn, kwargs) in lists.items():
            self._spawn(self._watch_children, kind, fn, {"namespace": ns, **kwargs})
        job_list = custom.list_namespaced_custom_object
        self._spawn(
            self._watch_jobs,
            job_list,
            {"group": "impala.dev", "version": "v1alpha1", "namespace": ns, "plural": "impalajobs"},
        )

    def _spawn(self, target: Any, *args: Any) -> None:
        def guarded() -> None:
            while not self.stop.is_set():
                try:
                    target(*args)
                except Exception:  # a dropped watch (or the cluster going away): re-watch
                    time.sleep(0.2)

        t = threading.Thread(target=guarded, daemon=True)
        t.start()
        self.threads.append(t)

    def _watch_children(self, kind: str, fn: Any, kwargs: dict[str, Any]) -> None:
        if not self.stop.is_set():
            w = watch.Watch()
            for event in w.stream(fn, timeout_seconds=30, **kwargs):
                now = time.monotonic()
                obj = event["object"]
                job = (obj.metadata.labels or {}).get("app.kubernetes.io/instance")
                if event["type"] != "ADDED" or not job:
                    continue
                with self.lock:
                    names = self.seen.setdefault(job, {}).setdefault(kind, set())
                    names.add(obj.metadata.name)
                    counts = {k: len(v) for k, v in self.seen[job].items()}
                    if job not in self.children_at and all(
                        counts.get(k, 0) >= n for k, n in CHILDREN_PER_JOB.items()
                    ):
                        self.children_at[job] = now
                if self.stop.is_set():
                    w.stop()

    def _watch_jobs(self, fn: Any, kwargs: dict[str, Any]) -> None:
        if not self.stop.is_set():
            w = watch.Watch()
            for event in w.stream(fn, timeout_seconds=30, **kwargs):
                now = time.monotonic()
                obj = event["object"]
                name = obj["metadata"]["name"]
                if (obj.get("status") or {}).get("phase") == "Running":
                    with self.lock:
                        self.running_at.setdefault(name, now)
                if self.stop.is_set():
                    w.stop()


def run_round(
    kube: Kube,
    api: client.ApiClient,
    names: list[str],
    ns: str,
    operator: psutil.Process,
    timeout: float,
) -> dict[str, Any]:
    """Apply `names` at once; wait until all are Running; per-job latencies and peak RSS."""
    rec = Recorder(api, ns)
    rec.start()
    time.sleep(1.0)  # the watches are established before the apply
    items = [job_manifest(n) for n in names]
    t0 = time.monotonic()
    kube.kubectl(
        "apply",
        "-n",
        ns,
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
    )
    peak = operator.memory_info().rss
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        peak = max(peak, operator.memory_info().rss)
        with rec.lock:
            if len(rec.running_at) >= len(names) and len(rec.children_at) >= len(names):
                break
        time.sleep(0.2)
    rec.stop.set()
    with rec.lock:
        children = [rec.children_at[n] - t0 for n in names if n in rec.children_at]
        running = [rec.running_at[n] - t0 for n in names if n in rec.running_at]
    if len(running) < len(names) or len(children) < len(names):
        raise RuntimeError(f"only {len(children)} jobs with children, {len(running)} Running")
    time.sleep(3.0)
    return {
        "children_s": children,
        "running_s": running,
        "peak_rss": peak,
        "steady_rss": operator.memory_info().rss,
    }


def api_floor(kube: Kube, names: list[str], ns: str, threads: int) -> list[float]:
    """The same children written straight through `kube.Api` with no operator, as fast as
    `threads` concurrent calls go: what this control plane allows at best. Per-job seconds
    from the start until that job's last child was written."""
    from impala_api.manifest import parse_manifest
    from impala_operator.build.tokens import job_tokens
    from impala_operator.lifecycle.plan import learner_pod, plan_children
    from impala_operator.runtime.kube import Api, load_api_client

    items = [job_manifest(n) for n in names]
    kube.kubectl(
        "apply",
        "-n",
        ns,
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
    )
    live = kube.get("ij", "-n", ns)["items"]

    async def write_all() -> list[float]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(threads))
        api = Api(load_api_client(str(kube.kubeconfig), pool_size=threads))
        t0 = time.monotonic()

        async def one(body: dict[str, Any]) -> float:
            job, uid = parse_manifest(body), body["metadata"]["uid"]
            await asyncio.gather(
                *(
                    api.apply(m)
                    for m in plan_children(
                        job,
                        uid,
                        {},
                        tokens=job_tokens(b"bench", uid),
                        operator_namespace="impala-system",
                    )
                )
            )
            await api.create(learner_pod(job, uid, 0))
            return time.monotonic() - t0

        return list(await asyncio.gather(*(one(b) for b in live)))

    return asyncio.run(write_all())


def cleanup(kube: Kube, ns: str) -> None:
    kube.kubectl("delete", "ij", "--all", "-n", ns, "--wait=true", timeout=600)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100, help="jobs applied at once")
    parser.add_argument("--single-rounds", type=int, default=5, help="rounds of one job")
    parser.add_argument("--interval", type=float, default=5.0, help="operator reconcile interval")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)

    with ControlPlane.start(build_binaries(quiet=True)) as kube:
        kube.kubectl("apply", "-f", str(REPO / "manifests" / "crd.yaml"))
        kube.kubectl("wait", "--for=condition=Established", "crd/impalajobs.impala.dev")
        ns = "bench"
        kube.kubectl("create", "namespace", ns)
        api = config.new_client_from_config(config_file=str(kube.kubeconfig))
        env = {
            **kube.env,
            "IMPALA_OPERATOR_RECONCILE_INTERVAL": str(args.interval),
            "IMPALA_OPERATOR_HEALTH_PORT": "0",
            "IMPALA_OPERATOR_METRICS_PORT": "0",
        }
        log = (kube.workdir / "operator.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "impala_cli.main", "operator", "--namespace", ns],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            operator = psutil.Process(proc.pid)
            time.sleep(5.0)  # operator start-up (kopf login, discovery, watches)
            idle_rss = operator.memory_info().rss
            single: list[dict[str, Any]] = []
            for i in range(args.single_rounds):
                single.append(run_round(kube, api, [f"one-{i}"], ns, operator, args.timeout))
                cleanup(kube, ns)
            names = [f"job-{i:03d}" for i in range(args.jobs)]
            started = time.monotonic()
            many = run_round(kube, api, names, ns, operator, args.timeout)
            elapsed = time.monotonic() - started
            cpu = operator.cpu_times()
            cleanup(kube, ns)
            kube.kubectl("create", "namespace", "floor")
            floor = api_floor(kube, [f"floor-{i:03d}" for i in range(args.jobs)], "floor", 32)
        finally:
            proc.terminate()
            proc.wait(timeout=60)

    one_children = [r["children_s"][0] for r in single]
    one_running = [r["running_s"][0] for r in single]
    result = {
        "scenario": "operator_apply",
        "interval_s": args.interval,
        "one_job": {
            "rounds": len(single),
            "children_p50_s": round(statistics.median(one_children), 2),
            "running_p50_s": round(statistics.median(one_running), 2),
        },
        "many_jobs": {
            "jobs": args.jobs,
            "children_p50_s": round(percentile(many["children_s"], 0.5), 2),
            "children_p95_s": round(percentile(many["children_s"], 0.95), 2),
            "running_p50_s": round(percentile(many["running_s"], 0.5), 2),
            "running_p95_s": round(percentile(many["running_s"], 0.95), 2),
            "all_running_s": round(max(many["running_s"]), 2),
            "round_s": round(elapsed, 1),
        },
        "api_floor": {
            "jobs": args.jobs,
            "children_p50_s": round(percentile(floor, 0.5), 2),
            "children_p95_s": round(percentile(floor, 0.95), 2),
            "all_children_s": round(max(floor), 2),
        },
        "rss_mib": {
            "idle": round(idle_rss / 2**20, 1),
            "peak_1_job": round(max(r["peak_rss"] for r in single) / 2**20, 1),
            "peak_many": round(many["peak_rss"] / 2**20, 1),
            "steady_many": round(many["steady_rss"] / 2**20, 1),
        },
        "operator_cpu_s": round(cpu.user + cpu.system, 1),
        "machine": machine_info(OPERATOR_PACKAGES),
        "command": " ".join(["python bench/operator_apply.py", *argv]),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(
        f"{'jobs':>5} | {'children p50 s':>14} | {'children p95 s':>14} | "
        f"{'Running p50 s':>13} | {'Running p95 s':>13}"
    )
    o, m = result["one_job"], result["many_jobs"]
    print(f"{1:>5} | {o['children_p50_s']:>14} | {'-':>14} | {o['running_p50_s']:>13} | {'-':>13}")
    print(
        f"{m['jobs']:>5} | {m['children_p50_s']:>14} | {m['children_p95_s']:>14} | "
        f"{m['running_p50_s']:>13} | {m['running_p95_s']:>13}"
    )
    f = result["api_floor"]
    print(
        f"{m['jobs']:>5} | {f['children_p50_s']:>14} | {f['children_p95_s']:>14} | "
        f"{'(floor: children written directly, no operator)':>29}"
    )
    print(f"operator RSS MiB: {result['rss_mib']}")
    print(json.dumps(result))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "operator_apply.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
