"""Runtime knobs of the operator process: one pydantic-settings object, read from the environment.

Every field can be set as `IMPALA_OPERATOR_<FIELD>` (e.g. `IMPALA_OPERATOR_RECONCILE_INTERVAL=1`);
the `impalajob operator` flags override the namespace, kubeconfig and port fields. Per-job policy
lives in the ImpalaJob spec; these are the operator-wide defaults and timings.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

FIELD_MANAGER = "impala-operator"
"""Server-side-apply field manager of everything the operator writes."""


class Settings(BaseSettings):
    """Operator-wide settings (environment prefix `IMPALA_OPERATOR_`)."""

    model_config = SettingsConfigDict(env_prefix="IMPALA_OPERATOR_", extra="ignore")

    namespaces: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Namespaces to watch (comma-separated in the environment); empty means the kubeconfig's
    current namespace unless `all_namespaces` is set."""

    all_namespaces: bool = False
    """Watch ImpalaJobs in every namespace (needs cluster-wide RBAC)."""

    kubeconfig: str | None = None
    """Kubeconfig file; unset means $KUBECONFIG, ~/.kube/config, or the in-cluster account."""

    reconcile_interval: float = Field(default=5.0, gt=0.0, le=3600.0)
    """Seconds between level-based reconciles of one job (status, autoscaling, runPolicy)."""

    sidecar_timeout: float = Field(default=2.0, gt=0.0, le=60.0)
    """Seconds to wait for a job's status sidecar before treating its metrics as unavailable."""

    metrics_stale_after: float = Field(default=30.0, gt=0.0)
    """A sidecar snapshot older than this (by its updatedAt) counts as unavailable metrics."""

    metrics_port: int = Field(default=9090, ge=0, le=65535)
    """Port of the operator's Prometheus /metrics endpoint; 0 disables it."""

    health_port: int = Field(default=8081, ge=0, le=65535)
    """Port of kopf's liveness endpoint (/healthz); 0 disables it."""

    monitoring_namespace: str | None = None
    """Namespace whose pods (Prometheus) every job's NetworkPolicy admits to the status
    sidecar's metrics port; unset, none but the job's own pods reach it."""

    api_concurrency: int = Field(default=32, ge=1, le=256)
    """Kubernetes API calls in flight at once (worker threads and pooled connections): with
    many jobs starting together, the operator waits on API latency, not on CPU."""

    learner_idle_threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    """Learner idle fraction at or above which a nearly empty queue counts as starvation."""

    rollout_workers_per_aggregator: int = Field(default=4, ge=1, le=1000)
    """Autoscaled aggregators: one per this many rollout workers (pods x workersPerPod)."""

    restart_backoff_seconds: float = Field(default=10.0, ge=0.0)
    """Delay before recreating a failed learner, doubled per restart (capped at 6 minutes)."""

    metrics_history_seconds: float = Field(default=3600.0, gt=0.0)
    """Sidecar samples kept per job for the autoscaler (at least its longest window)."""

    token_key_secret: str = "impala-operator-token-key"
    """Secret in the operator's own namespace holding the key every job's tokens derive from
    (made at first start); deleting it rotates every job's tokens at their next apply."""

    leader_elect: bool = False
    """Reconcile only while holding the `lease_name` Lease (run several replicas for HA)."""

    lease_name: str = "impala-operator"
    """Lease the replicas elect a leader on, in the operator's own namespace."""

    lease_duration: float = Field(default=15.0, ge=2.0, le=600.0)
    """Seconds a standby waits on an unrenewed lease before taking over (and a leader that
    cannot renew for this long stops)."""

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [ns.strip() for ns in value.split(",") if ns.strip()]
        return value
