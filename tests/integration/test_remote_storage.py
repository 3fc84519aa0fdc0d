"""`checkpoint.storageUri` against a real S3-compatible server (versitygw, built from its Go
module by harness/cluster/build-s3.sh): the mirror's uploads, pruning and pull, the owner record
that keeps one job off another's run, and `impalajob train` resuming on a fresh run directory
(another machine, a new pod) from the store alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import wait_for
from harness.cluster.s3 import S3Server
from impala_trainer.rundir.checkpoint import (
    DriverState,
    list_checkpoints,
    policy_state,
    save_checkpoint,
    save_policy_checkpoint,
)
from impala_trainer.rundir.remote import Mirror, RemoteRun, StorageError, open_remote

EXAMPLE = "manifests/examples/cartpole.yaml"
BUCKET = "results"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=server.endpoint,
            aws_access_key_id=server.access_key,
            aws_secret_access_key=server.secret_key,
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)
        yield server


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The store's credentials as a Secret would give them to the learner."""
    env = {
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_ENDPOINT_URL": s3.endpoint,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("IMPALA_JOB_UID", raising=False)
    return env


def _checkpoint(run: Path, steps: int) -> Path:
    state = DriverState(counters={"num_env_steps_sampled": steps})
    return save_checkpoint(run / "checkpoints", {"w": [float(steps)]}, state, keep=3)


def _keys(remote: RemoteRun) -> set[str]:
    return set(remote._keys(""))


def test_mirror_uploads_prunes_and_a_new_machine_pulls(tmp_path: Path, s3_env: dict) -> None:
    uri = f"s3://{BUCKET}/mirror/run-a"
    run = tmp_path / "run"
    remote = open_remote(uri, "cp", run, resume=False, uid="uid-1")
    mirror = Mirror(remote, run, keep=2)
    for steps in (100, 200, 300):
        _checkpoint(run, steps)
        mirror.request()
    (run / "history.jsonl").write_text('{"env_steps": 300}\n')
    (run / "summary.json").write_text('{"phase": "Succeeded"}')
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out.tfevents.1").write_bytes(b"\0" * 100)
    # spec.evaluation's outputs: the best round's weights (replaced in place) and its videos.
    best = save_policy_checkpoint(
        run / "checkpoints" / "best", policy_state({"w": [1.0]}, 7, 250), DriverState()
    )
    (run / "videos").mkdir()
    (run / "videos" / "eval-000000000250.mp4").write_bytes(b"\1" * 50)
    assert mirror.close() and mirror.last_error is None
    keys = _keys(remote)
    # the newest `keep` checkpoints, complete; the run's files; the owner record
    assert remote.checkpoints() == ["ckpt-000002", "ckpt-000003"]
    assert {
        "summary.json",
        "history.jsonl",
        "run.json",
        "tensorboard/events.out.tfevents.1",
        "checkpoints/best/learner.pt",
        "checkpoints/best/state.json",
        "videos/eval-000000000250.mp4",
    } <= keys
    assert not any(k.startswith("checkpoints/ckpt-000001") for k in keys)

    # Another machine, an empty run directory: the newest checkpoint and the curves come down.
    elsewhere = tmp_path / "elsewhere"
    pulled = open_remote(uri, "cp", elsewhere, resume=True, uid="uid-1")
    (local,) = list_checkpoints(elsewhere / "checkpoints")
    assert local.name == "ckpt-000003"
    state = json.loads((local / "state.json").read_text())
    assert state["counters"]["num_env_steps_sampled"] == 300
    assert (elsewhere / "history.jsonl").read_text() == '{"env_steps": 300}\n'
    assert (elsewhere / "tensorboard" / "events.out.tfevents.1").stat().st_size == 100
    pulled_best = elsewhere / "checkpoints" / "best" / "learner.pt"
    assert pulled_best.read_bytes() == (best / "learner.pt").read_bytes()
    # a local checkpoint as new as the remote one is kept, not replaced
    assert pulled.pull(elsewhere) is None


def test_a_prefix_belongs_to_one_job(tmp_path: Path, s3_env: dict) -> None:
    uri = f"s3://{BUCKET}/owned"
    run = tmp_path / "run"
    remote = open_remote(uri, "cp", run, resume=True, uid="uid-1")
    _checkpoint(run, 100)
    remote.push(run, keep=3)
    with pytest.raises(StorageError, match="holds the run of job 'cp', not 'other'"):
        open_remote(uri, "other", tmp_path / "o", resume=True)
    # the same name, another object (deleted and re-created): refused, not resumed
    with pytest.raises(StorageError, match=r"earlier ImpalaJob 'cp'.*fresh prefix"):
        open_remote(uri, "cp", tmp_path / "n", resume=True, uid="uid-2")
    # a fresh local run does not silently take over a prefix holding a run
    with pytest.raises(StorageError, match="pass --resume"):
        open_remote(uri, "cp", tmp_path / "l", resume=False)
    # --overwrite deletes the previous run first
    open_remote(uri, "cp", tmp_path / "w", resume=False, overwrite=True)
    assert RemoteRun(uri, "cp").checkpoints() == []


def test_wrong_credentials_are_refused_naming_the_field(
    tmp_path: Path, s3_env: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(StorageError, match=r"checkpoint.storageUri s3://results/x/.*AWS_") as err:
        open_remote(f"s3://{BUCKET}/x", "cp", tmp_path, resume=True)
    # A Secret fixed meanwhile makes a retry work: not a configuration error (exit 1, not 2).
    assert not err.value.config


def _train(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "impala_cli.main", "train", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **env},
    )


def _history(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.train
def test_train_resumes_on_another_machine_from_the_store(tmp_path: Path, s3_env: dict) -> None:
    uri = f"s3://{BUCKET}/cartpole"
    common = ["-f", EXAMPLE, "--set", f"checkpoint.storageUri={uri}"]
    common += ["--set", "stop.episodeReturnMean=null"]
    first = _train(
        s3_env, *common, "--run-dir", str(tmp_path / "a"), "--set", "stop.timesteps=8000"
    )
    assert first.returncode == 0, first.stderr
    remote = RemoteRun(uri, "cartpole")
    summary = json.loads(
        remote.client.get_object(Bucket=BUCKET, Key="cartpole/summary.json")["Body"].read()
    )
    assert summary["phase"] == "Succeeded" and summary["timesteps"] >= 8000
    assert remote.checkpoints(), "the final checkpoint was uploaded"

    # The same job on a machine with nothing local: without --resume it refuses the store's run,
    again = _train(
        s3_env, *common, "--run-dir", str(tmp_path / "b"), "--set", "stop.timesteps=16000"
    )
    # exit 2: bad input, nothing started (a learner pod exiting so fails its job at once)
    assert again.returncode == 2 and "pass --resume" in again.stderr
    # with --resume it continues the counters and the curve from the store.
    second = _train(
        s3_env,
        *common,
        "--run-dir",
        str(tmp_path / "b"),
        "--set",
        "stop.timesteps=16000",
        "--resume",
    )
    assert second.returncode == 0, second.stderr
    history = _history(tmp_path / "b")
    first_lines = len(_history(tmp_path / "a"))
    assert history[:first_lines] == _history(tmp_path / "a")  # the curve came down
    assert history[first_lines]["env_steps"] == summary["timesteps"]  # resumed, not restarted
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["timesteps"] >= 16000


def test_a_store_that_goes_down_gets_everything_once_it_is_back(
    tmp_path: Path, s3_env: dict, s3: S3Server
) -> None:
    """The store stops mid-run: pushes fail, the run goes on, and the mirror retries on its own
    (no newer checkpoint needed) until the store answers again; nothing is lost."""
    uri = f"s3://{BUCKET}/outage/run"
    run = tmp_path / "run"
    remote = open_remote(uri, "cp", run, resume=False, uid="uid-o")
    mirror = Mirror(remote, run, keep=3)
    _checkpoint(run, 100)
    mirror.request()
    wait_for(lambda: remote.checkpoints() == ["ckpt-000001"], timeout=30, what="first upload")
    s3.stop()
    try:
        _checkpoint(run, 200)
        mirror.request()
        wait_for(lambda: mirror.last_error is not None, timeout=60, what="a failed push")
        time.sleep(5)  # an outage of several retries
    finally:
        s3.start()
    back = time.monotonic()
    wait_for(lambda: remote.checkpoints() == ["ckpt-000001", "ckpt-000002"], timeout=60,
             what="the retried upload")  # fmt: skip
    print(f"outage: the pending checkpoint reached the store {time.monotonic() - back:.1f}s "
          "after it came back")  # fmt: skip
    assert mirror.close() and mirror.last_error is None
