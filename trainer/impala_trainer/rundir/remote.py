"""The run directory's S3 mirror (`checkpoint.storageUri`): results that outlive the pod.

Up, from the driver: each checkpoint as it is written (`learner.pt` before `state.json`, so a
remote checkpoint is complete exactly when its state.json is there, as locally), then the run's
files (summary.json, history.jsonl, config.yaml, trainer.log, the TensorBoard files, the best
evaluation's checkpoint and the evaluation videos), and remote checkpoints beyond the newest
`keep` are deleted. Down, when a learner starts without a local checkpoint (a new pod on an
emptyDir, another machine): the newest complete checkpoint, history.jsonl, the TensorBoard files
and the best checkpoint, so the run continues its counters, its curves and its best.

An owner record, `run.json` ({"job": name, "uid": uid}), guards the prefix: a job never resumes
from or overwrites another job's run (another name, or on a cluster another object of the same
name), and a fresh local run refuses a prefix that holds a run unless told to resume it.

Uploads run on one background thread (`Mirror`) so the driver never waits on the network; a
newer request replaces a pending one (a checkpoint already superseded need not go up), and
`close` waits for the last. Credentials are boto3's usual chain (AWS_ACCESS_KEY_ID, ...), with
AWS_ENDPOINT_URL for S3-compatible stores (then path-style addressing: bucket names need no DNS).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from impala_api.snapshot import (
    BEST_CHECKPOINT,
    CHECKPOINT_DIR,
    CONFIG_FILE,
    HISTORY_FILE,
    SUMMARY_FILE,
    VIDEO_DIR,
)
from impala_trainer.rundir.checkpoint import LEARNER_FILE, STATE_FILE, list_checkpoints
from impala_trainer.rundir.tensorboard import TENSORBOARD_DIR

logger = logging.getLogger(__name__)

OWNER_FILE = "run.json"
LOG_FILE = "trainer.log"  # writer.LOG_FILE (importing writer would import the job spec)
RUN_FILES = (SUMMARY_FILE, HISTORY_FILE, CONFIG_FILE, LOG_FILE)
"""Files of the run directory mirrored after each checkpoint (status.json is live-only)."""

CLOSE_TIMEOUT_SECONDS = 300.0
"""Longest the run's end waits for its last upload to the store."""


class StorageError(Exception):
    """The storage location cannot be used as asked; the message names the field and the fix.
    `config` marks what no retry can fix (another job's run is there); a store that cannot be
    reached or refuses the credentials may be fixed meanwhile (a Secret updated)."""

    def __init__(self, message: str, config: bool = True) -> None:
        super().__init__(message)
        self.config = config


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str
    """Key prefix ending in '/', or '' for the bucket's root."""

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        if not uri.startswith("s3://"):
            raise StorageError(f"checkpoint.storageUri {uri!r}: only s3:// locations are supported")
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        prefix = prefix.strip("/")
        return cls(bucket, f"{prefix}/" if prefix else "")

    def key(self, relative: str | PurePosixPath) -> str:
        return f"{self.prefix}{relative}"

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def s3_client() -> Any:
    """A boto3 S3 client from the environment; S3-compatible stores via AWS_ENDPOINT_URL."""
    import boto3
    from botocore.config import Config

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    config = Config(
        retries={"max_attempts": 5, "mode": "standard"},
        connect_timeout=10,
        read_timeout=120,
        # Path style: a bucket on a store at an IP or a Service name has no DNS of its own.
        s3={"addressing_style": "path"} if endpoint else None,
        # Checksums only where S3 requires them: S3-compatible stores lag AWS's newer defaults.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    # A session of its own: boto3's default one caches the credentials it first resolved.
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=endpoint, region_name=region, config=config)


def _checkpoint_seq(name: str) -> int | None:
    head, _, digits = name.partition("-")
    return int(digits) if head == "ckpt" and digits.isdigit() else None


