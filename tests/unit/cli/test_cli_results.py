"""`impalajob evaluate|export NAME`: the reader pod that streams a job's results off its claim
(its manifest, and the script it runs, here run against a local run directory), and the refusals
that need no cluster."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
import tarfile
from pathlib import Path

from impala_cli.commands.results import _READ_SCRIPT, READER_MOUNT, reader_pod
from impala_trainer.rundir.checkpoint import (
    DriverState,
    policy_state,
    save_checkpoint,
    save_policy_checkpoint,
)


def _run_dir(path: Path) -> Path:
    (path / "checkpoints").mkdir(parents=True)
    (path / "config.yaml").write_text("kind: ImpalaJob\n")
    for steps in (100, 200):
        save_checkpoint(path / "checkpoints", {"w": [steps]}, DriverState(), keep=5)
    best = policy_state({"w": [1.0]}, 3, 100)
    save_policy_checkpoint(path / "checkpoints" / "best", best, DriverState())
    (path / "checkpoints" / "ckpt-000003").mkdir()  # incomplete: never picked
    return path


def _read(run: Path, want: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _READ_SCRIPT, str(run), want],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def _members(out: str) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(out))) as tar:
        return sorted(m.name for m in tar.getmembers() if m.isfile())


def test_the_reader_script_streams_the_config_and_the_newest_complete_checkpoint(
    tmp_path: Path,
) -> None:
    run = _run_dir(tmp_path / "run")
    newest = _read(run)
    assert newest.returncode == 0, newest.stderr
    assert _members(newest.stdout) == [
        "checkpoints/ckpt-000002/learner.pt", "checkpoints/ckpt-000002/state.json", "config.yaml"
    ]  # fmt: skip
    assert "checkpoints/best/learner.pt" in _members(_read(run, "best").stdout)
    missing = _read(run, "ckpt-000003")
    assert missing.returncode != 0
    assert "NOTFOUND ckpt-000003; there are: ckpt-000001, ckpt-000002, best" in missing.stderr


def test_the_reader_pod_mounts_the_claim_read_only_with_the_jobs_security(tmp_path: Path) -> None:
    spec = {"image": "my-impala:0.1.0", "imagePullPolicy": "Never"}
    pod = reader_pod("cartpole", spec, "cartpole-results", "cartpole-results-abc123")
    podspec = pod["spec"]
    (container,) = podspec["containers"]
    assert container["image"] == "my-impala:0.1.0" and container["imagePullPolicy"] == "Never"
    assert container["volumeMounts"] == [{"name": "run", "mountPath": READER_MOUNT,
                                          "readOnly": True}]  # fmt: skip
    assert podspec["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "cartpole-results", "readOnly": True
    }  # fmt: skip
    # The restricted Pod Security Standard, as the job's own pods; it ends itself in time.
    assert podspec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert podspec["automountServiceAccountToken"] is False
    assert podspec["restartPolicy"] == "Never" and podspec["activeDeadlineSeconds"] > 0
    # Not a child of the job: the operator's selectors must not count it.
    assert not any(k.startswith("app.kubernetes.io") for k in pod["metadata"]["labels"])
