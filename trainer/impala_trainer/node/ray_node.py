"""One Ray node of the job as a child process: `ray start --block`, watched, drained, stopped.

The learner pod runs the head, rollout/aggregator pods run worker nodes. Each is a `ray start
--block` child in its own session, so this process can stop exactly its own node: `ray stop` would
kill every Ray process on the machine (fine in a pod, fatal when the tests run several nodes, and
other people's Ray, on one host). SIGTERM to the `ray start` process alone makes Ray mark the node
draining in the GCS and wait until its raylet is idle; the driver sees the drain and lets the
node's actors hand over their in-flight fragments before it releases them (see membership.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from impala_api.roles import DEFAULT_PORTS

# argparse dest -> (`ray start` flag, default): the per-node ports roles.RayPorts.node_flags() pins.
PORT_FLAGS: dict[str, tuple[str, int]] = {
    "node_manager_port": ("--node-manager-port", DEFAULT_PORTS.node_manager),
    "object_manager_port": ("--object-manager-port", DEFAULT_PORTS.object_manager),
    "min_worker_port": ("--min-worker-port", DEFAULT_PORTS.min_worker),
    "max_worker_port": ("--max-worker-port", DEFAULT_PORTS.max_worker),
    "dashboard_agent_listen_port": (
        "--dashboard-agent-listen-port",
        DEFAULT_PORTS.dashboard_agent_listen,
    ),
    "dashboard_agent_grpc_port": (
        "--dashboard-agent-grpc-port",
        DEFAULT_PORTS.dashboard_agent_grpc,
    ),
    "runtime_env_agent_port": ("--runtime-env-agent-port", DEFAULT_PORTS.runtime_env_agent),
    "metrics_export_port": ("--metrics-export-port", DEFAULT_PORTS.metrics_export),
}


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every role that starts a Ray node takes (rendered by roles.role_command)."""
    g = parser.add_argument_group("Ray node")
    g.add_argument("--node-ip-address", default=None, help="address this node advertises")
    for dest, (flag, default) in PORT_FLAGS.items():
        g.add_argument(flag, dest=dest, type=int, default=default, help=f"default {default}")
    g.add_argument("--num-cpus", type=int, default=None, help="CPUs Ray may schedule here")
    g.add_argument(
        "--object-store-memory", type=int, default=None, help="object store bytes (default: Ray's)"
    )
    g.add_argument(
        "--temp-dir", default=None, help="Ray's temp dir (default: $RAY_TMPDIR/ray, else Ray's)"
    )


@dataclass
class NodeConfig:
    """What `ray start` needs for one node."""

    head: bool
    address: str = ""
    """host:port of the head's GCS (worker nodes)."""
    gcs_port: int = DEFAULT_PORTS.gcs
    """GCS port (head)."""
    node_ip: str | None = None
    ports: dict[str, int] = field(default_factory=dict)
    """argparse dest -> port, see PORT_FLAGS."""
    num_cpus: int | None = None
    resources: dict[str, float] = field(default_factory=dict)
    object_store_memory: int | None = None
    temp_dir: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, **kw: object) -> NodeConfig:
        """Build from `add_node_arguments` flags plus role-specific fields."""
        return cls(
            node_ip=args.node_ip_address,
            ports={dest: getattr(args, dest) for dest in PORT_FLAGS},
            num_cpus=args.num_cpus,
            object_store_memory=args.object_store_memory,
            temp_dir=args.temp_dir or _env_temp_dir(),
            **kw,  # type: ignore[arg-type]
        )


def _env_temp_dir() -> str | None:
    # A worker node otherwise adopts the head's temp dir; nodes sharing a host (the local
    # multi-pod tests) would then race for socket names in one session directory.
    tmp = os.environ.get("RAY_TMPDIR")
    return os.path.join(tmp, "ray") if tmp else None


def free_port() -> int:
    """A port nobody listens on right now (for Ray services no other pod needs to reach)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def pinned_port(variable: str) -> int:
    """The port the operator pinned for one of a learner pod's listeners (`roles.LearnerPorts`:
    `variable` names it in the container's environment); 0, any free port, where nothing did."""
    value = os.environ.get(variable, "")
    return int(value) if value.isdigit() else 0


def start_argv(cfg: NodeConfig) -> list[str]:
    """The `ray start ... --block` command line for this node."""
    argv = [sys.executable, "-m", "impala_trainer.node.ray_node", "start", "--block"]
    argv.append("--disable-usage-stats")
    if cfg.head:
        # The client server and the (frontend-less) dashboard are local conveniences nothing in
        # the job uses; they default to fixed ports, which would collide between heads on a host.
        argv += [
            "--head",
            f"--port={cfg.gcs_port}",
            "--include-dashboard=false",
            f"--dashboard-port={free_port()}",
            f"--ray-client-server-port={free_port()}",
        ]
    else:
        argv.append(f"--address={cfg.address}")
    for dest, (flag, _) in PORT_FLAGS.items():
        if dest in cfg.ports:
            argv.append(f"{flag}={cfg.ports[dest]}")
    if cfg.node_ip:
        argv.append(f"--node-ip-address={cfg.node_ip}")
    if cfg.num_cpus is not None:
        argv.append(f"--num-cpus={cfg.num_cpus}")
    argv.append(f"--resources={json.dumps(cfg.resources)}")
    if cfg.object_store_memory:
        argv.append(f"--object-store-memory={cfg.object_store_memory}")
    if cfg.temp_dir:
        argv.append(f"--temp-dir={cfg.temp_dir}")
    return argv