class RemoteRun:
    """One run's files under an S3 location (every call blocks; `Mirror` runs them off-thread)."""

    def __init__(self, uri: str, job: str, uid: str | None = None, client: Any = None) -> None:
        self.location = S3Location.parse(uri)
        self.job = job
        self.uid = uid
        self._client = client
        self._best_pushed: int | None = None
        """mtime (ns) of the checkpoints/best/state.json last uploaded: the best checkpoint is
        replaced in place, with files of the same sizes."""

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = s3_client()
        return self._client

    def _keys(self, relative: str) -> dict[str, int]:
        """{key relative to the location: size} of every object under `relative`."""
        out: dict[str, int] = {}
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(
            Bucket=self.location.bucket, Prefix=self.location.key(relative)
        ):
            for obj in page.get("Contents", ()):
                out[obj["Key"][len(self.location.prefix) :]] = int(obj["Size"])
        return out

    def checkpoints(self) -> list[str]:
        """Names of the complete remote checkpoints, oldest first."""
        keys = self._keys(f"{CHECKPOINT_DIR}/")
        names = {PurePosixPath(k).parent.name for k in keys if k.endswith(f"/{STATE_FILE}")}
        complete = [
            n
            for n in names
            if _checkpoint_seq(n) is not None and f"{CHECKPOINT_DIR}/{n}/{LEARNER_FILE}" in keys
        ]
        return sorted(complete, key=lambda n: _checkpoint_seq(n) or 0)

    # -- ownership ------------------------------------------------------------------------------

    def _owner(self) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            body = self.client.get_object(
                Bucket=self.location.bucket, Key=self.location.key(OWNER_FILE)
            )["Body"].read()
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        try:
            owner = json.loads(body)
        except ValueError:
            return None
        return owner if isinstance(owner, dict) else None

    def claim(self, resume: bool, overwrite: bool = False) -> None:
        """Make the location this run's, or raise StorageError naming why it is not;
        `overwrite` first deletes a previous run of this job there (`train --overwrite`)."""
        owner = self._owner()
        where = f"checkpoint.storageUri {self.location}"
        if owner is not None and owner.get("job") != self.job:
            raise StorageError(
                f"{where} holds the run of job {owner.get('job')!r}, not {self.job!r}: "
                "use a prefix of this job's own"
            )
        if owner is not None and self.uid and owner.get("uid") and owner["uid"] != self.uid:
            raise StorageError(
                f"{where} holds the run of an earlier ImpalaJob {self.job!r} (uid "
                f"{owner['uid']}): point storageUri at a fresh prefix, or delete that run first"
            )
        if overwrite:
            self.clear()
        elif not resume and (owner is not None or self.checkpoints()):
            raise StorageError(
                f"{where} already holds a run of {self.job!r}: pass --resume to continue it, or "
                "point storageUri at a fresh prefix"
            )
        record = {"job": self.job, "uid": self.uid or (owner or {}).get("uid")}
        self.client.put_object(
            Bucket=self.location.bucket,
            Key=self.location.key(OWNER_FILE),
            Body=json.dumps(record).encode(),
            ContentType="application/json",
        )

    # -- down -----------------------------------------------------------------------------------

    def pull(self, run_dir: Path) -> Path | None:
        """Bring the newest remote checkpoint (when newer than every local one), history and
        TensorBoard files into `run_dir`; the local checkpoint path, or None."""
        remote = self.checkpoints()
        local = list_checkpoints(run_dir / CHECKPOINT_DIR)
        newest_local = _checkpoint_seq(local[-1].name) if local else None
        if not remote or (newest_local is not None and newest_local >= _seq(remote[-1])):
            return None
        name = remote[-1]
        target = run_dir / CHECKPOINT_DIR / name
        partial = run_dir / CHECKPOINT_DIR / f".tmp-{name}"  # save_checkpoint sweeps .tmp-ckpt-*
        partial.mkdir(parents=True, exist_ok=True)
        for file in (LEARNER_FILE, STATE_FILE):
            self.download(f"{CHECKPOINT_DIR}/{name}/{file}", partial / file)
        partial.rename(target)
        for key in (HISTORY_FILE, *self._keys(f"{TENSORBOARD_DIR}/")):
            self.download(key, run_dir / key, missing_ok=True)
        best = f"{CHECKPOINT_DIR}/{BEST_CHECKPOINT}"
        if f"{best}/{STATE_FILE}" in self._keys(f"{best}/"):
            # The best evaluation's weights, which the resumed run's status still names.
            for file in (LEARNER_FILE, STATE_FILE):
                self.download(f"{best}/{file}", run_dir / best / file)
        logger.info("resuming from %s%s/%s", self.location, CHECKPOINT_DIR, name)
        return target

    def download(self, key: str, dest: Path, missing_ok: bool = False) -> None:
        """One object of the run to `dest` (also what `impalajob evaluate NAME` reads)."""
        from botocore.exceptions import ClientError

        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.client.download_file(self.location.bucket, self.location.key(key), str(dest))
        except ClientError as err:
            if not (
                missing_ok and err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey")
            ):
                raise

    # -- up -------------------------------------------------------------------------------------

    def push(self, run_dir: Path, keep: int) -> None:
        """Upload what is new: checkpoints not there yet, the run's files, then prune."""
        remote = set(self.checkpoints())
        local = list_checkpoints(run_dir / CHECKPOINT_DIR)
        for ckpt in local:
            if ckpt.name not in remote:
                # learner.pt first: state.json's arrival is what makes it complete.
                for file in (LEARNER_FILE, STATE_FILE):
                    self._upload(ckpt / file, f"{CHECKPOINT_DIR}/{ckpt.name}/{file}")
        best = run_dir / CHECKPOINT_DIR / BEST_CHECKPOINT
        if (best / STATE_FILE).is_file() and (best / LEARNER_FILE).is_file():
            mtime = (best / STATE_FILE).stat().st_mtime_ns
            if mtime != self._best_pushed:
                for file in (LEARNER_FILE, STATE_FILE):
                    self._upload(best / file, f"{CHECKPOINT_DIR}/{BEST_CHECKPOINT}/{file}")
                self._best_pushed = mtime
        for name in RUN_FILES:
            if (run_dir / name).is_file():
                self._upload(run_dir / name, name)
        for folder in (TENSORBOARD_DIR, VIDEO_DIR):  # files that only grow or only arrive
            self._push_new_files(run_dir, folder)
        self._prune(keep)

    def _push_new_files(self, run_dir: Path, folder: str) -> None:
        if not (run_dir / folder).is_dir():
            return
        have = self._keys(f"{folder}/")
        for path in sorted((run_dir / folder).rglob("*")):
            key = path.relative_to(run_dir).as_posix()
            if (
                path.is_file()
                and not path.name.startswith(".")
                and (have.get(key) != path.stat().st_size)
            ):
                self._upload(path, key)

    def _upload(self, path: Path, key: str) -> None:
        self.client.upload_file(str(path), self.location.bucket, self.location.key(key))

    def clear(self) -> None:
        """Delete every object of the run."""
        self._delete(list(self._keys("")))

    def _delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = keys[start : start + 1000]
            self.client.delete_objects(
                Bucket=self.location.bucket,
                Delete={"Objects": [{"Key": self.location.key(k)} for k in batch]},
            )

    def _prune(self, keep: int) -> None:
        names = self.checkpoints()
        doomed = set(names[:-keep])
        if not doomed:
            return
        self._delete(
            [k for k in self._keys(f"{CHECKPOINT_DIR}/") if PurePosixPath(k).parts[1] in doomed]
        )


