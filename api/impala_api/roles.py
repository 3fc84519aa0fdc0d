"""The command line of every role, rendered by ONE function.

The operator's pod builders put `role_command(...)` into the containers, and the multi-pod tests
start local processes with the very same function (learner host 127.0.0.1, shifted ports), so what
the tests exercise is what the pods run. Torch/Ray-free: the operator imports it.

Ports (defaults, the pods use them unchanged): Ray GCS 6379, node manager 6380, object manager
6381, Ray worker ports 10002-10101, dashboard agent 52365/52366, runtime-env agent 52367, metrics
export 52368, status sidecar 8080 (its metrics 9080); in learner pods the driver's sample
connections 6390, the learners' TCPStore 29500 and their gloo pairs 29501-30000 (`LearnerPorts`).
Ray's agents default to random ports; pinning them makes every port a pod listens on known
(NetworkPolicy, firewalls) and lets several nodes share one host in the local tests without
collisions.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from impala_api.spec import ImpalaJob

Role = Literal["learner", "learner-peer", "rollout", "aggregator", "status"]
ROLES: tuple[Role, ...] = ("learner", "learner-peer", "rollout", "aggregator", "status")

STATUS_PORT = 8080
"""Port of the status sidecar (`/status`, `/metrics`, `/healthz`, `/readyz`)."""
METRICS_PORT = 9080
"""The status sidecar's metrics port: `/metrics` and the probes without the token, for
Prometheus (the job's NetworkPolicy admits the monitoring namespace to it and nothing else)."""

# Role -> `impalajob` subcommand (impala_cli.main.COMMANDS).
SUBCOMMAND: dict[Role, str] = {
    "learner": "learner",
    "learner-peer": "learner-node",
    "rollout": "rollout-node",
    "aggregator": "aggregator-node",
    "status": "status-server",
}


@dataclass(frozen=True)
class RayPorts:
    """Every port a Ray node of the job listens on."""

    gcs: int = 6379
    """GCS server of the head (the learner); rollout/aggregator nodes connect to it."""
    node_manager: int = 6380
    """Raylet of this node."""
    object_manager: int = 6381
    """Object manager of this node (object transfers between nodes)."""
    min_worker: int = 10002
    """Lowest port of this node's Ray worker processes."""
    max_worker: int = 10101
    """Highest port of this node's Ray worker processes."""
    dashboard_agent_listen: int = 52365
    """Dashboard agent HTTP port of this node."""
    dashboard_agent_grpc: int = 52366
    """Dashboard agent gRPC port of this node."""
    runtime_env_agent: int = 52367
    """Runtime-env agent port of this node."""
    metrics_export: int = 52368
    """Ray's Prometheus metrics port of this node."""

    def shifted(self, offset: int) -> RayPorts:
        """All ports moved by `offset`: distinct port sets for several nodes on one host."""
        return RayPorts(
            **{f.name: getattr(self, f.name) + offset for f in dataclasses.fields(self)}
        )

    def node_flags(self) -> list[str]:
        """Flags pinning this node's own ports (every role that starts a Ray node)."""
        return [
            f"--node-manager-port={self.node_manager}",
            f"--object-manager-port={self.object_manager}",
            f"--min-worker-port={self.min_worker}",
            f"--max-worker-port={self.max_worker}",
            f"--dashboard-agent-listen-port={self.dashboard_agent_listen}",
            f"--dashboard-agent-grpc-port={self.dashboard_agent_grpc}",
            f"--runtime-env-agent-port={self.runtime_env_agent}",
            f"--metrics-export-port={self.metrics_export}",
        ]


DEFAULT_PORTS = RayPorts()


@dataclass(frozen=True)
class LearnerPorts:
    """The learner pods' own listeners beside Ray's, pinned in pods so the job's NetworkPolicy
    can open them and nothing else; where nothing pins them (local runs, tests on one host)
    each takes a free port. The operator hands them to the learner containers as environment
    variables (`env`), which Ray's worker processes inherit from the node they run on."""

    samples: int = 6390
    """The driver's direct sample connections (`driver/channels.py`): rollout pods connect to
    learner pod 0 here."""
    store: int = 29500
    """Rank 0's TCPStore, torch.distributed's rendezvous (`spec.learner.replicas` > 1)."""
    pairs: tuple[int, int] = (29501, 30000)
    """The connections between learners (gloo binds them to port 0): the learner pods' ephemeral
    range, `net.ipv4.ip_local_port_range` (a namespaced, safe sysctl), so the ports a learner
    listens on for its peers are in here. Ends of unlike parity, as the kernel prefers."""

    def env(self) -> list[dict[str, str]]:
        """The containers' variables that pin the two fixed listeners."""
        return [
            {"name": SAMPLE_PORT_ENV, "value": str(self.samples)},
            {"name": COLLECTIVE_PORT_ENV, "value": str(self.store)},
        ]

    def port_range_sysctl(self) -> dict[str, str]:
        """The learner pods' `securityContext.sysctls` entry that bounds their ephemeral ports."""
        return {"name": "net.ipv4.ip_local_port_range", "value": f"{self.pairs[0]} {self.pairs[1]}"}


SAMPLE_PORT_ENV = "IMPALA_SAMPLE_PORT"
COLLECTIVE_PORT_ENV = "IMPALA_COLLECTIVE_PORT"
LEARNER_PORTS = LearnerPorts()

LOCAL_EXECUTABLE: tuple[str, ...] = (sys.executable, "-m", "impala_cli.main")
"""`impalajob` run by this interpreter: local processes (`impalajob train`'s sidecar, the tests,
the benchmarks) need no console script on PATH."""

POD_IP = "$(POD_IP)"
"""`node_ip` for pods: Kubernetes expands `$(POD_IP)` in a container's command from the
downward-API env var, so Ray advertises the pod IP rather than guessing an interface."""


def role_command(
    role: Role,
    job: ImpalaJob,
    *,
    learner_host: str | None = None,
    run_dir: str | None = None,
    config_path: str | None = None,
    ports: RayPorts = DEFAULT_PORTS,
    learner_gcs_port: int | None = None,
    status_port: int = STATUS_PORT,
    status_host: str | None = None,
    node_ip: str | None = None,
    resume: bool = True,
    executable: Sequence[str] = ("impalajob",),
) -> list[str]:
    """The argv a role runs.

    learner:    `impalajob learner -f CONFIG --run-dir DIR --gcs-port GCS <node ports> [--resume]`
    learner-peer: `impalajob learner-node --address HOST:GCS <node ports>` (ranks 1..N-1 of
                `spec.learner.replicas`: a Ray node offering one unit of `learner`)
    rollout:    `impalajob rollout-node --address HOST:GCS --workers-per-pod N <node ports>`
    aggregator: `impalajob aggregator-node --address HOST:GCS <node ports>`
    status:     `impalajob status-server --run-dir DIR --status-port 8080`

    `learner_host` is where rollout/aggregator nodes find the learner's GCS (the headless Service
    in a pod, 127.0.0.1 locally) and `learner_gcs_port` its port (default: `ports.gcs`, which a
    local test shifts for each node but must keep pointing at the learner's). `node_ip` becomes
    `--node-ip-address` (`POD_IP` in pods). `resume` makes the learner continue from the newest
    checkpoint in its run directory when there is one (a restarted pod with a checkpoint volume).
    `status_host` is the sidecar's bind address (`0.0.0.0` in pods, so the kubelet's probes and
    the Service reach it). `executable` is the program prefix, e.g. `LOCAL_EXECUTABLE`.
    """
    argv = [*executable, SUBCOMMAND[role]]
    ip = [f"--node-ip-address={node_ip}"] if node_ip else []
    if role in ("learner", "status") and not run_dir:
        raise ValueError(f"role {role!r} needs run_dir")
    if role == "learner":
        if not config_path:
            raise ValueError("role 'learner' needs config_path")
        argv += ["-f", config_path, f"--run-dir={run_dir}", f"--gcs-port={ports.gcs}"]
        argv += ports.node_flags() + ip
        if resume:
            argv.append("--resume")
    elif role in ("learner-peer", "rollout", "aggregator"):
        if not learner_host:
            raise ValueError(f"role {role!r} needs learner_host")
        gcs = ports.gcs if learner_gcs_port is None else learner_gcs_port
        argv.append(f"--address={learner_host}:{gcs}")
        if role == "rollout":
            argv.append(f"--workers-per-pod={job.spec.rollouts.workers_per_pod}")
        argv += ports.node_flags() + ip
    elif role == "status":
        return status_command(
            run_dir or "", status_port=status_port, host=status_host, executable=executable
        )
    else:  # pragma: no cover - Literal exhausts the roles
        raise ValueError(f"unknown role {role!r}")
    return argv


def status_command(
    run_dir: str,
    *,
    status_port: int = STATUS_PORT,
    metrics_port: int | None = None,
    host: str | None = None,
    executable: Sequence[str] = ("impalajob",),
) -> list[str]:
    """The status sidecar's argv, `impalajob status-server --run-dir DIR --status-port PORT
    [--metrics-port PORT] [--host HOST]`: it needs no job, so `impalajob train`, the tests and
    the benchmarks serve a run directory with it too."""
    argv = [*executable, SUBCOMMAND["status"], f"--run-dir={run_dir}"]
    argv.append(f"--status-port={status_port}")
    if metrics_port is not None:
        argv.append(f"--metrics-port={metrics_port}")
    if host:
        argv.append(f"--host={host}")
    return argv