def ray_env(drain_timeout_s: float = 30.0) -> dict[str, str]:
    """Environment for Ray processes (and to apply to this process before `ray.init`).

    Ray 2.60 turns on token authentication for `ray start` and keeps the token in the home
    directory, which another pod does not share. With `RAY_AUTH_TOKEN` set (on a cluster always:
    the operator gives every pod of a job the `ray-token` of its auth Secret) the cluster uses it;
    otherwise (local runs) authentication is off.
    """
    env = dict(os.environ)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.setdefault("RAY_AUTH_MODE", "token" if env.get("RAY_AUTH_TOKEN") else "disabled")
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = str(drain_timeout_s)
    # A pod starting on a busy node (or several nodes on one busy test machine) can take longer
    # than Ray's defaults to start its Python agents and workers; the raylet would then abort.
    env.setdefault("RAY_agent_register_timeout_ms", "120000")
    env.setdefault("RAY_worker_register_timeout_seconds", "120")
    return env


def apply_ray_env(drain_timeout_s: float = 30.0) -> None:
    """Make this process's own `ray.init` agree with the nodes it starts (auth mode, stats)."""
    for key, value in ray_env(drain_timeout_s).items():
        if key.startswith("RAY_"):
            os.environ[key] = value


def split_address(address: str) -> tuple[str, int]:
    """`host:port` -> (host, port)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address must be HOST:PORT, got {address!r}")
    return host, int(port)


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def head_ready(address: str) -> bool:
    """True when the GCS at `address` lists the head node alive: its raylet has registered.

    The GCS answers on its port well before the head's raylet has started; a node that joins in
    that window competes with the head's start-up for CPU (Ray's helpers have fixed start-up
    deadlines) and gains nothing, since the driver connects only once the head is up.
    """
    try:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # compiled, no stub

        nodes = GcsClient(address=address).get_all_node_info(timeout=5)
    except Exception:  # not reachable / not ready: the caller polls again
        return False
    return any(n.is_head_node and n.state == 0 for n in nodes.values())  # 0: ALIVE


def wait_until(pred: Callable[[], bool], timeout: float, stop: Callable[[], bool]) -> bool:
    """Poll `pred` every 0.5 s until it holds (True), `timeout` passes or `stop()` (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop():
        if pred():
            return True
        time.sleep(0.5)
    return False


class RayNodeProcess:
    """A `ray start --block` child in its own session (process group)."""

    def __init__(
        self, cfg: NodeConfig, log_path: Path | None = None, drain_timeout_s: float = 30.0
    ):
        self.cfg = cfg
        self.drain_timeout_s = drain_timeout_s
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Launch `ray start`; it returns at once, the node comes up in the background."""
        if self.cfg.head:
            forget_stale_head(self.cfg)
        # Without a log file Ray's output goes where ours does (the pod's log).
        out = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        self.proc = subprocess.Popen(
            start_argv(self.cfg),
            env=ray_env(self.drain_timeout_s),
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
        )
        if out is not None:
            out.close()  # the child holds its own descriptor

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def drain(self, grace_s: float) -> int | None:
        """SIGTERM `ray start` only: Ray drains the node, then stops its processes.

        Returns the exit code, or None when it had to be killed after `grace_s`.
        """
        if not self.alive():
            return self.proc.returncode if self.proc else None
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        finally:
            self._kill_leftovers()

    def kill(self) -> None:
        """SIGKILL the whole node (head lost: nothing left to drain to)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def _kill_leftovers(self) -> None:
        # Ray's own teardown is best effort; anything of this node still in its process group
        # (an idle worker, an agent) would otherwise outlive the node.
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def _ray_start_main() -> None:
    """`ray start`, with a longer wait for the new raylet to register with the GCS.

    `ray start` gives its raylet a fixed 30 s to appear in the GCS node table; a node starting
    while its machine (or the head) is busy needs longer, and failing would only make it try
    again from scratch. The wait is widened by retrying Ray's own lookup.
    """
    import ray._private.services as services
    from ray.scripts.scripts import main

    lookup = services.get_node

    def patient_get_node(*args: object, **kwargs: object) -> object:
        deadline = time.monotonic() + REGISTER_WAIT_S
        while True:
            try:
                return lookup(*args, **kwargs)
            except RuntimeError:
                # A raylet that died while starting will never register: fail now, so the
                # caller (nodes.py's rejoin loop) starts over at once.
                if time.monotonic() > deadline or not _child_alive("raylet"):
                    raise
                time.sleep(1.0)

    services.get_node = patient_get_node
    sys.exit(main())


REGISTER_WAIT_S = 150.0


def _child_alive(name: str) -> bool:
    """True when a live (not zombie) child process of ours is called `name`."""
    me = os.getpid()
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = stat_file.read_text()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2 :].split()
        if comm == name and int(fields[1]) == me and fields[0] != "Z":
            return True
    return False


def forget_stale_head(cfg: NodeConfig) -> None:
    """Remove a previous head's bootstrap-address file for our own GCS address.

    `ray start --head` refuses to start when that file names its address and a raylet on this
    host still points there: after a learner restart, nodes of the old cluster on the same host
    (the local tests) can still be running for a few seconds.
    """
    from ray._common.utils import get_default_ray_temp_dir, get_ray_address_file

    path = Path(get_ray_address_file(cfg.temp_dir or get_default_ray_temp_dir()))
    with contextlib.suppress(OSError):
        if path.read_text().strip().endswith(f":{cfg.gcs_port}"):
            path.unlink()


if __name__ == "__main__":
    _ray_start_main()
