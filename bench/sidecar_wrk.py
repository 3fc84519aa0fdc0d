"""Status sidecar under load: wrk against /status and /metrics, ours vs a naive sidecar.

    python bench/sidecar_wrk.py [--duration 10] [--rate 500] [--rounds 2]

Builds a realistic run directory (3,000 history points, a snapshot with 20 members) and keeps a
writer thread updating it the way the trainer does (status.json replaced every 0.5 s, a history
line every 1 s), so caches are invalidated as in production. Each server is a separate process
(`impalajob status-server`, or this script's `--serve-naive`). For each round, endpoint and side
(alternating: ours, naive, ours, naive ...) wrk runs for `--duration` seconds at about `--rate`
requests/s (see sidecar_wrk.lua for how wrk is paced) after a 2 s warm-up.

The peer ("naive") is what a straightforward FastAPI sidecar does: a sync handler that reads and
validates status.json on every request and returns it through `response_model`, and a fresh
registry rendered per scrape. Prints a table (medians over rounds) and one JSON line; writes
bench/results/sidecar_wrk.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# The sample run directory is the shared harness package's (harness/, the tests' too), imported
# from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import RESULTS_DIR, machine_info, machine_line, percentile, table
from harness.sample_run import sample_history, sample_snapshot
from impala_api.roles import LOCAL_EXECUTABLE, status_command
from impala_api.snapshot import (
    HISTORY_FILE,
    STATUS_FILE,
    append_history,
    write_json_atomic,
)
from impala_trainer.node.ray_node import free_port

BENCH = Path(__file__).resolve().parent
SIDES = ("ours", "naive")
ENDPOINTS = ("/status", "/metrics")
SERVING_PACKAGES = ("fastapi", "uvicorn", "prometheus-client")
"""The versions this scenario records: the serving stack (wrk's is added beside them)."""


def serving_machine_info() -> dict[str, Any]:
    """common.machine_info with the serving stack's versions and wrk's."""
    wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split()
    return {**machine_info(SERVING_PACKAGES), "wrk": wrk[1] if len(wrk) > 1 else "-"}


def naive_app(run_dir: Path) -> Any:
    """The peer: no caches, sync handlers, response_model validation on every request."""
    from fastapi import FastAPI, Response
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from impala_api.snapshot import StatusSnapshot
    from impala_trainer.sidecar.collector import snapshot_metrics

    app = FastAPI()

    @app.get("/status", response_model=StatusSnapshot)
    def status() -> StatusSnapshot:
        return StatusSnapshot.model_validate_json((run_dir / STATUS_FILE).read_bytes())

    @app.get("/metrics")
    def metrics() -> Response:
        snap = StatusSnapshot.model_validate_json((run_dir / STATUS_FILE).read_bytes())

        class Once:
            def collect(self) -> Any:
                return snapshot_metrics(snap, snap.job)

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Once())  # type: ignore[arg-type]
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


class TrainerLike(threading.Thread):
    """Rewrites the run directory on the trainer's schedule while the load runs."""

    def __init__(self, run_dir: Path, history_len: int) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.stop_event = threading.Event()
        self.points = sample_history(history_len + 2000, start_time=time.time(), seed=1)
        self.next = history_len

    def run(self) -> None:
        tick = 0
        while not self.stop_event.wait(0.5):
            tick += 1
            point = self.points[min(self.next, len(self.points) - 1)]
            snap = sample_snapshot("bench-cartpole", point, rollouts=16, aggregators=4)
            write_json_atomic(self.run_dir / STATUS_FILE, snap)
            if tick % 2 == 0:
                append_history(self.run_dir / HISTORY_FILE, point)
                self.next += 1


