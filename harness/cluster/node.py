"""One real Kubernetes node beside the kwok ones: containerd + runc, the kubelet, CNI, kube-proxy
and CoreDNS, all local processes, where pods really run.

The node lives in a network namespace of its own, joined to the host by a veth pair the harness
creates (host end `HOST_IP`, where the API server listens; node end `NODE_IP`, the node's
InternalIP). Inside it: the CNI bridge `impala0` with the pod gateway `POD_GATEWAY`, where CoreDNS
answers, and kube-proxy's iptables rules. So nothing of the node's networking touches the host's
interfaces, routes (but the one route to the pods, which goes with the veth) or firewall, and the
teardown of the network is deleting one namespace.

What cannot be namespaced is removed by `teardown`, in order: the kubelet first (nothing restarts
containers), every process in the node's cgroups (kubepods), containerd, its shims, then
every mount under the work dir (the kubelet's root dir, emptyDirs, overlay snapshots) and the pod
network namespaces' bind mounts, the node's namespace, and the cgroup directories it created in
each hierarchy. Existing cgroups and mounts are never touched: only what appeared after `start`.

Choices, and why:
- kubelet v1.37 (the control plane's own version) on Debian's containerd 1.6.20. Upstream tests
  containerd 1.x only up to kubelet 1.35, but the CRI v1 API that 1.6 speaks is all the kubelet
  uses here (one warning: `RuntimeConfig` unimplemented, so the cgroup driver comes from the
  kubelet's config), and building containerd 2.x from source would add minutes to a cold CI run.
  cgroup v1 is what this machine has: `failCgroupV1: false`.
- containerd's CRI `restrict_oom_score_adj`: these machines deny lowering `oom_score_adj`, and
  without it every sandbox fails with runc's "can't get final child's PID from pipe: EOF".
- The pause image is built here (`pause.c`, static) and imported under the name containerd's
  config gives, since nothing can be pulled.
- kube-proxy masquerades all Service traffic: a reply from a pod on the same bridge then returns
  through the node's netfilter, without relying on br_netfilter in the namespace.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from ..cache import cache_root
from .kube import wait_for

HOST_IP = "10.221.0.1"
"""Host end of the veth: the API server listens here (reachable from the node and its pods)."""
NODE_IP = "10.221.0.2"
"""Node end of the veth: the node's InternalIP (kubelet, logs/exec/port-forward)."""
VETH_CIDR_BITS = 30
POD_CIDR = "10.222.0.0/16"
POD_GATEWAY = "10.222.0.1"
"""The CNI bridge's address: the pods' gateway, and where CoreDNS listens (clusterDNS)."""
BRIDGE = "impala0"
NODE_NAME = "real-node"
REAL_NODE_LABEL = "impala.dev/real-node"
"""Label (value `true`) of the real node: a nodeSelector for pods that must really run."""
PAUSE_IMAGE = "impala.test/pause:1"
SHIM_SOCKETS = Path("/run/containerd/s")
CLUSTER_DOMAIN = "cluster.local"
_CGROUP_FS = ("cgroup", "cgroup2")


class Spawn(Protocol):
    """Starts a long-running component (ControlPlane._spawn): name, argv; returns a process."""

    def __call__(self, name: str, argv: Sequence[str]) -> Any: ...


