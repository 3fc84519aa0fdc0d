"""Operator at scale under Kueue: N queued jobs at once, a ClusterQueue with room for K of them.

Runs the e2e control plane (kwok nodes take pods to Running at once) with the API server's audit
log on, a real Kueue beside it (harness/cluster/kueue.py), and `impalajob operator` as a local
process under the manifests' ServiceAccount (so the audit log tells its calls apart). All N jobs
are applied in one `kubectl apply`; each job that reaches Running is ended `--run-seconds` later
(its learner pod exits 0 through kwok), so the queue turns over until every job has Succeeded.

Reports, per job, the wait from the apply to Kueue's admission, to Running and to Succeeded
(p50/p95/max: the max is the starvation check), the most jobs running at once (never above K),
the operator's reconcile latency (its `impala_operator_reconcile_seconds` histogram), its API
requests per job by verb and resource (from the audit log), its CPU seconds and RSS.

    python bench/operator_queue.py                           # 200 jobs, room for 50
    python bench/operator_queue.py --jobs 40 --room 10 --interval 2
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
# The e2e control plane and Kueue's quotas are the shared harness package (harness/, the tests'
# too), imported from the repository root.
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from common import RESULTS_DIR, machine_info, percentile  # noqa: E402
from harness import queues  # noqa: E402
from harness.cluster import ControlPlane, Kube, build_binaries  # noqa: E402
from harness.cluster import kueue as kueue_harness  # noqa: E402
from impala_trainer.node.ray_node import free_port  # noqa: E402

OPERATOR_USER = "system:serviceaccount:impala-system:impala-operator"
NS = "bench"


def job_manifest(name: str) -> dict[str, Any]:
    """A small queued job: a learner and one rollout pod, each asking for 250m and 256Mi."""
    requests = {"resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}}
    return queues.queued(
        {
            "apiVersion": "impala.dev/v1alpha1",
            "kind": "ImpalaJob",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "learner": requests,
                "rollouts": {"minReplicas": 1, "maxReplicas": 1, **requests},
                "stop": {"timesteps": 100_000},
            },
        },
        "bench",
    )


def drive(kube: Kube, names: list[str], run_seconds: float, timeout: float) -> dict[str, Any]:
    """Apply the jobs, end each `run_seconds` after it runs, until all have Succeeded."""
    started = time.monotonic()
    items = [job_manifest(n) for n in names]
    kube.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                       "items": items}))  # fmt: skip
    admitted: dict[str, float] = {}
    running: dict[str, float] = {}
    succeeded: dict[str, float] = {}
    ended: set[str] = set()
    most = 0
    while len(succeeded) < len(names):
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{len(succeeded)}/{len(names)} jobs succeeded in {timeout}s")
        now = time.monotonic() - started
        live = 0
        for item in kube.get("ij", "-n", NS)["items"]:
            name, status = item["metadata"]["name"], item.get("status") or {}
            if queues.admitted(status):
                admitted.setdefault(name, now)
            phase = status.get("phase")
            if phase == "Running":
                running.setdefault(name, now)
                live += 1
                if now - running[name] >= run_seconds and name not in ended:
                    kube.end_pod(NS, f"{name}-learner-0", exit_code=0)
                    ended.add(name)
            elif phase == "Succeeded":
                succeeded.setdefault(name, now)
        most = max(most, live)
        time.sleep(1.0)
    return {
        "admitted_s": [admitted[n] for n in names],
        "running_s": [running[n] for n in names],
        "succeeded_s": [succeeded[n] for n in names],
        "most_running": most,
        "all_done_s": time.monotonic() - started,
    }


def audit_counts(log: Path, user: str) -> collections.Counter[str]:
    """Requests of `user` in the API server's audit log, by `verb resource[/subresource]`."""
    counts: collections.Counter[str] = collections.Counter()
    with log.open() as lines:
        for line in lines:
            event = json.loads(line)
            if event.get("user", {}).get("username") != user:
                continue
            ref = event.get("objectRef") or {}
            what = ref.get("resource", event.get("requestURI", "?"))
            if ref.get("subresource"):
                what += "/" + ref["subresource"]
            counts[f"{event['verb']} {what}"] += 1
    return counts


