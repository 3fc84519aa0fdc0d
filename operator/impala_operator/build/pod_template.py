"""Pod-spec pieces every ImpalaJob pod shares: security context, scratch volumes, env, probes.

All containers run as user 1000 with no privilege escalation, every capability dropped and a
read-only root filesystem; what needs to write gets an emptyDir: `/tmp` (Ray's session directory,
Python's tempfiles, and HOME, where torch and gymnasium keep caches) and `/dev/shm` (Ray's object
store, which wants shared memory, not the container's default 64 MiB).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from impala_api.spec import ImpalaJob, PodOverrides, Resources, Toleration

GPU_RESOURCE = "nvidia.com/gpu"
RUN_AS = 1000

SIDECAR_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "50m", "memory": "96Mi"},
    "limits": {"memory": "256Mi"},
}
"""The status sidecar serves small JSON files: a fixed, small footprint."""


def resources(spec: Resources) -> dict[str, Any]:
    """core/v1 ResourceRequirements from the spec's (only the non-empty parts)."""
    out: dict[str, Any] = {}
    if spec.requests:
        out["requests"] = dict(spec.requests)
    if spec.limits:
        out["limits"] = dict(spec.limits)
    return out


def tolerations(items: list[Toleration]) -> list[dict[str, Any]]:
    """core/v1 Tolerations (camelCase, unset fields left out)."""
    return [t.model_dump(by_alias=True, exclude_none=True) for t in items]


def placement(node_selector: dict[str, str], tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    """nodeSelector/tolerations, left out when empty (fewer no-op fields to apply and diff)."""
    out: dict[str, Any] = {}
    if node_selector:
        out["nodeSelector"] = dict(node_selector)
    if tolerations:
        out["tolerations"] = tolerations
    return out


def pod_defaults() -> dict[str, Any]:
    """Pod-level settings shared by every ImpalaJob pod."""
    return {
        # The pods never call the Kubernetes API: no token to steal.
        "automountServiceAccountToken": False,
        # Service env vars (FOO_SERVICE_HOST...) per Service in the namespace add nothing here.
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            # Lets user 1000 write the checkpoint volume, whatever its owner.
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def container_security_context() -> dict[str, Any]:
    """Per-container hardening (runAsNonRoot is repeated so it holds per container too)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def scratch_volumes() -> list[dict[str, Any]]:
    """emptyDirs for /tmp and /dev/shm (mounted by `container`)."""
    return [
        {"name": "tmp", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]


def _env(extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def field(name: str, path: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}

    return [
        # POD_IP feeds `--node-ip-address=$(POD_IP)`: Ray must advertise the pod's own IP.
        field("POD_IP", "status.podIP"),
        field("POD_NAME", "metadata.name"),
        field("POD_NAMESPACE", "metadata.namespace"),
        {"name": "HOME", "value": "/tmp"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
        *extra,
    ]


def http_probe(path: str, port: int, *, period: int, failures: int) -> dict[str, Any]:
    """An HTTP probe (numeric port: named ports of native sidecars resolve inconsistently
    across Kubernetes versions)."""
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 2,
    }


def container(
    name: str,
    job: ImpalaJob,
    command: list[str],
    *,
    resources: dict[str, Any],
    mounts: list[dict[str, Any]],
    ports: list[tuple[str, int]],
    extra_env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A container of the job's image running `command`, with /tmp and /dev/shm mounted."""
    return {
        "name": name,
        "image": job.spec.image,
        "imagePullPolicy": job.spec.image_pull_policy,
        "command": command,
        "env": _env(extra_env or []),
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports],
        "resources": resources,
        "volumeMounts": [
            *mounts,
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        "securityContext": container_security_context(),
        # A failing container's last log lines become its termination message: the operator
        # quotes the learner's one-line error in the job's Failed condition.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def apply_overrides(
    meta: dict[str, Any], spec: dict[str, Any], main: dict[str, Any], pod: PodOverrides
) -> None:
    """Merge a role's `pod` overrides onto a built pod (metadata, spec, main container), in
    place. The operator's labels, env, volumes and mounts stay; the spec model has already
    refused anything that would collide with them or leave the restricted Pod Security
    Standard, and what is merged carries no securityContext at all."""
    if pod.labels:
        meta["labels"] = {**pod.labels, **meta.get("labels", {})}
    if pod.annotations:
        meta["annotations"] = {**pod.annotations, **meta.get("annotations", {})}

    def dump(model: BaseModel) -> dict[str, Any]:
        return model.model_dump(by_alias=True, exclude_none=True)

    if pod.env:
        main["env"] = [*main["env"], *(dump(e) for e in pod.env)]
    if pod.env_from:
        # The user's sources first: for a key in both, the operator's (later) source wins.
        main["envFrom"] = [*(dump(e) for e in pod.env_from), *main.get("envFrom", [])]
    if pod.volume_mounts:
        mounts = [dump(m) for m in pod.volume_mounts]
        main["volumeMounts"] = [*main["volumeMounts"], *mounts]
    if pod.volumes:
        spec["volumes"] = [*spec.get("volumes", []), *(dump(v) for v in pod.volumes)]
    if pod.image_pull_secrets:
        spec["imagePullSecrets"] = [dict(s) for s in pod.image_pull_secrets]
    for key, value in (
        ("affinity", pod.affinity),
        ("priorityClassName", pod.priority_class_name),
        ("schedulerName", pod.scheduler_name),
        ("serviceAccountName", pod.service_account_name),
    ):
        if value is not None:
            spec[key] = value
