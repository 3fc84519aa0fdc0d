"""A multi-pod ImpalaJob as local processes, for bench/multipod_scaling.py and the
tests/integration/test_multipod_* tests (both import it as `harness.multipod_cluster`).

Every process runs exactly the argv `roles.role_command(...)` renders for its pod (learner host
127.0.0.1, each node on its own block of ports so several Ray nodes share this host), so what
these tests exercise is what the pods run. Each process gets its own RAY_TMPDIR (Ray names its
sockets per session directory, and nodes started at the same moment in one directory race for
the names), runs at a lower priority (`nice`), and carries a marker in its environment: teardown
kills every process with this cluster's marker, Ray's included, and nothing else on the machine
(`ray stop` would kill other people's Ray too).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import yaml

from impala_api.roles import RayPorts, Role, role_command
from impala_api.snapshot import HISTORY_FILE, STATUS_FILE, SUMMARY_FILE
from impala_api.spec import ImpalaJob

NODE_SPACING = 150  # > the 110 ports of one node's block
# Every block sits below Linux's ephemeral range (32768 up): a port there can be taken, between
# the free check and Ray's bind, as the local end of one of the many outgoing gRPC connections.
PORTS_LOW, PORTS_HIGH = 15000, 32768
MARKER = "IMPALAJOB_TEST_CLUSTER"


def node_ports(base: int) -> RayPorts:
    """One node's block of ports starting at `base` (the defaults spread over 6379..52368)."""
    return RayPorts(
        gcs=base,
        node_manager=base + 1,
        object_manager=base + 2,
        dashboard_agent_listen=base + 3,
        dashboard_agent_grpc=base + 4,
        runtime_env_agent=base + 5,
        metrics_export=base + 6,
        min_worker=base + 10,
        max_worker=base + 109,
    )


def _ports_free(ports: RayPorts) -> bool:
    wanted = [
        ports.gcs,
        ports.node_manager,
        ports.object_manager,
        *range(ports.min_worker, ports.max_worker + 1),
        ports.dashboard_agent_listen,
        ports.dashboard_agent_grpc,
        ports.runtime_env_agent,
        ports.metrics_export,
    ]
    for port in wanted:
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                return False
    return True


