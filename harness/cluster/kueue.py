"""Kueue in the test cluster: its manager built from its Go module (build.sh), run beside the
control plane like kube-scheduler, with the CRDs, webhook configurations and webhook Service of
its own Helm chart (rendered by build.sh to `kueue-<version>.yaml`).

What differs from `helm install kueue`, and why:
- The manager runs as a host process, not a pod: the kwok nodes run nothing, and the real node
  would need Kueue's image from a registry these machines cannot reach.
- The webhook Service is `ExternalName: localhost` on the manager's port: the API server resolves
  an ExternalName Service to that host (and still verifies the certificate for
  `kueue-webhook-service.kueue-system.svc`), so webhook calls reach the host process. Every
  webhook's and conversion webhook's `service.port` is set to that port.
- Certificates are Kueue's own internal cert management, exactly as the chart configures it
  (no cert-manager): the manager generates a CA and serving certificate into Secret
  `kueue-webhook-server-cert` and injects the CA bundle into its webhook configurations and CRDs.
  In a pod the kubelet projects that Secret into the manager's cert directory, which the manager
  waits for; here a thread does what the Secret volume does (`_project_secret`).
- The visibility APIService is not registered (no on-demand visibility server), leader election
  is off (one manager), and `integrations.externalFrameworks` names ImpalaJob.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from ..net import free_port
from .kube import Kube, wait_for

NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"
WEBHOOK_CONFIGS = (
    ("MutatingWebhookConfiguration", "kueue-mutating-webhook-configuration"),
    ("ValidatingWebhookConfiguration", "kueue-validating-webhook-configuration"),
)
EXTERNAL_FRAMEWORK = "ImpalaJob.v1alpha1.impala.dev"


def manifests_path(bin_dir: Path) -> Path:
    """The rendered chart build.sh caches beside the binaries (KUEUE_VERSION as build.sh's)."""
    return bin_dir.parent / f"kueue-{os.environ.get('KUEUE_VERSION', 'v0.17.0')}.yaml"


def _point_at(client_config: dict[str, Any], port: int) -> None:
    service = client_config.get("service")
    if service is not None:
        service["port"] = port


def install_documents(rendered: str, port: int) -> list[dict[str, Any]]:
    """The chart's objects the harness applies, pointed at the host process on `port`."""
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    ]
    for doc in yaml.safe_load_all(rendered):
        if not doc:
            continue
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind == "CustomResourceDefinition":
            webhook = (doc["spec"].get("conversion") or {}).get("webhook")
            if webhook:
                _point_at(webhook["clientConfig"], port)
            docs.append(doc)
        elif (kind, name) in WEBHOOK_CONFIGS:
            for hook in doc["webhooks"]:
                _point_at(hook["clientConfig"], port)
            docs.append(doc)
        elif kind == "Secret" and name == SECRET:
            docs.append(doc)
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE},
            "spec": {"type": "ExternalName", "externalName": "localhost"},
        }
    )
    return docs


def manager_config(
    rendered: str, *, webhook_port: int, health_port: int, cert_dir: Path
) -> dict[str, Any]:
    """The chart's manager Configuration, adapted to a host process (see the module docstring)."""
    config_map = next(
        doc
        for doc in yaml.safe_load_all(rendered)
        if doc and doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "kueue-manager-config"
    )
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["controller_manager_config.yaml"])
    config["namespace"] = NAMESPACE
    config["leaderElection"] = {"leaderElect": False}
    config["health"] = {"healthProbeBindAddress": f"127.0.0.1:{health_port}"}
    config["metrics"] = {"bindAddress": "0"}
    config["webhook"] = {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)}
    integrations = config.setdefault("integrations", {})
    integrations["externalFrameworks"] = [EXTERNAL_FRAMEWORK]
    return config


def _ca_injected(kube: Kube) -> bool:
    for kind, name in WEBHOOK_CONFIGS:
        doc = kube.get(kind.lower(), name)
        if not all(h["clientConfig"].get("caBundle") for h in doc["webhooks"]):
            return False
    return True


def _webhooks_answer(kube: Kube) -> bool:
    """A server-side dry run through Kueue's ResourceFlavor webhooks succeeds."""
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "harness-probe"},
    }
    kube.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(flavor))
    return True


def _project_secret(kube: Kube, cert_dir: Path, stop: threading.Event) -> None:
    """Keep `cert_dir` holding the webhook Secret's files, as a Secret volume does."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    seen: dict[str, str] = {}
    # Each second until the certificates are there (the manager waits for them), then every
    # 30 s for a rotation: a kubectl process a second would cost the tests CPU for nothing.
    while not stop.wait(30.0 if seen else 1.0):
        try:
            data = kube.get("secret", SECRET, "-n", NAMESPACE).get("data") or {}
        except Exception:  # the API server is busy or restarting: try again next second
            continue
        for key, value in data.items():
            if seen.get(key) == value:
                continue
            tmp = cert_dir / f".{key}.tmp"
            tmp.write_bytes(base64.b64decode(value))
            tmp.replace(cert_dir / key)
            seen[key] = value


@contextlib.contextmanager
def running(kube: Kube, bin_dir: Path, workdir: Path, timeout: float = 90.0) -> Iterator[int]:
    """Install Kueue's objects, run its manager until the block ends, then remove the webhook
    configurations (a stopped manager must not leave the API server calling a dead webhook).
    Yields the manager's process id."""
    rendered = manifests_path(bin_dir).read_text()
    webhook_port, health_port = free_port(), free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    cert_dir = workdir / "certs"
    config_path = workdir / "config.yaml"
    config = manager_config(
        rendered, webhook_port=webhook_port, health_port=health_port, cert_dir=cert_dir
    )
    config_path.write_text(yaml.safe_dump(config))
    docs = install_documents(rendered, webhook_port)
    kube.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump_all(docs)
    )
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            kube.wait_crd_established(doc["metadata"]["name"])
    stop = threading.Event()
    projector = threading.Thread(
        target=_project_secret, args=(kube, cert_dir, stop), name="kueue-certs", daemon=True
    )
    projector.start()
    log = (workdir / "kueue.log").open("wb")
    proc = subprocess.Popen(
        [str(bin_dir / "kueue"), f"--config={config_path}", "--zap-log-level=2",
         "--feature-gates=VisibilityOnDemand=false"],
        env=kube.env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{health_port}/readyz"
        wait_for(lambda: urllib.request.urlopen(url, timeout=2).status == 200, timeout=timeout,
                 what="kueue /readyz")  # fmt: skip
        wait_for(lambda: _ca_injected(kube), timeout=timeout, what="kueue's CA bundle injected")
        wait_for(lambda: _webhooks_answer(kube), timeout=timeout, what="kueue's webhooks")
        yield proc.pid
    except Exception:
        print(f"--- kueue log tail\n{tail(workdir / 'kueue.log')}")
        raise
    finally:
        stop.set()
        for kind, name in WEBHOOK_CONFIGS:
            kube.kubectl("delete", kind.lower(), name, "--ignore-not-found", "--wait=false")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def tail(path: Path, lines: int = 60) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