def make_run_dir(path: Path, history_len: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    history = sample_history(history_len, start_time=time.time() - 3600, seed=0)
    with (path / HISTORY_FILE).open("w") as f:
        for p in history:
            f.write(p.model_dump_json() + "\n")
    snap = sample_snapshot("bench-cartpole", history[-1], rollouts=16, aggregators=4)
    write_json_atomic(path / STATUS_FILE, snap)


def start_server(side: str, run_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    if side == "ours":
        cmd = [
            *status_command(
                str(run_dir), status_port=port, host="127.0.0.1", executable=LOCAL_EXECUTABLE
            ),
            "--log-level",
            "warning",
        ]
    else:
        cmd = [sys.executable, __file__, "--serve-naive", str(run_dir), "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMPALA_STATUS_")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{side} server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{side} server did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_wrk(url: str, seconds: float, connections: int, delay_ms: float) -> dict[str, Any]:
    """One wrk run: `connections` connections, each waiting `delay_ms` between requests."""
    cmd = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{round(seconds)}s",
        "--timeout",
        "2s",
        "-s",
        str(BENCH / "sidecar_wrk.lua"),
        url,
        "--",
        f"{delay_ms:.3f}",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    m = re.search(r"^WRKJSON (\{.*\})$", out, re.MULTILINE)
    if not m:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    return dict(json.loads(m.group(1)))


def trial(side: str, run_dir: Path, endpoint: str, args: argparse.Namespace) -> dict[str, Any]:
    proc, url = start_server(side, run_dir)
    try:
        # Warm up at the nominal pacing, then correct the wait by the overhead the warm-up
        # showed: a connection's cycle is wait + response time + timer slack, so the achieved
        # rate falls short. Clamped, so one noisy warm-up cannot make the load run away.
        cycle_ms = args.connections * 1000.0 / args.rate
        warm = run_wrk(url + endpoint, 2, args.connections, cycle_ms)
        achieved_cycle_ms = args.connections * warm["duration_us"] / 1000 / max(warm["requests"], 1)
        delay_ms = max(0.7 * cycle_ms, cycle_ms - max(0.0, achieved_cycle_ms - cycle_ms))
        cpu0 = cpu_seconds(proc.pid)
        r = run_wrk(url + endpoint, args.duration, args.connections, delay_ms)
        cpu = cpu_seconds(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    secs = r["duration_us"] / 1e6
    errors = sum(r[k] for k in r if k.startswith("errors_"))
    return {
        "side": side,
        "endpoint": endpoint,
        "requests": r["requests"],
        "delay_ms": round(delay_ms, 3),
        "rate": r["requests"] / secs,
        "errors": errors,
        "p50_ms": r["p50_us"] / 1000,
        "p90_ms": r["p90_us"] / 1000,
        "p99_ms": r["p99_us"] / 1000,
        "p999_ms": r["p999_us"] / 1000,
        "max_ms": r["max_us"] / 1000,
        "server_cpu_pct": 100 * cpu / secs,
        "cpu_us_per_request": 1e6 * cpu / max(r["requests"], 1),
    }


def asgi_service_times(side: str, run_dir: Path, endpoint: str, n: int) -> dict[str, Any]:
    """Per-request wall and process-CPU time calling the app's ASGI interface directly.

    No sockets, no HTTP parsing: what is left is the app's own work. CPU time is unaffected by
    other processes on a busy machine, so it isolates the hot path's cost from scheduling noise.
    """
    import asyncio

    if side == "ours":
        from impala_trainer.sidecar.app import create_app
        from impala_trainer.sidecar.settings import Settings

        app = create_app(Settings(run_dir=run_dir))
    else:
        app = naive_app(run_dir)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": endpoint,
        "raw_path": endpoint.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"bench")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def drive() -> tuple[list[float], list[float]]:
        status: list[int] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        walls, cpus = [], []
        for _ in range(n):
            w0, c0 = time.perf_counter(), time.process_time()
            await app(dict(scope), receive, send)
            cpus.append(time.process_time() - c0)
            walls.append(time.perf_counter() - w0)
        assert set(status) == {200}, set(status)
        return walls, cpus

    walls, cpus = asyncio.run(drive())
    return {
        "side": side,
        "endpoint": endpoint,
        "n": n,
        "wall_p50_us": 1e6 * percentile(walls, 0.5),
        "wall_p99_us": 1e6 * percentile(walls, 0.99),
        "cpu_p50_us": 1e6 * percentile(cpus, 0.5),
        "cpu_p99_us": 1e6 * percentile(cpus, 0.99),
        "cpu_mean_us": 1e6 * statistics.fmean(cpus),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    parser.add_argument("--rate", type=int, default=500, help="target requests/s")
    parser.add_argument("--connections", type=int, default=5, help="wrk connections")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (ours, naive alternating)")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma list from ours,naive")
    parser.add_argument("--history", type=int, default=3000, help="history lines in the run dir")
    parser.add_argument(
        "--asgi-requests", type=int, default=3000, help="requests per in-process ASGI run"
    )
    parser.add_argument("--serve-naive", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.serve_naive:
        import uvicorn

        uvicorn.run(
            naive_app(args.serve_naive),
            host="127.0.0.1",
            port=args.port,
            log_level="warning",
            access_log=False,
        )
        return 0
    if not shutil.which("wrk"):
        print("wrk not found: apt-get install wrk (tests/setup-system.sh does)", file=sys.stderr)
        return 2

    info = serving_machine_info()
    sides = [s for s in args.sides.split(",") if s]
    trials: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp:
        run_dir = Path(tmp) / "run"
        make_run_dir(run_dir, args.history)
        writer = TrainerLike(run_dir, args.history)
        writer.start()
        try:
            for i in range(args.rounds):
                for endpoint in ENDPOINTS:
                    for side in sides:
                        t = trial(side, run_dir, endpoint, args)
                        t["round"] = i
                        trials.append(t)
                        print(
                            f"round {i + 1} {side:5s} {endpoint:8s} {t['rate']:6.0f} req/s "
                            f"p50 {t['p50_ms']:.2f} ms p99 {t['p99_ms']:.2f} ms",
                            flush=True,
                        )
            asgi: list[dict[str, Any]] = []
            for i in range(args.rounds):
                for endpoint in ENDPOINTS:
                    for side in sides:
                        a = asgi_service_times(side, run_dir, endpoint, args.asgi_requests)
                        a["round"] = i
                        asgi.append(a)
        finally:
            writer.stop_event.set()

    rows, summary = [], {}
    for endpoint in ENDPOINTS:
        for side in sides:
            ts = [t for t in trials if t["side"] == side and t["endpoint"] == endpoint]
            med = {
                k: statistics.median(t[k] for t in ts)
                for k in (
                    "rate",
                    "p50_ms",
                    "p90_ms",
                    "p99_ms",
                    "p999_ms",
                    "max_ms",
                    "server_cpu_pct",
                    "cpu_us_per_request",
                )
            }
            med["errors"] = sum(t["errors"] for t in ts)
            summary[f"{side}{endpoint.replace('/', '_')}"] = {
                k: round(v, 3) for k, v in med.items()
            }
            rows.append(
                [
                    endpoint,
                    side,
                    med["rate"],
                    med["p50_ms"],
                    med["p90_ms"],
                    med["p99_ms"],
                    med["p999_ms"],
                    med["max_ms"],
                    med["server_cpu_pct"],
                    med["cpu_us_per_request"],
                    med["errors"],
                ]
            )
    print()
    print(
        table(
            [
                "endpoint",
                "side",
                "req/s",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "p99.9 ms",
                "max ms",
                "server CPU %",
                "CPU µs/req",
                "errors",
            ],
            rows,
            digits=2,
        )
    )
    asgi_rows = []
    for endpoint in ENDPOINTS:
        for side in sides:
            xs = [a for a in asgi if a["side"] == side and a["endpoint"] == endpoint]
            med = {
                k: statistics.median(a[k] for a in xs)
                for k in ("wall_p50_us", "wall_p99_us", "cpu_p50_us", "cpu_p99_us", "cpu_mean_us")
            }
            summary[f"{side}{endpoint.replace('/', '_')}"]["asgi"] = {
                k: round(v, 1) for k, v in med.items()
            }
            asgi_rows.append([endpoint, side, *med.values()])
    print()
    print("in-process ASGI calls (no sockets/HTTP parsing; the app's own work):")
    headers = ["endpoint", "side", "wall p50 µs", "wall p99 µs", "CPU p50 µs", "CPU p99 µs"]
    print(table([*headers, "CPU mean µs"], asgi_rows, digits=2))
    print(f"machine: {machine_line(info)}")
    command = "python bench/sidecar_wrk.py " + " ".join(sys.argv[1:])
    line = {
        "scenario": "sidecar_wrk",
        "rate": args.rate,
        "duration_s": args.duration,
        "rounds": args.rounds,
        **summary,
        "machine": machine_line(info),
    }
    print(json.dumps(line))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "sidecar_wrk.json").write_text(
        json.dumps(
            {
                "scenario": "sidecar_wrk",
                "command": command.strip(),
                "machine": info,
                "summary": summary,
                "trials": trials,
                "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