def pick_base(slots: int) -> int:
    """A first port under which `slots` nodes' blocks are all free right now."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(PORTS_LOW, PORTS_HIGH - slots * NODE_SPACING, 10)
        if all(_ports_free(node_ports(base + i * NODE_SPACING)) for i in range(slots)):
            return base
    raise RuntimeError("no free port range for the local Ray nodes")


class LocalJob:
    """One job's learner, rollout and aggregator "pods" as process trees on this machine."""

    def __init__(self, root: Path, manifest: dict[str, Any], slots: int = 8) -> None:
        self.root = root
        self.job = ImpalaJob.model_validate(manifest)
        self.config = root / "job.yaml"
        self.config.write_text(yaml.safe_dump(manifest))
        self.run_dir = root / "run"
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.base = pick_base(slots)
        self.learner_ports = node_ports(self.base)
        self.slots = slots
        self._next_slot = 1
        self.marker = uuid.uuid4().hex
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # Short: Ray's Unix socket paths live under it and must stay below ~107 characters.
        self._tmp = Path(tempfile.mkdtemp(prefix="ij", dir="/tmp"))
        self.exe = (sys.executable, "-m", "impala_cli.main")

    # -- processes ------------------------------------------------------------------------------

    def argv(self, role: Role, *, slot: int = 0, resume: bool = True) -> list[str]:
        """The command line of a role, rendered by the function the pod builders use."""
        if role == "learner":
            return role_command(
                "learner",
                self.job,
                run_dir=str(self.run_dir),
                config_path=str(self.config),
                ports=self.learner_ports,
                resume=resume,
                executable=self.exe,
            )
        return role_command(
            role,
            self.job,
            learner_host="127.0.0.1",
            ports=node_ports(self.base + slot * NODE_SPACING),
            learner_gcs_port=self.learner_ports.gcs,
            executable=self.exe,
        )

    def start(self, name: str, role: Role, resume: bool = True) -> subprocess.Popen[bytes]:
        """Start a learner (slot 0) or a node (its own port slot) named `name`."""
        slot = 0
        if role != "learner":
            slot = self._next_slot
            self._next_slot += 1
            if slot >= self.slots:
                raise RuntimeError("out of port slots")
        tmp = self._tmp / name
        tmp.mkdir(exist_ok=True)
        env = {
            **os.environ,
            "RAY_TMPDIR": str(tmp),
            MARKER: self.marker,
            "PYTHONUNBUFFERED": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            # Small object stores: several nodes share this machine's memory.
            "RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION": "0.02",
        }
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            self.argv(role, slot=slot, resume=resume),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: os.nice(10),
        )
        log.close()
        self.procs[name] = proc
        return proc

    def tree(self, name: str) -> list[psutil.Process]:
        """A process and all its descendants (Ray's own processes included)."""
        try:
            root = psutil.Process(self.procs[name].pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self, name: str) -> None:
        """SIGKILL a "pod": the process and every descendant, as a node failure would."""
        procs = self.tree(name)
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(procs, timeout=30)
        self.procs[name].wait(timeout=30)

    def terminate(self, name: str) -> None:
        """SIGTERM the pod's main process only, as the kubelet does."""
        self.procs[name].send_signal(signal.SIGTERM)

    def close(self) -> None:
        """Kill every process of this cluster (found by the marker in their environment)."""
        for _ in range(3):
            mine = []
            for p in psutil.process_iter(["pid"]):
                try:
                    if p.environ().get(MARKER) == self.marker:
                        mine.append(p)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            if not mine:
                break
            for p in mine:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            psutil.wait_procs(mine, timeout=30)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        shutil.rmtree(self._tmp, ignore_errors=True)  # Ray's session dirs (logs, sockets)

    # -- observing ------------------------------------------------------------------------------

    def status(self) -> dict[str, Any] | None:
        """status.json, or None while there is none (or mid-replace)."""
        try:
            return json.loads((self.run_dir / STATUS_FILE).read_text())
        except (OSError, ValueError):
            return None

    def summary(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.run_dir / SUMMARY_FILE).read_text())
        except (OSError, ValueError):
            return None

    def history(self) -> list[dict[str, Any]]:
        """history.jsonl's points so far (a line still being written is left out)."""
        points = []
        for line in (self.run_dir / HISTORY_FILE).read_text().splitlines():
            try:
                points.append(json.loads(line))
            except ValueError:
                continue
        return points

    def wait_for(
        self,
        what: str,
        pred: Callable[[dict[str, Any]], bool],
        timeout: float,
        alive: tuple[str, ...] = ("learner",),
    ) -> dict[str, Any]:
        """Poll status.json until `pred(status)` holds; fail early if a needed process died."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            status = self.status()
            if status is not None:
                last = status
                if pred(status):
                    return status
            for name in alive:
                proc = self.procs.get(name)
                if proc is not None and proc.poll() is not None:
                    raise AssertionError(
                        f"waiting for {what}: {name} exited with {proc.returncode}\n"
                        + self.tail(name)
                    )
            time.sleep(1.0)
        raise AssertionError(
            f"timed out after {timeout:.0f} s waiting for {what}; last status: "
            f"{json.dumps(_brief(last))}\n" + self.tail("learner")
        )

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return ""
        text = path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {name}.log ---\n" + "\n".join(text)


def _brief(status: dict[str, Any] | None) -> dict[str, Any] | None:
    if status is None:
        return None
    m = status.get("membership", {})
    return {
        "phase": status.get("phase"),
        "message": status.get("message"),
        "counters": status.get("counters"),
        "return": status.get("episode_return_mean"),
        "members": [
            (x["actor_id"], x["state"], x["node_id"][:8], x["env_steps"])
            for x in m.get("members", [])
        ],
    }


def healthy(status: dict[str, Any], role: str = "rollout") -> list[dict[str, Any]]:
    """Healthy members of a role."""
    members = status.get("membership", {}).get("members", [])
    return [m for m in members if m["role"] == role and m["state"] == "healthy"]
