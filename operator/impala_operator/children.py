"""Pure builders: an ImpalaJob (plus what the operator decided) -> its child manifests as dicts.

Nothing here talks to the API server; `apply.py` does. Every child carries an ownerReference to
the job (controller, blockOwnerDeletion: deletion is garbage collection), the
`app.kubernetes.io/*` labels plus the job's own labels, and a name of at most 63 characters.

The learner is a bare Pod with `restartPolicy: Never`, not a StatefulSet of one: the operator
counts learner failures against `runPolicy.backoffLimit` and waits with a growing backoff before
the next attempt, and a StatefulSet would restart the pod itself, immediately and uncounted. Each
attempt gets a new name (`<job>-learner-<attempt>`), so the failed pod can stay for its logs.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import yaml

from impala_operator import names as L
from impala_operator import pod_template as podspec
from impala_trainer.job.roles import DEFAULT_PORTS, POD_IP, STATUS_PORT, role_command
from impala_trainer.job.spec import API_GROUP, API_VERSION, KIND, ImpalaJob

Manifest = dict[str, Any]
NodeRole = Literal["rollout", "aggregator"]

CONFIG_DIR = "/etc/impalajob"
CONFIG_KEY = "job.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
RUN_DIR = "/var/lib/impalajob/run"
CHECKPOINT_DIR = f"{RUN_DIR}/checkpoints"  # snapshot.CHECKPOINT_DIR inside the run directory

LEARNER_GRACE_SECONDS = 120
"""SIGTERM to SIGKILL for the learner: time to write a final checkpoint."""
NODE_GRACE_SECONDS = 60
"""SIGTERM to SIGKILL for rollout/aggregator pods: time to finish and hand over the in-flight
fragment. The node process drains on SIGTERM itself, so no preStop hook is needed: one would
only delay the signal that starts the drain."""


def _namespace(job: ImpalaJob) -> str:
    if not job.metadata.namespace:
        raise ValueError(f"ImpalaJob {job.name} has no namespace (read it from the cluster)")
    return job.metadata.namespace


def owner_reference(job: ImpalaJob, uid: str) -> dict[str, Any]:
    """The job as the controlling owner: children are garbage-collected with it."""
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": job.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(job: ImpalaJob, uid: str, name: str, component: L.Component) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": _namespace(job),
        "labels": L.child_labels(job.name, component, job.metadata.labels),
        "ownerReferences": [owner_reference(job, uid)],
    }


def job_config_yaml(job: ImpalaJob) -> str:
    """The job.yaml the learner reads: the manifest with defaults filled in, and only the
    metadata that means something to the trainer (not resourceVersion, managedFields, ...)."""
    manifest = job.to_manifest()
    manifest["metadata"] = {"name": job.name, "namespace": _namespace(job)}
    return yaml.safe_dump(manifest, sort_keys=False)


def config_hash(job: ImpalaJob) -> str:
    """Short hash of job.yaml: on the learner pod, so the operator can tell a stale learner."""
    return hashlib.sha256(job_config_yaml(job).encode()).hexdigest()[:16]


def build_config_map(job: ImpalaJob, uid: str) -> Manifest:
    """ConfigMap `<job>-config` holding job.yaml."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(job, uid, L.child_name(job.name, "config"), "config"),
        "data": {CONFIG_KEY: job_config_yaml(job)},
    }


def build_learner_pod(job: ImpalaJob, uid: str, *, restart_count: int = 0) -> Manifest:
    """The learner Pod: trainer container (Ray head + driver) and the status sidecar."""
    spec = job.spec
    resources = podspec.resources(spec.learner.resources)
    tolerations = podspec.tolerations(spec.learner.tolerations)
    if spec.learner.gpus > 0:
        gpu = str(spec.learner.gpus)
        resources.setdefault("limits", {})[podspec.GPU_RESOURCE] = gpu
        resources.setdefault("requests", {})[podspec.GPU_RESOURCE] = gpu
        # GPU node pools are commonly tainted nvidia.com/gpu:NoSchedule; a pod that asks for a GPU
        # is exactly the pod that taint is meant to let in.
        if not any(t.get("key") == podspec.GPU_RESOURCE for t in tolerations):
            tolerations.append(
                {"key": podspec.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
            )

    volumes = [
        {"name": "config", "configMap": {"name": L.child_name(job.name, "config")}},
        {"name": "run", "emptyDir": {}},
        *podspec.scratch_volumes(),
    ]
    claim = spec.checkpoint.volume_claim
    run_mounts = [{"name": "run", "mountPath": RUN_DIR}]
    if claim:
        # Checkpoints on the claim survive the pod: the next attempt (or a resumed suspend)
        # continues from the newest one. Without a claim they live and die with the pod.
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}})
        run_mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_DIR})

    trainer = podspec.container(
        "learner",
        job,
        role_command(
            "learner", job, run_dir=RUN_DIR, config_path=CONFIG_PATH, node_ip=POD_IP, resume=True
        ),
        resources=resources,
        mounts=[{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}, *run_mounts],
        ports=[
            ("gcs", DEFAULT_PORTS.gcs),
            ("node-manager", DEFAULT_PORTS.node_manager),
            ("object-manager", DEFAULT_PORTS.object_manager),
            ("ray-metrics", DEFAULT_PORTS.metrics_export),
        ],
    )
    sidecar = podspec.container(
        "status",
        job,
        role_command("status", job, run_dir=RUN_DIR, status_host="0.0.0.0"),
        resources=podspec.SIDECAR_RESOURCES,
        # Only the run directory: a checkpoint mount nested in a read-only mount would need its
        # mount point created inside it, which fails, and the sidecar never reads checkpoints.
        mounts=[{"name": "run", "mountPath": RUN_DIR, "readOnly": True}],
        ports=[("http", STATUS_PORT)],
        extra_env=[{"name": "IMPALA_STATUS_JOB_NAME", "value": job.name}],
    )
    sidecar["readinessProbe"] = podspec.http_probe("/readyz", STATUS_PORT, period=5, failures=3)
    sidecar["livenessProbe"] = podspec.http_probe("/healthz", STATUS_PORT, period=10, failures=6)
    # A native sidecar (init container that keeps running): the pod ends, Succeeded or Failed,
    # when the learner container does, so the pod phase is the learner's outcome.
    sidecar["restartPolicy"] = "Always"

    meta = _meta(job, uid, L.learner_pod_name(job.name, restart_count), "learner")
    meta["labels"][L.RESTART_KEY] = str(restart_count)
    meta["annotations"] = {L.CONFIG_HASH_KEY: config_hash(job)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            **podspec.pod_defaults(),
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": LEARNER_GRACE_SECONDS,
            "initContainers": [sidecar],
            "containers": [trainer],
            "volumes": volumes,
            **podspec.placement(spec.learner.node_selector, tolerations),
        },
    }


