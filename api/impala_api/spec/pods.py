"""Pod-level settings a job may give its pods: resources, tolerations, and the overrides
(env, volumes, mounts, placement...) with the rules that keep every pod within the restricted Pod
Security Standard and off the operator's own names. The CRD restates these rules in CEL
(`impala_api.cel`)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from impala_api.spec.base import SpecModel


class Toleration(SpecModel):
    """A Kubernetes toleration (core/v1 Toleration)."""

    key: str | None = None
    """Taint key the toleration applies to."""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists or Equal."""
    value: str | None = None
    """Taint value to match with Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match."""
    toleration_seconds: int | None = Field(default=None, ge=0)
    """How long a NoExecute taint is tolerated."""


DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A Kubernetes object name of the DNS-1123 subdomain kind (ServiceAccount, PriorityClass)."""
DNS: dict[str, Any] = {"pattern": DNS_SUBDOMAIN}
"""The pattern in the CRD's schema only: the model's validator says what is wrong in words."""

QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$"
"""A Kubernetes quantity as the spec accepts it (group 2: the suffix)."""
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN)]


class Resources(SpecModel):
    """Container requests and limits, as core/v1 ResourceRequirements (quantities as strings)."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Minimum resources, e.g. {cpu: "1", memory: 2Gi}."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Maximum resources."""


RESERVED_ENV = ("POD_IP", "POD_NAME", "POD_NAMESPACE", "HOME", "PYTHONUNBUFFERED")
"""Variables the operator sets in every container (Ray advertises POD_IP; caches live in HOME)."""
RESERVED_ENV_PREFIXES = ("IMPALA_", "RAY_")
"""The trainer's and Ray's own settings: the operator sets them from the spec."""
RESERVED_VOLUMES = ("config", "run", "checkpoints", "auth", "tmp", "shm")
"""Volume names the operator's pods use."""
RESERVED_PATHS = ("/tmp", "/dev/shm", "/etc/impalajob", "/etc/impalajob-auth", "/var/lib/impalajob")
"""Mount points the operator's containers use (and what lies under them)."""
VOLUME_SOURCES = (
    "configMap",
    "secret",
    "emptyDir",
    "persistentVolumeClaim",
    "projected",
    "downwardAPI",
    "csi",
    "ephemeral",
)
"""The volume types the restricted Pod Security Standard allows (hostPath and the in-tree
network volumes are not): the only ones a pod override may add."""

# The pod overrides' refusals, shared with the CRD's CEL rules (impala_api.cel)
# so the API server and `impalajob validate` say the same words.
RESERVED_ENV_MESSAGE = (
    f"env: {', '.join(RESERVED_ENV)} and {'*, '.join(RESERVED_ENV_PREFIXES)}* are set by the "
    "operator; set the spec field they come from instead"
)
RESERVED_VOLUME_MESSAGE = (
    f"volumes: the names {', '.join(RESERVED_VOLUMES)} are the operator's; pick another"
)
ONE_VOLUME_SOURCE_MESSAGE = f"volumes: each needs exactly one of {', '.join(VOLUME_SOURCES)}"
RESERVED_PATH_MESSAGE = (
    f"volumeMounts: {', '.join(RESERVED_PATHS)} and what lies under them are the operator's mounts"
)
MOUNT_NAMES_VOLUME_MESSAGE = "volumeMounts: each must name one of this pod override's volumes"


class EnvVar(SpecModel):
    """A core/v1 EnvVar for the role's main container."""

    name: str = Field(min_length=1, max_length=253)
    """Variable name."""

    value: str | None = None
    """Literal value."""

    value_from: dict[str, Any] | None = None
    """core/v1 EnvVarSource: secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef."""

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v in RESERVED_ENV or v.startswith(RESERVED_ENV_PREFIXES):
            raise ValueError(RESERVED_ENV_MESSAGE)
        return v


class EnvFromSource(SpecModel):
    """A core/v1 EnvFromSource: every key of a ConfigMap or Secret as variables."""

    config_map_ref: dict[str, Any] | None = None
    """{name, optional}."""

    secret_ref: dict[str, Any] | None = None
    """{name, optional}."""

    prefix: str | None = None
    """Prepended to every key."""