def _seq(name: str) -> int:
    return _checkpoint_seq(name) or 0


def open_remote(
    uri: str,
    job: str,
    run_dir: Path,
    *,
    resume: bool,
    overwrite: bool = False,
    uid: str | None = None,
) -> RemoteRun:
    """The run's remote, claimed for it, with its newest checkpoint pulled when resuming.

    Every failure is a StorageError that names the field and the fix: a store that cannot be
    reached or refuses the credentials ends the start here, not at the first checkpoint."""
    from botocore.exceptions import BotoCoreError, ClientError

    remote = RemoteRun(uri, job, uid)
    try:
        remote.claim(resume, overwrite)
        if resume:
            remote.pull(run_dir)
    except (BotoCoreError, ClientError) as err:
        raise StorageError(
            f"checkpoint.storageUri {remote.location}: {err} (credentials and endpoint come from "
            "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_ENDPOINT_URL: checkpoint.secretRef "
            "on a cluster)",
            config=False,
        ) from err
    return remote


class Mirror:
    """Runs `RemoteRun.push` on one background thread; a newer request replaces a pending one,
    and a failed push is retried with backoff until it succeeds (a store down for a minute
    loses nothing once it is back)."""

    def __init__(self, remote: RemoteRun, run_dir: Path, keep: int) -> None:
        self.remote = remote
        self.run_dir = run_dir
        self.keep = keep
        self.pushes = 0
        """Pushes that completed."""
        self.last_error: str | None = None
        self._wake = threading.Condition()
        self._pending = False
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="run-mirror", daemon=True)
        self._thread.start()

    def request(self) -> None:
        """Push soon (returns at once)."""
        with self._wake:
            self._pending = True
            self._wake.notify()

    def close(self, timeout: float = CLOSE_TIMEOUT_SECONDS) -> bool:
        """Push once more, wait for it, stop; False when it failed or timed out."""
        with self._wake:
            self._pending = True
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive() and self.last_error is None

    def _loop(self) -> None:
        failures = 0
        while True:
            with self._wake:
                if failures:
                    # A failed push is tried again after a backoff (the store may be restarting),
                    # or at once when a newer checkpoint asks; closing waits for it to succeed.
                    self._wake.wait_for(lambda: self._pending, timeout=retry_delay(failures))
                else:
                    while not self._pending and not self._closing:
                        self._wake.wait()
                    if not self._pending and self._closing:
                        return
                self._pending = False
            try:
                self.remote.push(self.run_dir, self.keep)
            except Exception as exc:  # the run goes on; the push is retried
                failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.warning(
                    "uploading to %s failed (%d in a row, retrying in %.0fs): %s",
                    self.remote.location, failures, retry_delay(failures), exc,
                )  # fmt: skip
                continue
            if failures:
                logger.info("uploading to %s works again", self.remote.location)
            failures = 0
            self.pushes += 1
            self.last_error = None


RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0)
"""Seconds before the next try after 1, 2, ... failed pushes in a row (then 30 s each)."""


def retry_delay(failures: int) -> float:
    return RETRY_DELAYS[min(failures, len(RETRY_DELAYS)) - 1]
