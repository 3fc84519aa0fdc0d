"""Run a real Kubernetes cluster as local processes: no Docker.

etcd, kube-apiserver (RBAC, service-account tokens), kube-controller-manager, kube-scheduler and
kwok (fake nodes that take pods to Running) are started from the binaries `build.sh` caches;
with `real_node=True` also one real node (node.py: containerd, kubelet, kube-proxy, CoreDNS),
where pods actually run.
Every process gets its own process group and is killed with it, also when pytest is interrupted
(atexit) or killed (PR_SET_PDEATHSIG), so no process or port outlives the test session.

    with ControlPlane.start(build_binaries()) as kube:
        kube.kubectl("get", "nodes")
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from ..net import free_port
from . import provisioner
from .kube import KWOK_NODE_ANNOTATION, Kube, b64file, wait_for, write_kubeconfig
from .node import HOST_IP, NODE_NAME, RealNode, default_image_store, missing_prerequisites
from .pki import ClusterPKI, KeyPair, make_pki

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build.sh"
KWOK_STAGES = HERE / "kwok" / "stages.yaml"
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
ISSUER = "https://kubernetes.default.svc.cluster.local"
WORKDIR_PREFIX = "impala-k8s-"
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
)
NODE_COMPONENTS = ("kubelet", "kube-proxy", "coredns", "kube-router", "pause")


def build_binaries(*names: str, quiet: bool = False) -> Path:
    """Run build.sh for `names` (all when none; a no-op when they are cached) and return the cached
    bin directory. While tests/run.sh builds everything beside the tests, this waits for `names`
    alone (build.sh locks each target apart)."""
    proc = subprocess.run(
        ["bash", str(BUILD_SH), *names],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if quiet else None,  # progress goes to the terminal
        text=True,
        check=True,
    )
    return Path(proc.stdout.strip().splitlines()[-1])


def _sweep_stale_workdirs() -> None:
    # A SIGKILLed session cannot clean up; its components die with it (PR_SET_PDEATHSIG) but its
    # temp dir stays. Remove such dirs whose owning process is gone; live sessions' are kept.
    for d in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            pid = int((d / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            if (d / "node").is_dir() and os.geteuid() == 0:
                # A real node outlives its session in shims, containers, mounts and the
                # network namespace: remove them before the files.
                RealNode(Path(), d, owner_pid=pid).reap()
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass  # another user's live process


def _die_with_parent() -> None:
    # Runs in the child between fork and exec. If pytest is SIGKILLed no Python cleanup runs;
    # the kernel then delivers SIGKILL to this child instead.
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    _log_file: IO[bytes]
    argv: Sequence[str] = ()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def terminate(self) -> None:
        """Ask the whole process group to exit."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)

    def kill(self, deadline: float) -> None:
        """Wait for the exit until `deadline`, then SIGKILL the group; close the log."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        # The whole group, also when the leader already exited: a component may have children.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        self._log_file.close()

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


@dataclass
class NodeSpec:
    """Capacity of each fake node; GPU pods need `nvidia.com/gpu` in allocatable to schedule."""

    count: int = 3
    cpu: str = "32"
    memory: str = "128Gi"
    gpus: int = 8
    pods: int = 110


@dataclass
class ControlPlane:
    """A running local control plane; use `ControlPlane.start(bin_dir)` as a context manager."""

    bin_dir: Path
    workdir: Path
    nodes: NodeSpec = field(default_factory=NodeSpec)
    keep_workdir: bool = False
    """Leave logs and etcd data behind after stop (set IMPALA_E2E_KEEP=1)."""
    processes: list[_Process] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    kube: Kube | None = None
    node: RealNode | None = None
    """The real node, when started with `real_node=True`."""
    storage_image: str | None = None
    """With the real node: the image the local-path provisioner's helper pods run (None: no
    provisioner, claims bind only to volumes made by hand)."""
    audit: bool = False
    """Write the API server's audit log (every request's user, verb and resource, no bodies) to
    `<workdir>/audit.log`: how the operator benchmark counts a client's API calls."""
    _stopped: bool = False

    # ---- lifecycle -------------------------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def start(
        cls,
        bin_dir: Path,
        *,
        nodes: NodeSpec | None = None,
        keep_workdir: bool | None = None,
        timeout: float = 120.0,
        real_node: bool = False,
        images: Sequence[Path] = (),
        taint_real_node: bool = True,
        audit: bool = False,
        storage_image: str | None = None,
    ) -> Iterator[Kube]:
        """Start everything, yield a `Kube` for it, and tear it all down afterwards.

        `real_node` adds the real node (root only; see node.py), with the OCI archives in
        `images` imported into its containerd; `taint_real_node` keeps pods that do not tolerate
        it (every kwok test's) off it; `storage_image` (one of `images`, with a shell) runs the
        local-path provisioner's helper pods, making `local-path` the default StorageClass
        (provisioner.py)."""
        _sweep_stale_workdirs()
        workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        (workdir / "owner.pid").write_text(str(os.getpid()))
        if keep_workdir is None:
            keep_workdir = os.environ.get("IMPALA_E2E_KEEP", "") not in ("", "0")
        cp = cls(
            bin_dir=bin_dir,
            workdir=workdir,
            nodes=nodes or NodeSpec(),
            keep_workdir=keep_workdir,
            audit=audit,
            storage_image=storage_image if real_node else None,
        )
        if real_node:
            problems = missing_prerequisites()
            missing = [c for c in NODE_COMPONENTS if not (bin_dir / c).exists()]
            if missing:
                problems.append(f"{', '.join(missing)} in {bin_dir} (run build.sh)")
            if problems:
                shutil.rmtree(workdir, ignore_errors=True)
                raise RuntimeError(f"the real node needs: {'; '.join(problems)}")
            cp.node = RealNode(
                bin_dir, workdir, images=images, taint=taint_real_node,
                image_store=default_image_store(),
            )  # fmt: skip
        atexit.register(cp.stop)
        try:
            kube = cp._boot(timeout)
        except BaseException as exc:
            report = cp.report()
            cp.stop()
            if isinstance(exc, Exception):
                raise RuntimeError(f"control plane failed to start: {exc}\n{report}") from exc
            raise
        try:
            yield kube
        finally:
            cp.stop()
            atexit.unregister(cp.stop)

    def stop(self) -> None:
        """Kill every component (reverse start order) and remove the work dir; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.node is not None:
            self.node.stop_processes()
        # All at once and briefly: the data is thrown away, so a graceful shutdown buys nothing.
        for proc in reversed(self.processes):
            proc.terminate()
        deadline = time.monotonic() + 3.0
        for proc in reversed(self.processes):
            proc.kill(deadline)
        if self.node is not None:
            self.node.teardown()
        if self.keep_workdir:
            print(f"\n[controlplane] logs and data kept in {self.workdir}", file=sys.stderr)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def report(self) -> str:
        """Log tails of every component, for failure messages."""
        parts = [f"work dir: {self.workdir}"]
        for proc in self.processes:
            state = "running" if proc.alive() else f"exited {proc.popen.returncode}"
            parts.append(f"===== {proc.name} ({state}), {proc.log}\n{proc.tail()}")
        return "\n".join(parts)

    # ---- boot ------------------------------------------------------------------------------

    def _boot(self, timeout: float) -> Kube:
        deadline = time.monotonic() + timeout
        missing = [c for c in COMPONENTS if not (self.bin_dir / c).exists()]
        if missing:
            raise FileNotFoundError(f"missing binaries in {self.bin_dir}: {missing}; run build.sh")
        host = "127.0.0.1"
        if self.node is not None:
            # Before the API server: it listens on the host end of the node's veth.
            self.node.setup_network()
            host = HOST_IP
        pki = make_pki(
            self.workdir / "pki",
            service_ip=SERVICE_IP,
            extra_ips=() if self.node is None else (HOST_IP,),
        )
        for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler"):
            self.ports[name] = free_port()

        self._start_etcd()
        etcd_url = f"http://127.0.0.1:{self.ports['etcd']}"
        self._wait(lambda: self._http_ok(f"{etcd_url}/health"), deadline, "etcd /health")

        self._start_apiserver(pki, etcd_url, host)
        server = f"https://{host}:{self.ports['apiserver']}"
        ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
        ctx.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
        self._wait(lambda: self._http_ok(f"{server}/readyz", ctx), deadline, "apiserver /readyz")

        kubeconfigs = self.workdir / "kubeconfigs"
        kubeconfigs.mkdir()
        admin = self._kubeconfig(kubeconfigs / "admin", server, pki.ca, pki.admin, "admin")
        kcm = self._kubeconfig(
            kubeconfigs / "controller-manager",
            server,
            pki.ca,
            pki.controller_manager,
            "system:kube-controller-manager",
        )
        sched = self._kubeconfig(
            kubeconfigs / "scheduler", server, pki.ca, pki.scheduler, "system:kube-scheduler"
        )

        self._start_controller_manager(pki, kcm)
        self._start_scheduler(sched)
        self._start_kwok(admin)

        # Plain HTTPS from here on: every kubectl call pays seconds of start-up and discovery on
        # a busy 2-core machine, and these few requests are the whole warm-start budget.
        def api(path: str, body: object = None) -> Any:
            data = None if body is None else json.dumps(body).encode()
            req = urllib.request.Request(
                f"{server}{path}", data=data, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                return json.load(resp)

        version = str(api("/version")["gitVersion"])
        for node in self._nodes():
            api("/api/v1/nodes", node)
        # The `default` ServiceAccount proves the controller-manager runs; Ready nodes prove kwok.
        self._wait(
            lambda: api("/api/v1/namespaces/default/serviceaccounts/default"),
            deadline,
            "controller-manager (default ServiceAccount)",
        )
        self._wait(lambda: self._nodes_ready(api("/api/v1/nodes")), deadline, "kwok nodes Ready")
        if self.node is not None:
            self._start_node(pki, server, kubeconfigs, admin, api)
        kube = Kube(
            kubeconfig=admin,
            bin_dir=self.bin_dir,
            workdir=self.workdir,
            is_local=True,
            version=version,
            restart=self.restart,
        )
        self.kube = kube
        if self.node is not None and self.storage_image:
            provisioner.start(
                lambda name, argv: self._spawn(name, argv[1:], argv0=argv[0]),
                lambda docs: kube.apply(yaml.safe_dump_all(docs)),
                bin_dir=self.bin_dir,
                workdir=self.workdir,
                kubeconfig=admin,
                image=self.storage_image,
            )
        return kube

    def _wait(self, check: Callable[[], object], deadline: float, what: str) -> None:
        def probe() -> object:
            dead = [p.name for p in self.processes if not p.alive()]
            if dead:
                raise _Dead(f"{', '.join(dead)} exited while waiting for {what}")
            return check()

        remaining = max(1.0, deadline - time.monotonic())
        wait_for(probe, timeout=remaining, interval=0.2, what=what, fatal=(_Dead,))

    @staticmethod
    def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)

    def _nodes_ready(self, nodes: dict[str, Any]) -> bool:
        ready = [
            n
            for n in nodes["items"]
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
        ]
        return len(ready) >= self.nodes.count

    # ---- components ------------------------------------------------------------------------

    def _spawn(self, name: str, args: Sequence[str], *, argv0: str | None = None) -> _Process:
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        log_file = log.open("wb")
        argv = [argv0 or str(self.bin_dir / name), *args]
        log_file.write((" ".join(argv) + "\n\n").encode())
        log_file.flush()
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            # Own process group: a terminal Ctrl-C reaches only pytest, which then tears the
            # cluster down in order instead of every component dying mid-request.
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        proc = _Process(name=name, popen=popen, log=log, _log_file=log_file, argv=argv)
        self.processes.append(proc)
        return proc

    def restart(self, *names: str, down: float = 0.0) -> None:
        """Stop the named components (SIGTERM, then SIGKILL after 10 s), keep them down for
        `down` seconds, and start them again with the same arguments, ports and data (etcd's
        data dir, the kubelet's root dir): what a node or control-plane restart does. Started
        in the order given."""
        found = {p.name: p for p in self.processes if p.name in names and p.alive()}
        missing = [n for n in names if n not in found]
        if missing:
            raise ValueError(f"no running component named {missing}")
        for name in reversed(names):
            found[name].terminate()
            found[name].kill(time.monotonic() + 10.0)
            self.processes.remove(found[name])
        time.sleep(down)
        for name in names:
            old = found[name]
            log_file = old.log.open("ab")
            log_file.write(f"\n--- restarted at {time.time():.0f}\n\n".encode())
            log_file.flush()
            popen = subprocess.Popen(
                list(old.argv), stdin=subprocess.DEVNULL, stdout=log_file,
                stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
            self.processes.append(_Process(name, popen, old.log, log_file, old.argv))

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn(
            "etcd",
            [
                "--name=e2e",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=e2e={peer}",
                # The data is discarded after the session: durability is pure cost here.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

    def _start_node(
        self,
        pki: ClusterPKI,
        server: str,
        kubeconfigs: Path,
        admin: Path,
        api: Callable[[str], Any],
    ) -> None:
        assert self.node is not None
        identities = {
            # The Node authorizer grants a kubelet exactly its own node's objects by this name.
            "kubelet": self._kubeconfig(
                kubeconfigs / "kubelet",
                server,
                pki.ca,
                pki.client("kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}"),
                f"system:node:{NODE_NAME}",
            ),
            # Bound to system:node-proxier by the bootstrap policy.
            "kube-proxy": self._kubeconfig(
                kubeconfigs / "kube-proxy",
                server,
                pki.ca,
                pki.client("kube-proxy", "/CN=system:kube-proxy"),
                "system:kube-proxy",
            ),
            "coredns": admin,
        }
        # Image imports take a while (the product image is gigabytes): its own budget.
        deadline = time.monotonic() + 600

        def alive() -> None:
            dead = [p.name for p in self.processes if not p.alive()]
            if dead:
                raise _Dead(f"{', '.join(dead)} exited while starting the real node")

        self.node.start(
            lambda name, argv: self._spawn(name, argv[1:], argv0=argv[0]),
            ca_cert=pki.ca.cert,
            kubeconfigs=identities,
            deadline=deadline,
            alive=alive,
        )

        def ready() -> bool:
            node = api(f"/api/v1/nodes/{NODE_NAME}")
            return any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in node.get("status", {}).get("conditions", [])
            )

        self._wait(ready, time.monotonic() + 120, f"real node {NODE_NAME} Ready")

    def _start_apiserver(self, pki: ClusterPKI, etcd_url: str, host: str) -> None:
        if host == "127.0.0.1":
            # The endpoint reconciler refuses a loopback advertise address, and nothing runs in
            # a pod that could use the `kubernetes` Service's endpoints anyway.
            endpoints = ["--endpoint-reconciler-type=none"]
        else:
            # Pods on the real node reach the API through the `kubernetes` Service, whose
            # endpoint is this address; logs/exec/port-forward go to the kubelet's InternalIP.
            endpoints = [
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={pki.admin.cert}",
                f"--kubelet-client-key={pki.admin.key}",
            ]
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                f"--bind-address={host}",
                f"--advertise-address={host}",
                *endpoints,
                f"--secure-port={self.ports['apiserver']}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca.cert}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={ISSUER}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                *self._audit_flags(),
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
        )

    def _audit_flags(self) -> list[str]:
        if not self.audit:
            return []
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n"
            "rules:\n- level: Metadata\n"
        )
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.workdir / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-maxsize=0",
        ]

    def _start_controller_manager(self, pki: ClusterPKI, kubeconfig: Path) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['controller-manager']}",
                # Alone in the cluster: skipping the leader lease saves seconds at start-up.
                "--leader-elect=false",
                "--controllers=*",
                # Each controller acts as its own ServiceAccount, so RBAC gaps show up as they would
                # on a kubeadm cluster.
                "--use-service-account-credentials=true",
                f"--root-ca-file={pki.ca.cert}",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--cluster-signing-cert-file={pki.ca.cert}",
                f"--cluster-signing-key-file={pki.ca.key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--cluster-name=impala-e2e",
                "--profiling=false",
            ],
        )

    def _start_scheduler(self, kubeconfig: Path) -> None:
        # kwok only fakes kubelets; binding pods to nodes is the real scheduler's job.
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
                "--leader-elect=false",
                "--profiling=false",
            ],
        )

    def _start_kwok(self, kubeconfig: Path) -> None:
        self._spawn(
            "kwok",
            [
                f"--kubeconfig={kubeconfig}",
                f"--config={KWOK_STAGES}",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.0/16",
            ],
        )

    def _nodes(self) -> list[dict[str, Any]]:
        spec = self.nodes
        resources = {
            "cpu": spec.cpu,
            "memory": spec.memory,
            "pods": str(spec.pods),
            "ephemeral-storage": "500Gi",
        }
        if spec.gpus:
            resources["nvidia.com/gpu"] = str(spec.gpus)
        items: list[dict[str, Any]] = []
        for i in range(spec.count):
            name = f"kwok-node-{i}"
            items.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                        "labels": {
                            "type": "kwok",
                            "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            **({"nvidia.com/gpu.present": "true"} if spec.gpus else {}),
                        },
                    },
                    # Status is accepted on create (as from a registering kubelet); kwok then keeps
                    # the capacity and adds conditions, addresses and node info.
                    "status": {
                        "allocatable": resources,
                        "capacity": resources,
                        # Distinct node IPs, so pods' hostIP tells nodes apart as on a real cluster.
                        "addresses": [
                            {"type": "InternalIP", "address": f"10.240.0.{i + 1}"},
                            {"type": "Hostname", "address": name},
                        ],
                    },
                }
            )
        return items

    def _kubeconfig(self, path: Path, server: str, ca: KeyPair, client: KeyPair, user: str) -> Path:
        write_kubeconfig(
            path,
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "impala-e2e",
                        "cluster": {
                            "server": server,
                            "certificate-authority-data": b64file(ca.cert),
                        },
                    }
                ],
                "users": [
                    {
                        "name": user,
                        "user": {
                            "client-certificate-data": b64file(client.cert),
                            "client-key-data": b64file(client.key),
                        },
                    }
                ],
                "contexts": [
                    {"name": "impala-e2e", "context": {"cluster": "impala-e2e", "user": user}}
                ],
                "current-context": "impala-e2e",
            },
        )
        return path


class _Dead(RuntimeError):
    """A component exited while the control plane was starting."""