class Volume(SpecModel):
    """A core/v1 Volume of a type the restricted Pod Security Standard allows."""

    name: str = Field(min_length=1, max_length=63)
    """Volume name (referenced by volumeMounts)."""

    config_map: dict[str, Any] | None = None
    secret: dict[str, Any] | None = None
    empty_dir: dict[str, Any] | None = None
    persistent_volume_claim: dict[str, Any] | None = None
    projected: dict[str, Any] | None = None
    downward_api: dict[str, Any] | None = Field(default=None, alias="downwardAPI")
    csi: dict[str, Any] | None = None
    ephemeral: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _allowed_source(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refused = [k for k in data if k != "name" and k not in VOLUME_SOURCES]
            if refused:
                raise ValueError(
                    f"volume type {refused[0]} is refused: the operator keeps every pod within "
                    "the restricted Pod Security Standard, which allows only "
                    f"{', '.join(VOLUME_SOURCES)} (use a persistentVolumeClaim for host data)"
                )
        return data

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        set_sources = [k for k in VOLUME_SOURCES if getattr(self, _snake(k)) is not None]
        if len(set_sources) != 1:
            raise ValueError(ONE_VOLUME_SOURCE_MESSAGE)
        if self.name in RESERVED_VOLUMES:
            raise ValueError(RESERVED_VOLUME_MESSAGE)
        return self


def _snake(camel: str) -> str:
    """A volume source's field name on the model (downwardAPI keeps its acronym)."""
    if camel == "downwardAPI":
        return "downward_api"
    return re.sub(r"(?<!^)([A-Z])", r"_\1", camel).lower()


class VolumeMount(SpecModel):
    """A core/v1 VolumeMount of one of the override's volumes into the main container."""

    name: str = Field(min_length=1, max_length=63)
    """A volume of this override (or a volume the operator exposes: none today)."""

    mount_path: str = Field(min_length=1)
    """Where in the container."""

    read_only: bool | None = None
    """Mount read-only (default false)."""

    sub_path: str | None = None
    """A path inside the volume to mount instead of its root."""

    @field_validator("mount_path")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if any(v == p or v.startswith(p + "/") for p in RESERVED_PATHS):
            raise ValueError(RESERVED_PATH_MESSAGE)
        return v


class PodOverrides(SpecModel):
    """Settings merged onto the pods the operator builds for a role (not a full pod template:
    what would break the restricted Pod Security Standard the pods keep, such as privileged
    containers, host namespaces or hostPath volumes, has no field here and is refused)."""

    labels: dict[str, str] = Field(default_factory=dict)
    """Extra pod labels (the operator's own app.kubernetes.io/* labels win)."""

    annotations: dict[str, str] = Field(default_factory=dict)
    """Extra pod annotations (e.g. for a service mesh or a log shipper)."""

    env: list[EnvVar] = Field(default_factory=list, max_length=256)
    """Extra variables for the main container (W&B keys, S3 credentials from a Secret...)."""

    env_from: list[EnvFromSource] = Field(default_factory=list, max_length=64)
    """Variables from whole ConfigMaps or Secrets."""

    image_pull_secrets: list[dict[str, str]] = Field(default_factory=list, max_length=16)
    """Secrets ({name}) to pull a private image with."""

    volumes: list[Volume] = Field(default_factory=list, max_length=64)
    """Extra volumes (restricted-PSS types only)."""

    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=64)
    """Mounts of those volumes into the main container."""

    affinity: dict[str, Any] | None = None
    """core/v1 Affinity (node and pod (anti-)affinity)."""

    priority_class_name: str | None = Field(default=None, max_length=253, json_schema_extra=DNS)
    """PriorityClass of the pods (a DNS subdomain name: lowercase letters, digits, '-', '.')."""

    scheduler_name: str | None = None
    """Scheduler that places the pods (e.g. a gang scheduler)."""

    service_account_name: str | None = Field(default=None, max_length=253, json_schema_extra=DNS)
    """ServiceAccount the pods run as (a DNS subdomain name: lowercase letters, digits, '-',
    '.'). Its token is still not mounted: the trainer never calls the Kubernetes API; cloud
    workload identities that inject their own token still work."""

    @field_validator("priority_class_name", "service_account_name")
    @classmethod
    def _dns_subdomain(cls, v: str | None) -> str | None:
        # The CRD refuses these by its pattern; here with a message that says what is wrong
        # (the API server refuses such a pod later, where only the operator's log showed it).
        if v is not None and not re.match(DNS_SUBDOMAIN, v):
            raise ValueError(
                f"{v!r} is not a DNS subdomain name (lowercase letters, digits, '-' and '.', "
                "starting and ending with a letter or digit), so no such object can exist"
            )
        return v

    @model_validator(mode="after")
    def _mounts_name_volumes(self) -> PodOverrides:
        names = {v.name for v in self.volumes}
        if any(mount.name not in names for mount in self.volume_mounts):
            raise ValueError(MOUNT_NAMES_VOLUME_MESSAGE)
        return self
