"""A cluster job's results on this machine: its config.yaml and one checkpoint, copied from where
the job keeps its run directory, into a local directory `load_policy` reads like any run's.

- `checkpoint.storageUri`: straight from the store (this machine's S3 credentials: AWS_* or
  boto3's usual chain), as the mirror wrote it.
- `checkpoint.volumeClaim`: a short-lived reader pod mounts the claim read-only, with the job's
  image and the restricted security settings of the job's own pods, and a Python one-liner in
  it streams the files out as a base64 tar over `exec` (text-safe through the websocket); the
  pod is deleted after, and `activeDeadlineSeconds` ends it even if this command is killed.
  What the user needs is what `kubectl cp` needs: create pods and pods/exec in the namespace.
- neither: the run directory went with the learner pod; the error says so.
"""

from __future__ import annotations

import base64
import io
import secrets
import tarfile
import time
from pathlib import Path
from typing import Any

from impala_api.snapshot import CHECKPOINT_DIR, CONFIG_FILE
from impala_api.spec import API_GROUP, API_VERSION, PLURAL
from impala_cli.commands import EXIT_FAILED, CommandError
from impala_cli.commands.cluster import NoClusterError, connect

READER_MOUNT = "/run-dir"
READER_SECONDS = 600
"""The reader pod's activeDeadlineSeconds: it ends itself if nobody deletes it."""
_READER_LABEL = "impala.dev/results-reader"

# Run in the reader pod with the job's image (so Python is there): the newest complete
# checkpoint unless one is named, with config.yaml, as a base64 tar on stdout.
_READ_SCRIPT = """
import base64, io, pathlib, re, sys, tarfile
root, want = pathlib.Path(sys.argv[1]), sys.argv[2]
done = lambda p: (p / "learner.pt").is_file() and (p / "state.json").is_file()
ckpts = sorted((p for p in (root / "checkpoints").glob("ckpt-*") if done(p)),
               key=lambda p: int(re.sub(r"\\D", "", p.name) or 0))
pick = root / "checkpoints" / want if want else (ckpts[-1] if ckpts else None)
if not (root / "config.yaml").is_file() or pick is None or not done(pick):
    names = [p.name for p in ckpts] + (["best"] if done(root / "checkpoints" / "best") else [])
    sys.exit(f"NOTFOUND {want or 'a checkpoint'}; there are: {', '.join(names) or 'none'}")
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w") as tar:
    tar.add(root / "config.yaml", "config.yaml")
    tar.add(pick, "checkpoints/" + pick.name)
sys.stdout.write(base64.b64encode(buf.getvalue()).decode())
"""


def fetch_job_results(name: str, namespace: str | None, checkpoint: str | None, dest: Path) -> Path:
    """Copy job `name`'s config.yaml and its newest checkpoint (or `checkpoint`: a ckpt-* name
    or `best`) into `dest`; returns the checkpoint's local directory."""
    obj, namespace = _read_job(name, namespace)
    spec = obj.get("spec") or {}
    kept = spec.get("checkpoint") or {}
    if kept.get("storageUri"):
        return _from_store(name, obj, str(kept["storageUri"]), checkpoint, dest)
    if kept.get("volumeClaim"):
        data = _through_reader_pod(name, namespace, spec, str(kept["volumeClaim"]), checkpoint)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(dest, filter="data")
        return next((dest / CHECKPOINT_DIR).iterdir())
    raise CommandError(
        f"ImpalaJob {namespace}/{name} keeps no results: it has neither "
        "spec.checkpoint.volumeClaim nor spec.checkpoint.storageUri, so its run directory went "
        "with the learner pod",
        EXIT_FAILED,
    )


def _read_job(name: str, namespace: str | None) -> tuple[dict[str, Any], str]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        namespace = connect(namespace).namespace
    except NoClusterError as err:
        raise CommandError(f"cannot look up ImpalaJob {name}: {err}", EXIT_FAILED) from None
    try:
        obj = client.CustomObjectsApi().get_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, PLURAL, name
        )
    except ApiException as err:
        why = "not found" if err.status == 404 else f"cannot be read: {err.status} {err.reason}"
        raise CommandError(f"ImpalaJob {namespace}/{name} {why}", EXIT_FAILED) from None
    return dict(obj), namespace


