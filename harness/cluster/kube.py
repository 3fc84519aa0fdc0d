"""`Kube`: what a test gets from the `kube` fixture, for the local control plane or any cluster.

Everything goes through the `kubectl` and `helm` binaries so the harness has no Python
dependencies and a test's commands can be pasted into a shell to reproduce a failure.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
"""Nodes carrying this annotation (value `fake`) are simulated by kwok."""

EXIT_CODE_ANNOTATION = "e2e.impala.dev/exit-code"
"""Set on a Running pod of the local cluster to end it: `0` succeeds, anything else fails
(see harness/cluster/kwok/stages.yaml)."""


class CommandError(RuntimeError):
    """A kubectl/helm command failed; the message carries its stdout and stderr."""

    def __init__(self, args: list[str], proc: subprocess.CompletedProcess[str]) -> None:
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        super().__init__(
            f"{' '.join(args)} exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}"
        )


def wait_for(
    check: Callable[[], T | None],
    *,
    timeout: float = 60.0,
    interval: float = 0.5,
    what: str = "",
    fatal: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll `check` until it returns something truthy.

    Exceptions count as "not yet" (the object may not exist yet), except those in `fatal`.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except fatal:
            raise
        except Exception as exc:
            last = exc
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what or check}"
            ) from last
        time.sleep(interval)


def _slug(text: str, limit: int) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-")


@dataclass
class Kube:
    """A reachable cluster plus runners for the CLIs, configured for it."""

    kubeconfig: Path
    """Admin kubeconfig (cluster-admin on the local control plane)."""
    bin_dir: Path | None
    """Directory holding kubectl/helm/kwok; prepended to PATH in `env`."""
    workdir: Path
    """Scratch space for generated kubeconfigs; removed with the cluster."""
    is_local: bool = True
    """True for the harness's own control plane (kwok nodes); False with
    IMPALA_E2E_EXISTING_CLUSTER."""
    version: str = ""
    """Server gitVersion, e.g. v1.37.2."""
    restart: Callable[..., None] | None = None
    """`ControlPlane.restart(*components, down=seconds)` on the local control plane (None on
    an existing cluster): the fault tests restart etcd, the API server, the kubelet."""
    _namespaces: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """Environment for subprocesses (operator, CLI) that should talk to this cluster."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        if self.bin_dir is not None:
            env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        # Helm keeps repositories and plugins in the user's home; a test must not see or change
        # the developer's.
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            env[var] = str(self.workdir / "helm" / var.split("_")[1].lower())
        return env

    def _tool(self, name: str) -> str:
        if self.bin_dir is not None and (self.bin_dir / name).exists():
            return str(self.bin_dir / name)
        return name

    def run(
        self,
        tool: str,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `tool args...` against this cluster; raise CommandError on failure if `check`."""
        argv = [self._tool(tool), *args]
        proc = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else self.env,
            check=False,
        )
        if check and proc.returncode != 0:
            raise CommandError(argv, proc)
        return proc

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run kubectl with the admin kubeconfig (or `env=` for another identity)."""
        return self.run("kubectl", *args, **kwargs)

    def helm(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run helm with the admin kubeconfig."""
        return self.run("helm", *args, **kwargs)

    def get(self, *args: str, **kwargs: Any) -> Any:
        """`kubectl get ... -o json`, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json", **kwargs).stdout)

    def apply(self, manifest: Mapping[str, Any] | str, *args: str) -> None:
        """`kubectl apply -f -` of one object/List given as a dict, or YAML/JSON text."""
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self.kubectl("apply", "-f", "-", *args, stdin=text)

    @contextlib.contextmanager
    def namespace(self, hint: str = "e2e") -> Iterator[str]:
        """A fresh namespace, deleted (without waiting) when the block ends.

        Waits for the namespace's `default` ServiceAccount: until the controller-manager creates
        it, the ServiceAccount admission plugin rejects every pod in the namespace.
        """
        name = f"{_slug(hint, 40) or 'e2e'}-{secrets.token_hex(3)}"
        self.kubectl("create", "namespace", name)
        self._namespaces.append(name)
        try:
            wait_for(
                lambda: self.kubectl("get", "serviceaccount", "default", "-n", name),
                timeout=60,
                what=f"serviceaccount default in {name}",
            )
            yield name
        finally:
            self._namespaces.remove(name)
            self.kubectl(
                "delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False
            )

    def sa_kubeconfig(self, namespace: str, service_account: str, *, duration: str = "2h") -> Path:
        """A kubeconfig that authenticates as `namespace/service_account`.

        The token comes from the TokenRequest API (`kubectl create token`), exactly as a pod's
        projected token does, so a process run with this file has the RBAC that the account's
        (Cluster)RoleBindings grant and nothing more.
        """
        token = self.kubectl(
            "create", "token", service_account, "-n", namespace, f"--duration={duration}"
        ).stdout.strip()
        cfg = json.loads(
            self.kubectl("config", "view", "--raw", "--minify", "--flatten", "-o", "json").stdout
        )
        cluster = cfg["clusters"][0]
        user = f"system:serviceaccount:{namespace}:{service_account}"
        out = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {
                    "name": user,
                    "context": {
                        "cluster": cluster["name"],
                        "user": user,
                        "namespace": namespace,
                    },
                }
            ],
            "current-context": user,
        }
        path = (
            self.workdir / "kubeconfigs" / f"{namespace}.{service_account}.{secrets.token_hex(3)}"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        write_kubeconfig(path, out)
        return path

    def env_for(self, kubeconfig: Path) -> dict[str, str]:
        """`env` with KUBECONFIG pointing at another identity (e.g. from `sa_kubeconfig`)."""
        env = self.env
        env["KUBECONFIG"] = str(kubeconfig)
        return env

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        """Pods in `namespace` matching a label selector."""
        args = ["pods", "-n", namespace] + (["-l", selector] if selector else [])
        items: list[dict[str, Any]] = self.get(*args)["items"]
        return items

    def wait_crd_established(self, name: str, timeout: float = 60.0) -> None:
        """Until the API server serves CRD `name`. Polled, not `kubectl wait`: right after an
        apply the CRD may have no conditions yet, and kubectl wait then fails instead of
        waiting (seen with a large CRD on a loaded machine)."""

        def established() -> bool:
            conds = self.get("crd", name).get("status", {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

        wait_for(established, timeout=timeout, what=f"CRD {name} to be established")

    def end_pod(self, namespace: str, pod: str, exit_code: int = 0, reason: str = "") -> None:
        """Make a kwok-run pod terminate with `exit_code` (local cluster only)."""
        if not self.is_local:
            raise RuntimeError("end_pod needs the kwok-backed local control plane")
        args = [f"{EXIT_CODE_ANNOTATION}={exit_code}"]
        if reason:
            args.append(f"e2e.impala.dev/reason={reason}")
        self.kubectl("annotate", "pod", pod, "-n", namespace, "--overwrite", *args)


def write_kubeconfig(path: Path, config: Mapping[str, Any]) -> None:
    """Write a kubeconfig (JSON is valid YAML) readable only by its owner: it holds secrets."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(config, f, indent=2)


def b64file(path: Path) -> str:
    """Base64 of a file, for kubeconfig `*-data` fields."""
    return base64.b64encode(path.read_bytes()).decode()
