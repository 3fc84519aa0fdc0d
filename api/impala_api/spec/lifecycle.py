"""How a run is kept and ended: checkpoints (a claim, an S3 mirror) and the run policy (retries,
deadlines, suspend, TTL, clean-up)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from impala_api.spec.base import SpecModel

STORAGE_URI_PATTERN = r"^s3://[a-z0-9][-.a-z0-9]{1,61}[a-z0-9](/[^\s]*)?$"
"""`s3://bucket[/prefix]` with an S3 bucket name (3-63 lowercase letters, digits, dots, dashes)."""
SECRET_REF_NEEDS_URI = (
    "checkpoint.secretRef holds the credentials of checkpoint.storageUri: set storageUri "
    "(s3://bucket/prefix) or remove secretRef"
)


class SecretReference(SpecModel):
    """A Secret in the job's namespace (core/v1 LocalObjectReference)."""

    name: str = Field(pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", max_length=253)
    """The Secret's name."""


class CheckpointSpec(SpecModel):
    """Checkpointing of model, optimiser and counters."""

    interval_seconds: float = Field(default=60.0, gt=0.0)
    """Seconds between checkpoints (one is always written at the end)."""

    keep: int = Field(default=3, ge=1, le=1000)
    """Newest checkpoints kept."""

    volume_claim: str | None = Field(default=None, pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
    """Existing PersistentVolumeClaim holding the whole run directory (cluster only): checkpoints,
    summary.json, history.jsonl, TensorBoard files and the trainer's log outlive the learner pod,
    and each learner attempt resumes from it. One claim per job. Without a claim or a storageUri
    the run directory is an emptyDir and dies with the pod (the operator warns with an Event)."""

    storage_uri: str | None = Field(default=None, pattern=STORAGE_URI_PATTERN)
    """An S3-compatible location (`s3://bucket/prefix`) the run directory is mirrored to: each
    checkpoint as it is written, then summary.json, history.jsonl, config.yaml and the TensorBoard
    files, and everything once more at the end. A learner with no local checkpoint (a new pod,
    a new machine) resumes from the newest one there. The prefix belongs to one job: another
    job's run there is refused, not overwritten. Credentials and endpoint come from `secretRef`
    on a cluster and from the usual AWS_* variables locally."""

    secret_ref: SecretReference | None = None
    """Secret whose keys become the learner's environment for `storageUri`: AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, and for S3-compatible stores AWS_ENDPOINT_URL and AWS_REGION."""

    @field_validator("storage_uri", mode="before")
    @classmethod
    def _s3_uri(cls, value: Any) -> Any:
        # Before the pattern, to say what is wrong in words rather than as a regex.
        if isinstance(value, str) and not re.match(STORAGE_URI_PATTERN, value):
            raise ValueError(
                "must be s3://BUCKET or s3://BUCKET/PREFIX (any S3-compatible store; the bucket "
                "is 3-63 lowercase letters, digits, dots and dashes, no spaces)"
            )
        return value

    @model_validator(mode="after")
    def _secret_needs_uri(self) -> CheckpointSpec:
        if self.secret_ref is not None and self.storage_uri is None:
            raise ValueError(SECRET_REF_NEEDS_URI)
        return self


class RunPolicy(SpecModel):
    """Job lifecycle on the cluster (ignored by local runs)."""

    suspend: bool = False
    """Scale everything to zero and keep the checkpoint; false resumes."""

    backoff_limit: int = Field(default=3, ge=0, le=1000)
    """Learner failures retried (each attempt resumes from the latest checkpoint) before the job
    fails. A disruption (eviction, preemption, node shutdown or loss, spot reclaim: a
    DisruptionTarget condition or a SIGTERM exit) restarts the learner without using one."""

    active_deadline_seconds: int | None = Field(default=None, ge=1)
    """Seconds since start after which the job fails with DeadlineExceeded."""

    startup_deadline_seconds: int | None = Field(default=None, ge=1)
    """Seconds a learner may take to become ready (from the job's start or its last running
    attempt: scheduling, image pull, start-up) before the job fails with
    StartupDeadlineExceeded, like KubeRay's preRunningDeadlineSeconds: a learner no node can
    fit fails the job instead of waiting forever. Omitted: no limit."""

    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    """Seconds after Succeeded/Failed after which the ImpalaJob is deleted."""

    clean_pod_policy: Literal["All", "Running", "None"] = "Running"
    """Pods removed when the job finishes. Running (the default): what still runs (rollout and
    aggregator pods, which only served the learner) goes, the finished learner pod stays with its
    logs and exit status. All: the learner pod too (its logs go with it). None: nothing, the
    rollout and aggregator Deployments keep running until the job is deleted."""

    learner_disruption_budget: bool = True
    """A PodDisruptionBudget (minAvailable 1) on the learner pod: `kubectl drain` and other
    evictions wait for the job to end instead of interrupting it. False lets a drain take the
    learner (it resumes from the checkpoint elsewhere, without using a retry)."""