def _from_store(
    name: str, obj: dict[str, Any], uri: str, checkpoint: str | None, dest: Path
) -> Path:
    from impala_trainer.rundir.checkpoint import LEARNER_FILE, STATE_FILE
    from impala_trainer.rundir.remote import RemoteRun

    uid = (obj.get("metadata") or {}).get("uid")
    remote = RemoteRun(uri, job=name, uid=uid)
    try:
        names = remote.checkpoints()
        pick = checkpoint or (names[-1] if names else None)
        if pick is None:
            raise CommandError(f"{uri} holds no complete checkpoint of {name}", EXIT_FAILED)
        remote.download(CONFIG_FILE, dest / CONFIG_FILE)
        for file in (LEARNER_FILE, STATE_FILE):
            remote.download(f"{CHECKPOINT_DIR}/{pick}/{file}", dest / CHECKPOINT_DIR / pick / file)
    except CommandError:
        raise
    except Exception as err:  # botocore: no credentials, no such key, unreachable
        raise CommandError(f"cannot read {name}'s results from {uri}: {err}", EXIT_FAILED) from None
    return dest / CHECKPOINT_DIR / pick


def reader_pod(job: str, spec: dict[str, Any], claim: str, pod_name: str) -> dict[str, Any]:
    """The reader pod: the job's image, the claim read-only, the job pods' security settings."""
    from impala_operator.build.pod_template import container_security_context, pod_defaults

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "labels": {_READER_LABEL: job}},
        "spec": {
            **pod_defaults(),
            "restartPolicy": "Never",
            "activeDeadlineSeconds": READER_SECONDS,
            "containers": [{
                "name": "reader",
                "image": spec.get("image") or "impalajob:0.1.0",
                "imagePullPolicy": spec.get("imagePullPolicy") or "IfNotPresent",
                "command": ["sleep", str(READER_SECONDS)],
                "securityContext": container_security_context(),
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"},
                              "limits": {"memory": "512Mi"}},
                "volumeMounts": [{"name": "run", "mountPath": READER_MOUNT, "readOnly": True}],
            }],
            "volumes": [
                {"name": "run", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
            ],
        },
    }  # fmt: skip


def _through_reader_pod(
    job: str, namespace: str, spec: dict[str, Any], claim: str, checkpoint: str | None
) -> bytes:
    from kubernetes import client

    api = client.CoreV1Api()
    pod_name = f"{job}-results-{secrets.token_hex(3)}"
    api.create_namespaced_pod(namespace, reader_pod(job, spec, claim, pod_name))
    try:
        _wait_running(api, namespace, pod_name, claim)
        command = ["python", "-c", _READ_SCRIPT, READER_MOUNT, checkpoint or ""]
        out, err, code = _exec(api, namespace, pod_name, command)
    finally:
        api.delete_namespaced_pod(pod_name, namespace, grace_period_seconds=0)
    if code != 0:
        why = err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
        raise CommandError(f"claim {claim} of ImpalaJob {job}: {why.removeprefix('NOTFOUND ')}",
                           EXIT_FAILED)  # fmt: skip
    return base64.b64decode(out)


def _wait_running(api: Any, namespace: str, pod: str, claim: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = api.read_namespaced_pod(pod, namespace).status
        if status.phase == "Running":
            return
        if status.phase in ("Failed", "Succeeded"):
            break
        time.sleep(1)
    raise CommandError(
        f"the pod reading claim {claim} ({namespace}/{pod}) did not start within {timeout:.0f} s "
        "(is the claim bound, and mountable on a node now?)",
        EXIT_FAILED,
    )


def _exec(api: Any, namespace: str, pod: str, command: list[str]) -> tuple[str, str, int]:
    from kubernetes.stream import stream

    resp = stream(
        api.connect_get_namespaced_pod_exec, pod, namespace, command=command,
        stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False,
    )  # fmt: skip
    out, err = [], []
    while resp.is_open():
        resp.update(timeout=1)
        if resp.peek_stdout():
            out.append(resp.read_stdout())
        if resp.peek_stderr():
            err.append(resp.read_stderr())
    resp.close()
    return "".join(out), "".join(err), int(resp.returncode or 0)