def _run(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def missing_prerequisites() -> list[str]:
    """What this machine lacks to run the real node ([] when it can); for skip/fail messages."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("root (network namespaces, mounts, cgroups)")
    path = [*os.environ.get("PATH", "").split(":"), "/usr/sbin", "/sbin"]
    for tool, package in (
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("runc", "runc"),
        ("ip", "iproute2"),
        ("nsenter", "util-linux"),
        ("iptables", "iptables"),
        ("conntrack", "conntrack"),
    ):
        if not any(Path(d, tool).exists() for d in path):
            problems.append(f"{tool} (Debian package {package})")
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        if not Path("/usr/lib/cni", plugin).exists():
            problems.append(f"CNI plugin {plugin} (containernetworking-plugins)")
    return problems


# ---- images ----------------------------------------------------------------------------------


def pause_image_archive(pause_binary: Path, out: Path) -> Path:
    """An OCI archive of one layer holding the static `pause`, named `PAUSE_IMAGE`."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo("pause")
        data = pause_binary.read_bytes()
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    layer_bytes = layer.getvalue()
    layer_digest = hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": f"sha256:{hashlib.sha256(config).hexdigest()}",
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": f"sha256:{layer_digest}",
                    "size": len(layer_bytes),
                }
            ],
        }
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": f"sha256:{hashlib.sha256(manifest).hexdigest()}",
                    "size": len(manifest),
                    "annotations": {"io.containerd.image.name": PAUSE_IMAGE},
                }
            ],
        }
    ).encode()
    with tarfile.open(out, "w") as tar:
        for name, blob in (
            ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
            ("index.json", index),
            *(
                (f"blobs/sha256/{hashlib.sha256(b).hexdigest()}", b)
                for b in (layer_bytes, config, manifest)
            ),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return out


def without_blobs(archive: Path, present: set[str], out: Path) -> Path | None:
    """A copy of an OCI archive without the blobs containerd already holds (`present`:
    `sha256:...` digests), or None when it holds none of them. A job image built FROM the
    product image shares its 3.5 GB layer: importing the copy reads kilobytes, not the layer
    again (containerd takes an image's layers from its content store when the archive lacks them).
    """
    with tarfile.open(archive) as src:  # uncompressed: members are seeked over, not read
        members = src.getmembers()
        skip = {m.name for m in members if "sha256:" + m.name.rsplit("/", 1)[-1] in present}
        if not any(m.name in skip for m in members if m.isfile()):
            return None
        with tarfile.open(out, "w") as dst:
            for m in members:
                if m.name not in skip:
                    dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    return out


def default_image_store() -> Path:
    """Where the real node keeps containerd's root between sessions: the test cache, keyed by
    containerd's version (its on-disk format is that version's)."""
    version = re.sub(r"[^A-Za-z0-9._-]", "_", _run("containerd", "--version").stdout.split()[2])
    return cache_root() / f"real-node-containerd-{version}"


STORE_WAIT_S = 1200.0
"""How long a node waits for the kept store while another process holds it: tests/run.sh's
preload (preload.py) imports the product image into it beside the Go builds (~2 min cold)."""


def hold_store(store: Path, wait: float = 0.0) -> IO[str] | None:
    """Take the kept store's lock (`flock` on `store/.lock`), waiting up to `wait` seconds; the
    open lock file (the lock lasts while it is open), or None when another process kept it."""
    store.mkdir(parents=True, exist_ok=True)
    lock = (store / ".lock").open("w")
    deadline = time.monotonic() + wait
    announced = False
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lock
        except OSError:
            if time.monotonic() >= deadline:
                lock.close()
                return None
            if not announced:
                print(f"[real-node] waiting up to {wait:.0f} s for {store} (held by an import)")
                announced = True
            time.sleep(2.0)


class Ctr(Protocol):
    """`ctr` against one containerd, in its `k8s.io` namespace (the CRI's)."""

    def __call__(self, *args: str, timeout: float = 600, check: bool = True) -> Any: ...


def containerd_ctr(socket: Path) -> Ctr:
    """`ctr` against the containerd listening on `socket`, in namespace `k8s.io`."""

    def ctr(
        *args: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return _run(
            "ctr", "--address", str(socket), "--namespace", "k8s.io", *args,
            timeout=timeout, check=check,
        )  # fmt: skip

    return ctr


def stop_process(proc: subprocess.Popen[Any], timeout: float) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds; reaped either way."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def import_archives(ctr: Ctr, archives: Sequence[Path], scratch: Path) -> None:
    """Import OCI archives into containerd, each without the blobs it already holds (a code
    change imports its project layer alone), name them as the CRI looks them up, and remove the
    images none of `archives` holds (an earlier build's), so a kept store does not grow with every
    dependency change: containerd collects their layers."""
    for i, archive in enumerate(archives):
        present = set(ctr("content", "ls", "-q").stdout.split())
        started = time.monotonic()
        thin = without_blobs(archive, present, scratch / f"image-{i}.oci.tar")
        # A first import of the product image: 80 s alone, 110 s beside the Go builds (preload.py).
        ctr("images", "import", str(thin or archive), timeout=1800)
        took = time.monotonic() - started
        print(f"[real-node] imported {archive.name} in {took:.0f} s", file=sys.stderr)
    # buildah names the image by its short reference ("impalajob:0.1.0"); the CRI finds images by
    # their full one, so every short name is tagged as that too, again each time: in a kept store
    # the full name may still point at an earlier build.
    for name in ctr("images", "ls", "-q").stdout.split():
        if not name.startswith("sha256:") and docker_reference(name) != name:
            ctr("images", "tag", "--force", name, docker_reference(name))
    # After the import: the layers an old build shares with the new one stay referenced.
    wanted = set().union(*(manifest_digests(a) for a in archives))
    for line in ctr("images", "ls").stdout.splitlines()[1:]:
        ref, _kind, digest = line.split()[:3]
        if digest not in wanted:
            ctr("images", "rm", ref, check=False)


def manifest_digests(archive: Path) -> set[str]:
    """The digests of the manifests an OCI archive's index lists."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None, f"{archive}: no index.json"
        index = json.load(member)
    return {m["digest"] for m in index.get("manifests", [])}


def docker_reference(name: str) -> str:
    """The fully qualified name the CRI looks an image up by (`impalajob:0.1.0` ->
    `docker.io/library/impalajob:0.1.0`)."""
    first = name.split("/", 1)[0]
    if "/" not in name:
        return f"docker.io/library/{name}"
    if "." in first or ":" in first or first == "localhost":
        return name
    return f"docker.io/{name}"


# ---- host state the node adds: cgroups and mounts ---------------------------------------------


def cgroup_mounts() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers and the unified one)."""
    out: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.split(" ", 1)[0] in _CGROUP_FS:
            out.append(Path(pre.split()[4]))
    return out


def _cgroup_children() -> set[Path]:
    return {p for m in cgroup_mounts() if m.is_dir() for p in m.iterdir() if p.is_dir()}


def _mount_points() -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4].replace("\\040", " ") for line in lines]