def build_learner_service(job: ImpalaJob, uid: str) -> Manifest:
    """Headless Service `<job>-learner`: the DNS name rollout/aggregator nodes join through.

    Not-ready addresses are published because the learner pod's readiness is the sidecar's
    (a first snapshot written), while the nodes may connect as soon as the GCS listens."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, uid, L.child_name(job.name, "learner"), "learner"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": L.selector_labels(job.name, "learner"),
            "ports": [
                {"name": "gcs", "port": DEFAULT_PORTS.gcs, "targetPort": DEFAULT_PORTS.gcs},
                {"name": "http", "port": STATUS_PORT, "targetPort": STATUS_PORT},
            ],
        },
    }


def build_status_service(job: ImpalaJob, uid: str) -> Manifest:
    """ClusterIP Service `<job>-status` on the sidecar: the target of `status.statusURL`."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, uid, L.child_name(job.name, "status"), "status"),
        "spec": {
            "type": "ClusterIP",
            "selector": L.selector_labels(job.name, "learner"),
            "ports": [{"name": "http", "port": STATUS_PORT, "targetPort": STATUS_PORT}],
        },
    }


def build_node_deployment(job: ImpalaJob, uid: str, role: NodeRole, replicas: int) -> Manifest:
    """Deployment `<job>-rollout` / `<job>-aggregator`: pods that join the learner's Ray cluster."""
    group = job.spec.rollouts if role == "rollout" else job.spec.aggregators
    host = L.learner_host(job.name, _namespace(job))
    node = podspec.container(
        role,
        job,
        role_command(role, job, learner_host=host, node_ip=POD_IP),
        resources=podspec.resources(group.resources),
        mounts=[],
        ports=[
            ("node-manager", DEFAULT_PORTS.node_manager),
            ("object-manager", DEFAULT_PORTS.object_manager),
        ],
    )
    pod_labels = L.child_labels(job.name, role, job.metadata.labels)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(job, uid, L.child_name(job.name, role), role),
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 2,
            "selector": {"matchLabels": L.selector_labels(job.name, role)},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    **podspec.pod_defaults(),
                    "terminationGracePeriodSeconds": NODE_GRACE_SECONDS,
                    "containers": [node],
                    "volumes": podspec.scratch_volumes(),
                    **podspec.placement(
                        group.node_selector, podspec.tolerations(group.tolerations)
                    ),
                },
            },
        },
    }


def build_network_policy(job: ImpalaJob, uid: str) -> Manifest:
    """NetworkPolicy `<job>-network`: the job's pods accept Ray traffic (any port) only from the
    job's own pods; the status port is open to anyone (operator, Prometheus, users)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(job, uid, L.child_name(job.name, "network"), "network"),
        "spec": {
            "podSelector": {"matchLabels": L.selector_labels(job.name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": L.selector_labels(job.name)}}]},
                {"ports": [{"protocol": "TCP", "port": STATUS_PORT}]},
            ],
        },
    }


def build_children(
    job: ImpalaJob,
    uid: str,
    *,
    rollout_replicas: int | None = None,
    aggregator_replicas: int | None = None,
    suspended: bool | None = None,
    restart_count: int = 0,
    include_learner: bool = True,
) -> list[Manifest]:
    """Every child of a job, in creation order.

    Replica counts default to each group's `initial_replicas` (the operator passes the
    autoscaler's decision); `suspended` defaults to `runPolicy.suspend` and scales both
    Deployments to 0 and leaves the learner pod out. `include_learner=False` leaves it out too
    (e.g. while a restart waits out its backoff)."""
    if suspended is None:
        suspended = job.spec.run_policy.suspend
    rollouts = job.spec.rollouts.initial_replicas if rollout_replicas is None else rollout_replicas
    aggregators = (
        job.spec.aggregators.initial_replicas
        if aggregator_replicas is None
        else aggregator_replicas
    )
    children = [
        build_config_map(job, uid),
        build_learner_service(job, uid),
        build_status_service(job, uid),
        build_network_policy(job, uid),
    ]
    if include_learner and not suspended:
        children.append(build_learner_pod(job, uid, restart_count=restart_count))
    children.append(build_node_deployment(job, uid, "rollout", 0 if suspended else rollouts))
    children.append(build_node_deployment(job, uid, "aggregator", 0 if suspended else aggregators))
    return children
