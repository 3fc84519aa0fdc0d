"""What the operator's end-to-end tests (tests/e2e/test_operator.py) and the Kueue tests share:
`Operator` (`impalajob operator` as a child process), `Sidecar` (a real status sidecar over a run
directory the test writes), `OperatorSuite` (the class-scoped namespace, operator and sidecar
fixtures and the helpers that read a job back; a test class subclasses it and provides
`operator_identity`), the operator's environment and the suite's small job.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import Kube, wait_for
from harness.net import free_port
from impala_api.roles import LOCAL_EXECUTABLE, status_command
from impala_api.snapshot import (
    STATUS_FILE,
    Counters,
    LearnerQueue,
    StatusSnapshot,
    StopProgress,
    Throughput,
    write_json_atomic,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "cartpole.yaml"
URL_ANNOTATION = "impala.dev/status-url"
OPERATOR_ENV = {
    "IMPALA_OPERATOR_RECONCILE_INTERVAL": "1",
    "IMPALA_OPERATOR_RESTART_BACKOFF_SECONDS": "1",
    "IMPALA_OPERATOR_SIDECAR_TIMEOUT": "1",
    "IMPALA_OPERATOR_HEALTH_PORT": "0",
}


class Operator:
    """`impalajob operator` as a child process, restartable (and killable) by tests."""

    def __init__(self, kube: Kube, kubeconfig: Path, namespace: str, logdir: Path) -> None:
        self.kube, self.kubeconfig, self.namespace, self.logdir = (
            kube,
            kubeconfig,
            namespace,
            logdir,
        )
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, *extra: str) -> None:
        self.starts += 1
        log = (self.logdir / f"operator-{self.starts}.log").open("wb")
        env = {**self.kube.env_for(self.kubeconfig), **OPERATOR_ENV}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "impala_cli.main",
                "operator",
                "--namespace",
                self.namespace,
                "--kubeconfig",
                str(self.kubeconfig),
                "--metrics-port",
                str(self.metrics_port),
                *(["--log-level=debug"] if os.environ.get("E2E_OPERATOR_VERBOSE") else []),
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        wait_for(self.metrics, timeout=60, what="operator /metrics")

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as response:
            return str(response.read().decode())

    def kill(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log_tail(self, lines: int = 60) -> str:
        text = (self.logdir / f"operator-{self.starts}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    @classmethod
    @contextlib.contextmanager
    def running(
        cls, kube: Kube, kubeconfig: Path, namespace: str, logdir: Path
    ) -> Iterator[Operator]:
        """An operator started for the block, stopped after it (its log tail printed)."""
        op = cls(kube, kubeconfig, namespace, logdir)
        op.start()
        try:
            yield op
        finally:
            op.kill()
            print(f"--- operator log tail\n{op.log_tail()}")


class Sidecar:
    """A real status sidecar (`impalajob status-server`) over a run directory the test writes."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/status"
        self.steps = 0
        self.write(fill=0.5, idle=0.1)
        self.proc = subprocess.Popen(
            status_command(
                str(run_dir), status_port=self.port, host="127.0.0.1", executable=LOCAL_EXECUTABLE
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for(
            lambda: urllib.request.urlopen(self.url, timeout=2).status == 200,
            timeout=60,
            what="status sidecar",
        )

    def write(self, *, fill: float, idle: float, steps: int | None = None) -> None:
        """A fresh snapshot of a running learner: queue fill, idle fraction, env steps."""
        self.steps = self.steps + 500 if steps is None else steps
        write_json_atomic(
            self.run_dir / STATUS_FILE,
            StatusSnapshot(
                job="e2e",
                phase="Running",
                started_at=time.time() - 60,
                updated_at=time.time(),
                counters=Counters(num_env_steps_sampled=self.steps, episodes=self.steps // 50),
                episode_return_mean=round(self.steps / 100, 1),
                throughput=Throughput(env_steps_per_s=700.0),
                learner_queue=LearnerQueue(capacity=16, fill=fill, learner_idle_fraction=idle),
                # As RunStats reports a stop at 50,000 steps: the share done, the time left.
                stop=StopProgress(
                    criteria={"timesteps": 50_000.0}, progress=self.steps / 50_000,
                    foreseeable=self.steps / 50_000,
                    remaining_seconds=(50_000 - self.steps) / 700.0,
                ),
            ),
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


SMALL_JOB: dict[str, Any] = {
    "env": {"id": "CartPole-v1", "numEnvsPerWorker": 4},
    "rollouts": {"minReplicas": 1, "maxReplicas": 3},
}
"""The spec of the suite's jobs (`job_manifest(name, SMALL_JOB, **sections)`)."""


class OperatorSuite:
    """The fixtures and helpers of an operator test class; subclasses provide
    `operator_identity` (how the operator was installed)."""

    @pytest.fixture(scope="class")
    def ns(self, kube: Kube) -> Iterator[str]:
        with kube.namespace(type(self).__name__.lower()[:20]) as name:
            yield name

    @pytest.fixture(scope="class")
    def operator_identity(self, kube: Kube, ns: str) -> Path:
        raise NotImplementedError

    @pytest.fixture(scope="class")
    def operator(
        self, kube: Kube, ns: str, operator_identity: Path, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[Operator]:
        with Operator.running(
            kube, operator_identity, ns, tmp_path_factory.mktemp("operator")
        ) as op:
            yield op

    @pytest.fixture
    def sidecar(self, tmp_path: Path) -> Iterator[Sidecar]:
        sc = Sidecar(tmp_path / "run")
        yield sc
        sc.stop()

    @staticmethod
    def create(kube: Kube, ns: str, manifest: dict[str, Any]) -> None:
        kube.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(manifest))

    @staticmethod
    def ij(kube: Kube, ns: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = kube.get("ij", name, "-n", ns)
        return result

    def wait_status(
        self,
        kube: Kube,
        ns: str,
        name: str,
        check: Callable[[dict[str, Any]], Any],
        what: str,
        timeout: float = 60,
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            status = self.ij(kube, ns, name).get("status") or {}
            return status if check(status) else None

        try:
            return wait_for(probe, timeout=timeout, interval=0.5, what=f"{name}: {what}")
        except TimeoutError as exc:
            status = self.ij(kube, ns, name).get("status") or {}
            raise AssertionError(f"{exc}; status: {json.dumps(status)}") from None

    @staticmethod
    def replicas(kube: Kube, ns: str, name: str) -> int:
        return int(kube.get("deployment", name, "-n", ns)["spec"]["replicas"])

    @staticmethod
    def learner_pods(kube: Kube, ns: str, name: str) -> list[str]:
        pods = kube.pods(
            ns, f"app.kubernetes.io/instance={name},app.kubernetes.io/component=learner"
        )
        return sorted(
            p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")
        )

    @staticmethod
    def events(kube: Kube, ns: str, name: str) -> list[str]:
        items = kube.get("events", "-n", ns, "--field-selector", f"involvedObject.name={name}")
        return [e["reason"] for e in items["items"]]

    @staticmethod
    def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
        return next((c for c in status.get("conditions", []) if c["type"] == type_), {})