def _pids_with(marker: bytes) -> list[int]:
    """Other processes whose command line contains `marker`."""
    pids = []
    for p in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if (
                p.name.isdigit()
                and int(p.name) != os.getpid()
                and marker in (p / "cmdline").read_bytes()
            ):
                pids.append(int(p.name))
    return pids


def _log_links(prefix: str) -> list[Path]:
    """The kubelet's links in its fixed `/var/log/containers` that point under `prefix`."""
    logs = Path("/var/log/containers")
    links = []
    for p in logs.iterdir() if logs.is_dir() else ():
        with contextlib.suppress(OSError):  # removed meanwhile
            if p.is_symlink() and os.readlink(p).startswith(prefix):
                links.append(p)
    return links


def _cgroup_dirs(root: Path) -> list[Path]:
    """Every cgroup under `root`, itself included, deepest first. The kubelet and runc remove
    cgroups while we walk (pod teardown races ours), so a directory that vanishes mid-walk is
    skipped rather than raised: `os.walk` ignores scandir errors, `Path.rglob` does not."""
    dirs = [Path(d) for d, _, _ in os.walk(root)]
    return sorted(dirs, key=lambda p: -len(p.parts))


def _kill_cgroup_tree(root: Path) -> None:
    for cg in _cgroup_dirs(root):
        with contextlib.suppress(OSError):  # removed meanwhile
            for pid in (cg / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)