def histogram(metrics_text: str, name: str) -> dict[str, float]:
    """count, sum and the cumulative buckets of a Prometheus histogram."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith(f"{name}_bucket"):
            le = line.split('le="')[1].split('"')[0]
            out[f"le_{le}"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_count") or line.startswith(f"{name}_sum"):
            out[line.split(" ")[0].removeprefix(f"{name}_")] = float(line.rsplit(" ", 1)[1])
    return out


def bucket_quantile(hist: dict[str, float], q: float) -> str:
    """The smallest bucket bound holding a q share of the observations."""
    total = hist.get("count", 0.0)
    for key, value in sorted(
        ((k, v) for k, v in hist.items() if k.startswith("le_")),
        key=lambda kv: float("inf") if kv[0] == "le_+Inf" else float(kv[0][3:]),
    ):
        if total and value >= q * total:
            return key[3:]
    return "?"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--room", type=int, default=50, help="jobs the quota admits at once")
    parser.add_argument("--run-seconds", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=5.0, help="operator reconcile interval")
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args(argv)

    bin_dir = build_binaries(quiet=True)
    with (
        ControlPlane.start(bin_dir, audit=True) as kube,
        kueue_harness.running(kube, bin_dir, kube.workdir / "kueue"),
    ):
        kube.kubectl("apply", "-f", str(REPO / "manifests"))
        kube.kubectl("wait", "--for=condition=Established", "crd/impalajobs.impala.dev")
        kube.kubectl("create", "namespace", NS)
        kube.apply(queues.resource_flavor("kwok", {"type": "kwok"}))
        quota = queues.quota_for(job_manifest("x"), jobs=args.room)
        kube.apply(queues.cluster_queue("bench", "kwok", quota))
        kube.apply(queues.local_queue("bench", NS, "bench"))
        identity = kube.sa_kubeconfig("impala-system", "impala-operator")
        metrics_port = free_port()
        env = {
            **kube.env_for(identity),
            "IMPALA_OPERATOR_RECONCILE_INTERVAL": str(args.interval),
            "IMPALA_OPERATOR_HEALTH_PORT": "0",
        }
        log = (kube.workdir / "operator.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "impala_cli.main", "operator", "--namespace", NS,
             "--kubeconfig", str(identity), "--metrics-port", str(metrics_port)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            operator = psutil.Process(proc.pid)
            time.sleep(5.0)
            idle_rss = operator.memory_info().rss
            names = [f"job-{i:03d}" for i in range(args.jobs)]
            result = drive(kube, names, args.run_seconds, args.timeout)
            cpu = operator.cpu_times()
            rss = operator.memory_info().rss
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            metrics_text = urllib.request.urlopen(url, timeout=5).read().decode()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        calls = audit_counts(kube.workdir / "audit.log", OPERATOR_USER)

    tick = histogram(metrics_text, "impala_operator_reconcile_seconds")
    total_calls = sum(calls.values())
    record = {
        "scenario": "operator_queue",
        "jobs": args.jobs,
        "room": args.room,
        "run_seconds": args.run_seconds,
        "interval_s": args.interval,
        "wait_admitted_s": {q: round(percentile(result["admitted_s"], v), 1)
                            for q, v in (("p50", 0.5), ("p95", 0.95), ("max", 1.0))},
        "wait_running_s": {q: round(percentile(result["running_s"], v), 1)
                           for q, v in (("p50", 0.5), ("p95", 0.95), ("max", 1.0))},
        "all_done_s": round(result["all_done_s"], 1),
        "most_running": result["most_running"],
        "reconcile_s": {
            "count": tick.get("count"),
            "mean": round(tick.get("sum", 0.0) / max(1.0, tick.get("count", 1.0)), 4),
            "p50_bucket": bucket_quantile(tick, 0.5),
            "p95_bucket": bucket_quantile(tick, 0.95),
        },
        "api_requests_per_job": round(total_calls / args.jobs, 1),
        "api_requests_by_kind_per_job": {
            k: round(v / args.jobs, 2) for k, v in calls.most_common()
        },
        "operator_cpu_s": round(cpu.user + cpu.system, 1),
        "rss_mib": {"idle": round(idle_rss / 2**20, 1), "end": round(rss / 2**20, 1)},
        "machine": machine_info(("kopf", "kubernetes")),
        "command": " ".join(["python bench/operator_queue.py", *argv]),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }  # fmt: skip
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "operator_queue.json").write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k != "machine"}, indent=1))
    print(f"median wait to admission {statistics.median(result['admitted_s']):.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