def _remove_cgroup_tree(root: Path, timeout: float = 10.0) -> None:
    # Directories only (cgroupfs files cannot be unlinked); deepest first; a cgroup whose tasks
    # are still exiting refuses rmdir for a moment, hence the retry.
    deadline = time.monotonic() + timeout
    while root.exists():
        for d in _cgroup_dirs(root):
            with contextlib.suppress(OSError):
                d.rmdir()
        if not root.exists() or time.monotonic() > deadline:
            return
        _kill_cgroup_tree(root)
        time.sleep(0.1)


# ---- the node ----------------------------------------------------------------------------------


@dataclass
class RealNode:
    """The real node of one test session; `setup_network` before the API server starts, then
    `start`, and `teardown` (idempotent) at the end."""

    bin_dir: Path
    workdir: Path
    images: Sequence[Path] = ()
    """OCI archives to import into containerd's `k8s.io` namespace (the product image)."""
    taint: bool = False
    """Taint the node so only pods that tolerate `REAL_NODE_LABEL` land on it (kwok tests' pods
    never do); off for a cluster where the examples should run unchanged."""
    image_store: Path | None = None
    """containerd's root (content and unpacked layers) kept across sessions: an image imported
    once is not unpacked again, and a code change imports its project layer alone (the 3 GB
    dependency layer took ~2 min). One session at a time holds it (`flock`); another, or None,
    gets a root in its work dir. Stale containers of an earlier session are removed before the
    kubelet starts, and images no archive of this session names after the import."""
    owner_pid: int = field(default_factory=os.getpid)
    """The session's process: every host-wide name (netns, veth, cgroup root) carries it, so a
    dead session's leftovers can be found (`reap`). The addresses are fixed: one real node per
    machine at a time."""
    _cgroups_before: set[Path] | None = None
    # What the host had before `setup_network`; None (unknown, in `reap`) means: touch nothing of
    # that kind that is not named after this node.
    _netns_before: set[str] | None = None
    _netns_dir_mounted: bool | None = None
    _shim_dir_existed: bool | None = None
    _shim_sockets_before: set[str] = field(default_factory=set)
    _network_up: bool = False
    _started: bool = False
    _torn_down: bool = False
    processes: dict[str, Any] = field(default_factory=dict)
    _store_lock: Any = None

    @property
    def dir(self) -> Path:
        return self.workdir / "node"

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    @property
    def cgroup_root(self) -> str:
        return f"/impala-e2e-{self.owner_pid}"

    @property
    def netns(self) -> str:
        return f"impala-node-{self.owner_pid}"

    @property
    def host_veth(self) -> str:
        return f"ijh{self.owner_pid % 100000}"

    @property
    def node_veth(self) -> str:
        return f"ijn{self.owner_pid % 100000}"

    def cgroup_dirs(self) -> list[Path]:
        """`cgroup_root` in every cgroup hierarchy (existing or not)."""
        return [m / self.cgroup_root.lstrip("/") for m in cgroup_mounts()]

    def in_netns(self, *argv: str) -> list[str]:
        """argv run inside the node's network namespace (and only that namespace: `ip netns exec`
        would also give it a mount namespace of its own, hiding the kubelet's mounts)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]

    # ---- network -----------------------------------------------------------------------------

    def setup_network(self) -> None:
        """The node's namespace, the veth pair to the host, the CNI bridge and the pod route."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._netns_before = set(os.listdir("/run/netns")) if Path("/run/netns").exists() else set()
        # `ip netns add` bind-mounts /run/netns onto itself the first time; containerd's shims
        # put their sockets under /run/containerd/s whatever the config says.
        self._netns_dir_mounted = "/run/netns" in _mount_points()
        self._shim_dir_existed = SHIM_SOCKETS.parent.exists()
        if SHIM_SOCKETS.exists():
            self._shim_sockets_before = set(os.listdir(SHIM_SOCKETS))
        self._cgroups_before = _cgroup_children()
        self._network_up = True
        _run("ip", "netns", "add", self.netns)
        _run("ip", "link", "add", self.host_veth, "type", "veth",
             "peer", "name", self.node_veth, "netns", self.netns)  # fmt: skip
        _run("ip", "addr", "add", f"{HOST_IP}/{VETH_CIDR_BITS}", "dev", self.host_veth)
        _run("ip", "link", "set", self.host_veth, "up")
        ns = ("ip", "-n", self.netns)
        _run(*ns, "link", "set", "lo", "up")
        _run(*ns, "addr", "add", f"{NODE_IP}/{VETH_CIDR_BITS}", "dev", self.node_veth)
        _run(*ns, "link", "set", self.node_veth, "up")
        _run(*ns, "route", "add", "default", "via", HOST_IP)
        # Made here rather than by the CNI plugin on the first pod: CoreDNS binds its address
        # before any pod exists. The plugin adopts an existing bridge of its name.
        _run(*ns, "link", "add", BRIDGE, "type", "bridge")
        _run(*ns, "addr", "add", f"{POD_GATEWAY}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE)
        _run(*ns, "link", "set", BRIDGE, "up")
        # The node routes between its pods, Services and the host; per namespace, so the host's
        # own forwarding setting is untouched.
        _run(*self.in_netns("sysctl", "-q", "-w", "net.ipv4.ip_forward=1"))
        # The API server's Service proxy (on the host) reaches pod IPs through the node.
        _run("ip", "route", "add", POD_CIDR, "via", NODE_IP, "dev", self.host_veth)

    # ---- start ---------------------------------------------------------------------------------

    def start(
        self,
        spawn: Spawn,
        *,
        ca_cert: Path,
        kubeconfigs: dict[str, Path],
        deadline: float,
        alive: Callable[[], None],
    ) -> None:
        """containerd (+ images), CNI config, kubelet, kube-proxy and CoreDNS; wait until the node
        is Ready. `kubeconfigs` has `kubelet`, `kube-proxy` and `coredns` identities; `alive`
        raises when a component has died (so waits fail fast with its log)."""
        self._started = True
        self._write_cni_config()
        self._start_containerd(spawn)
        wait_for(
            lambda: alive() or self.containerd_socket.exists(),
            timeout=max(1.0, deadline - time.monotonic()),
            what="containerd socket",
        )
        self._import_images()
        self._start_kubelet(spawn, ca_cert, kubeconfigs["kubelet"])
        self._start_kube_proxy(spawn, kubeconfigs["kube-proxy"])
        self._start_coredns(spawn, kubeconfigs["coredns"])

    def _ctr(
        self, *args: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return containerd_ctr(self.containerd_socket)(*args, timeout=timeout, check=check)

    def _write_cni_config(self) -> None:
        conf = self.dir / "cni" / "net.d"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "10-impala.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "impala",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": True,
                            # Pods talk to the host and each other only: no NAT to the outside.
                            "ipMasq": False,
                            # A pod reaching itself through a Service leaves and re-enters its
                            # own bridge port.
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(self.dir / "cni" / "ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                },
                indent=2,
            )
        )

    def _containerd_root(self) -> Path:
        """The kept image store when this session can hold it, else a root in the work dir."""
        local = self.dir / "containerd" / "root"
        if self.image_store is None:
            return local
        self._store_lock = hold_store(self.image_store, wait=STORE_WAIT_S)
        if self._store_lock is None:
            print(f"[real-node] {self.image_store} is another session's: images imported anew")
            return local
        return self.image_store / "root"

    def _start_containerd(self, spawn: Spawn) -> None:
        d = self.dir / "containerd"
        d.mkdir(parents=True, exist_ok=True)
        cri = '[plugins."io.containerd.grpc.v1.cri"]'
        (d / "config.toml").write_text(
            f"""version = 2
root = "{self._containerd_root()}"
state = "{d / "state"}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
]
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{d / "containerd.ttrpc.sock"}"
[metrics]
  address = ""
{cri}
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
{cri[:-1]}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
{cri[:-1]}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{cri[:-1]}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{d / "runc"}"
{cri[:-1]}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{self.dir / "cni" / "net.d"}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"
"""
        )
        self.processes["containerd"] = spawn(
            "containerd", self.in_netns("containerd", "--config", str(d / "config.toml"))
        )

    def _forget_earlier_sessions(self) -> None:
        """A kept store still lists the containers (pods' and sandboxes') of the session that
        used it last, none of which runs: removed, so the kubelet starts on a clean runtime and
        containerd collects their snapshots."""
        stale = self._ctr("containers", "ls", "-q").stdout.split()
        for chunk in range(0, len(stale), 50):
            self._ctr("containers", "rm", *stale[chunk : chunk + 50], check=False)

    def _import_images(self) -> None:
        self._forget_earlier_sessions()
        pause = pause_image_archive(self.bin_dir / "pause", self.dir / "pause.oci.tar")
        import_archives(self._ctr, [pause, *self.images], self.dir)

    def _make_cgroup_root(self) -> None:
        # The kubelet refuses a cgroupRoot that does not exist in every hierarchy. A new cpuset
        # cgroup has no CPUs or memory nodes until given its parent's.
        for root in self.cgroup_dirs():
            root.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (root.parent / name).exists():
                    (root / name).write_text((root.parent / name).read_text())

    def _start_kubelet(self, spawn: Spawn, ca_cert: Path, kubeconfig: Path) -> None:
        d = self.dir / "kubelet"
        d.mkdir(parents=True, exist_ok=True)
        self._make_cgroup_root()
        (d / "resolv.conf").write_text("# pods resolve through CoreDNS (clusterDNS) only\n")
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            # Every cgroup the node makes sits under this one directory per hierarchy, so the
            # teardown finds them all and nothing else.
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,
            "failSwapOn": False,
            "clusterDNS": [POD_GATEWAY],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(d / "resolv.conf"),
            "podLogsDir": str(self.dir / "pod-logs"),
            "staticPodPath": "",
            "rotateCertificates": False,
            "serializeImagePulls": False,
            # The images cannot be pulled again: never garbage-collect them, never evict for a
            # full disk on a shared CI machine.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "maxPods": 60,
            "shutdownGracePeriod": "0s",
            "registerWithTaints": (
                [{"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}]
                if self.taint
                else []
            ),
        }
        (d / "config.yaml").write_text(json.dumps(config, indent=2))
        self.processes["kubelet"] = spawn(
            "kubelet",
            self.in_netns(
                str(self.bin_dir / "kubelet"),
                f"--config={d / 'config.yaml'}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={d / 'root'}",
                f"--cert-dir={d / 'pki'}",
                f"--node-ip={NODE_IP}",
                f"--hostname-override={NODE_NAME}",
                f"--node-labels={REAL_NODE_LABEL}=true",
                "--v=1",
            ),
        )

    def _start_kube_proxy(self, spawn: Spawn, kubeconfig: Path) -> None:
        d = self.dir / "kube-proxy"
        d.mkdir(parents=True, exist_ok=True)
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "hostnameOverride": NODE_NAME,
            "bindAddress": NODE_IP,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            "iptables": {"masqueradeAll": True},
            # Leave the (namespace-shared) conntrack sysctls alone.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
        (d / "config.yaml").write_text(json.dumps(config, indent=2))
        self.processes["kube-proxy"] = spawn(
            "kube-proxy",
            self.in_netns(str(self.bin_dir / "kube-proxy"), f"--config={d / 'config.yaml'}"),
        )

    def _start_coredns(self, spawn: Spawn, kubeconfig: Path) -> None:
        d = self.dir / "coredns"
        d.mkdir(parents=True, exist_ok=True)
        # No `forward`: nothing outside the cluster is reachable from these machines anyway.
        # build.sh compiles CoreDNS with these plugins alone (COREDNS_PLUGINS): a directive
        # added here needs its plugin added there.
        (d / "Corefile").write_text(
            f""".:53 {{
    bind {POD_GATEWAY}
    errors
    health 127.0.0.1:18080
    ready 127.0.0.1:18181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
"""
        )
        self.processes["coredns"] = spawn(
            "coredns",
            self.in_netns(str(self.bin_dir / "coredns"), "-conf", str(d / "Corefile")),
        )

    # ---- NetworkPolicy enforcement -----------------------------------------------------------

    @contextlib.contextmanager
    def network_policies_enforced(
        self, kubeconfig: Path, service_cidr: str
    ) -> Iterator[subprocess.Popen[bytes]]:
        """kube-router's network policy controller alone (no routing, no service proxy) in the
        node's namespace for the block: the bridge plugin enforces no NetworkPolicy, this does,
        with iptables and ipsets (physdev matches catch traffic between pods on the bridge).
        Stopped, its rules and sets are removed. SIG Network's kube-network-policies
        cannot run here: it queues packets with nftables' `queue` expression, which this kernel
        lacks (CONFIG_NFT_QUEUE)."""
        d = self.dir / "network-policies"
        d.mkdir(parents=True, exist_ok=True)
        agent = str(self.bin_dir / "kube-router")
        argv = self.in_netns(
            agent, f"--kubeconfig={kubeconfig}", f"--hostname-override={NODE_NAME}",
            "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
            "--enable-cni=false", f"--service-cluster-ip-range={service_cidr}",
            "--metrics-port=0", "--health-port=20244", "--iptables-sync-period=5s", "-v=1",
        )  # fmt: skip
        with open(d / "agent.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            stop_process(proc, timeout=15)
            self._remove_network_policy_rules()

    def _remove_network_policy_rules(self) -> None:
        """kube-router's iptables chains and ipsets, removed from the node's namespace (its own
        `--cleanup-config` v2.1.0 reports success and leaves them, then crashes in the service
        proxy's cleanup)."""
        ours = ("KUBE-ROUTER-", "KUBE-NWPLCY-", "KUBE-POD-FW-", "KUBE-SRC-", "KUBE-DST-")
        saved = _run(*self.in_netns("iptables-save", "-t", "filter")).stdout.splitlines()
        for line in saved:  # the jumps from the built-in chains first
            words = shlex.split(line)
            jumps = words[words.index("-j") + 1] if "-j" in words else ""
            if words[:1] == ["-A"] and not words[1].startswith(ours) and jumps.startswith(ours):
                _run(*self.in_netns("iptables", "-t", "filter", "-D", *words[1:]))
        chains = [ln[1:].split()[0] for ln in saved if ln[:1] == ":" and ln[1:].startswith(ours)]
        for flag in ("-F", "-X"):
            for chain in chains:
                _run(*self.in_netns("iptables", "-t", "filter", flag, chain))
        for name in _run(*self.in_netns("ipset", "list", "-n")).stdout.split():
            if name.startswith("KUBE-"):
                _run(*self.in_netns("ipset", "destroy", name))

    # ---- teardown ----------------------------------------------------------------------------

    def stop_processes(self, order: Sequence[str] = ("kubelet", "kube-proxy", "coredns")) -> None:
        """The kubelet first (so nothing restarts), then every container, containerd, its shims."""
        for name in order:
            proc = self.processes.get(name)
            if proc is not None:
                proc.terminate()
                proc.kill(time.monotonic() + 3.0)
        for cg in self._new_cgroups():
            _kill_cgroup_tree(cg)
        proc = self.processes.get("containerd")
        if proc is not None:
            proc.terminate()
            proc.kill(time.monotonic() + 5.0)
        # Shims double-fork away from containerd (they outlive it by design); they are found by
        # the containerd address on their command line.
        self._kill_by_cmdline(str(self.containerd_socket).encode())

    def _new_cgroups(self) -> list[Path]:
        # By name (the kubelet's cgroupRoot), plus whatever else appeared since setup (e.g. a
        # runtime's own); without a snapshot (`reap`), by name only: never anyone else's.
        named = set(self.cgroup_dirs())
        new = set() if self._cgroups_before is None else _cgroup_children() - self._cgroups_before
        return sorted(p for p in named | new if p.is_dir())

    def reap(self) -> None:
        """Remove what the node of a dead session left (its pytest was SIGKILLed, so no
        teardown ran): by the work dir and the owner's names alone."""
        self._network_up = True
        self._started = True
        self._kill_by_cmdline(str(self.workdir).encode())
        self.teardown()

    @staticmethod
    def _kill_by_cmdline(marker: bytes) -> None:
        for pid in _pids_with(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def teardown(self) -> None:
        """Remove everything the node added to the host; safe after a partial start."""
        if self._torn_down:
            return
        self._torn_down = True
        if self._started:
            self.stop_processes()
        # Mounts: deepest first, detached (a mount still busy goes as soon as it is free); the
        # kept image store's too (containerd's temporary mounts while it unpacks a layer).
        prefixes = tuple(str(p) for p in (self.workdir, self.image_store) if p is not None)
        for point in sorted(_mount_points(), key=len, reverse=True):
            new_netns = (
                self._netns_before is not None
                and point.startswith("/run/netns/")
                and Path(point).name not in self._netns_before
                and Path(point).name != self.netns
            )
            if point.startswith(prefixes) or new_netns:
                _run("umount", "-l", point, check=False)
                if new_netns:
                    with contextlib.suppress(OSError):
                        Path(point).unlink()
        for link in _log_links(str(self.workdir)):
            with contextlib.suppress(OSError):
                link.unlink()
        if self._network_up:
            _run("ip", "link", "del", self.host_veth, check=False)
            _run("ip", "netns", "del", self.netns, check=False)
            netns_dir = Path("/run/netns")
            if (
                self._netns_dir_mounted is False
                and netns_dir.is_dir()
                and not any(netns_dir.iterdir())
            ):
                _run("umount", str(netns_dir), check=False)
                with contextlib.suppress(OSError):
                    netns_dir.rmdir()
        if self._shim_dir_existed is False:
            shutil.rmtree(SHIM_SOCKETS.parent, ignore_errors=True)
        elif self._shim_dir_existed and SHIM_SOCKETS.exists():
            for name in set(os.listdir(SHIM_SOCKETS)) - self._shim_sockets_before:
                with contextlib.suppress(OSError):
                    (SHIM_SOCKETS / name).unlink()
        for cg in self._new_cgroups():
            _remove_cgroup_tree(cg)
        if self._store_lock is not None:  # the kept image store is free for the next session
            self._store_lock.close()
            self._store_lock = None

    def leftovers(self) -> list[str]:
        """What of the node is still on the host: [] after a clean teardown. Derived from the
        work dir and this process's names alone, so a fresh `RealNode` can check an old one."""
        prefix = str(self.workdir)
        out = [f"mount {p}" for p in _mount_points() if p.startswith(prefix)]
        out += [f"cgroup {d}" for d in self.cgroup_dirs() if d.exists()]
        if Path("/run/netns", self.netns).exists():
            out.append(f"netns {self.netns}")
        if Path("/sys/class/net", self.host_veth).exists():
            out.append(f"veth {self.host_veth}")
        out += [f"log link {p}" for p in _log_links(prefix)]
        out += [f"process {pid}" for pid in _pids_with(prefix.encode())]
        return out
