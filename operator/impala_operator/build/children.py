"""Pure builders: an ImpalaJob (plus what the operator decided) -> its child manifests as dicts.

Nothing here talks to the API server; `runtime/kube.py` does. Every child carries an
ownerReference to the job (controller, blockOwnerDeletion: deletion is garbage collection), the
`app.kubernetes.io/*` labels plus the job's own labels, and a name of at most 63 characters.

The learner is a bare Pod with `restartPolicy: Never`, not a StatefulSet of one: the operator
counts learner failures against `runPolicy.backoffLimit` and waits with a growing backoff before
the next attempt, and a StatefulSet would restart the pod itself, immediately and uncounted. Each
attempt gets a new name (`<job>-learner-<attempt>`), so the failed pod can stay for its logs.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Literal

import yaml

from impala_api import names
from impala_api.roles import (
    DEFAULT_PORTS,
    LEARNER_PORTS,
    METRICS_PORT,
    POD_IP,
    STATUS_PORT,
    role_command,
    status_command,
)
from impala_api.spec import API_GROUP, API_VERSION, KIND, ImpalaJob
from impala_operator.build import pod_template
from impala_operator.build.tokens import JobTokens

Manifest = dict[str, Any]
NodeRole = Literal["rollout", "aggregator"]

CONFIG_DIR = "/etc/impalajob"
CONFIG_KEY = "job.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
RUN_DIR = "/var/lib/impalajob/run"
AUTH_DIR = "/etc/impalajob-auth"
"""The sidecar's token file lives here (the job's auth Secret, one key): re-read on rotation."""


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


def _meta(job: ImpalaJob, uid: str, name: str, component: names.Component) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": _namespace(job),
        "labels": names.child_labels(job.name, component, job.metadata.labels),
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


def ray_token_env(job: ImpalaJob) -> dict[str, Any]:
    """RAY_AUTH_TOKEN from the job's auth Secret: every node of the job's Ray cluster (learner,
    rollouts, aggregators) shares it, and Ray refuses anyone who has not."""
    secret = {"name": names.child_name(job.name, "auth"), "key": names.RAY_TOKEN_KEY}
    return {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": secret}}


def build_auth_secret(job: ImpalaJob, uid: str, tokens: JobTokens) -> Manifest:
    """Secret `<job>-auth`: the sidecar's bearer token and the Ray cluster's token. Readable by
    whoever may read Secrets in the namespace (`impalajob status` uses it); not by the operator,
    which derives both (tokens.job_tokens)."""

    def b64(value: str) -> str:
        return base64.b64encode(value.encode()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(job, uid, names.child_name(job.name, "auth"), "auth"),
        "type": "Opaque",
        "data": {names.STATUS_TOKEN_KEY: b64(tokens.status), names.RAY_TOKEN_KEY: b64(tokens.ray)},
    }


def build_config_map(job: ImpalaJob, uid: str) -> Manifest:
    """ConfigMap `<job>-config` holding job.yaml."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(job, uid, names.child_name(job.name, "config"), "config"),
        "data": {CONFIG_KEY: job_config_yaml(job)},
    }


def build_learner_pod(
    job: ImpalaJob, uid: str, *, restart_count: int = 0, rank: int = 0
) -> Manifest:
    """The learner Pod of `rank`: rank 0 runs the trainer container (Ray head + driver) and the
    status sidecar; ranks 1..N-1 (`spec.learner.replicas`) a learner node of the same resources
    and placement that joins rank 0's Ray cluster, with no run directory (rank 0 alone writes
    it) and no sidecar."""
    spec = job.spec
    resources, tolerations = _learner_resources(job)
    name = names.learner_pod_name(job.name, restart_count, rank)
    meta = _meta(job, uid, name, "learner-peer" if rank else "learner")
    meta["labels"][names.RESTART_KEY] = str(restart_count)
    meta["labels"][names.RANK_KEY] = str(rank)
    pod_spec: dict[str, Any] = {
        **pod_template.pod_defaults(),
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": spec.learner.termination_grace_period_seconds,
        **pod_template.placement(spec.learner.node_selector, tolerations),
    }
    if spec.learner.replicas > 1:
        # gloo's listeners between learners bind port 0: bounding the pods' ephemeral range puts
        # them where the NetworkPolicy opens learner pods to each other (build_network_policy).
        security = dict(pod_spec["securityContext"])
        security["sysctls"] = [LEARNER_PORTS.port_range_sysctl()]
        pod_spec["securityContext"] = security
    if rank:
        main = _learner_peer_container(job, resources)
        pod_spec["volumes"] = pod_template.scratch_volumes()
    else:
        main = _learner_container(job, uid, resources)
        meta["annotations"] = {names.CONFIG_HASH_KEY: config_hash(job)}
        pod_spec["initContainers"] = [_status_sidecar(job)]
        pod_spec["volumes"] = _learner_volumes(job)
    pod_spec["containers"] = [main]
    pod_template.apply_overrides(meta, pod_spec, main, spec.learner.pod)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def _learner_peer_container(job: ImpalaJob, resources: dict[str, Any]) -> dict[str, Any]:
    """A learner of rank >= 1: a Ray node offering one unit of `learner` (and its GPUs) to rank
    0's head, where the driver's LearnerGroup places that rank's learner."""
    host = names.learner_host(job.name, _namespace(job))
    return pod_template.container(
        "learner",
        job,
        role_command("learner-peer", job, learner_host=host, node_ip=POD_IP),
        resources=resources,
        mounts=[],
        ports=[
            ("node-manager", DEFAULT_PORTS.node_manager),
            ("object-manager", DEFAULT_PORTS.object_manager),
        ],
        extra_env=[ray_token_env(job)],
    )


def _learner_resources(job: ImpalaJob) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The learner container's resources and the pod's tolerations, GPUs included."""
    learner = job.spec.learner
    resources = pod_template.resources(learner.resources)
    tolerations = pod_template.tolerations(learner.tolerations)
    if learner.gpus > 0:
        gpu = str(learner.gpus)
        resources.setdefault("limits", {})[pod_template.GPU_RESOURCE] = gpu
        resources.setdefault("requests", {})[pod_template.GPU_RESOURCE] = gpu
        # GPU node pools are commonly tainted nvidia.com/gpu:NoSchedule; a pod that asks for a GPU
        # is exactly the pod that taint is meant to let in.
        if not any(t.get("key") == pod_template.GPU_RESOURCE for t in tolerations):
            tolerations.append(
                {"key": pod_template.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
            )
    return resources, tolerations


def _learner_volumes(job: ImpalaJob) -> list[dict[str, Any]]:
    claim = job.spec.checkpoint.volume_claim
    # On a claim the whole run directory survives the pod (checkpoints, summary, history,
    # TensorBoard files, the trainer's log): the next attempt, or a resumed suspend, continues
    # from it, and the results are there after the job. Without one it is an emptyDir, and
    # only checkpoint.storageUri keeps a copy.
    run_volume = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
    return [
        {"name": "config", "configMap": {"name": names.child_name(job.name, "config")}},
        {"name": "run", **run_volume},
        {
            "name": "auth",
            "secret": {
                "secretName": names.child_name(job.name, "auth"),
                "items": [{"key": names.STATUS_TOKEN_KEY, "path": names.STATUS_TOKEN_KEY}],
                "defaultMode": 0o440,
            },
        },
        *pod_template.scratch_volumes(),
    ]


def _learner_container(job: ImpalaJob, uid: str, resources: dict[str, Any]) -> dict[str, Any]:
    # The job's uid tells its run in storageUri from an earlier job's of the same name.
    learner_env = [{"name": "IMPALA_JOB_UID", "value": uid}, ray_token_env(job)]
    learner_env += LEARNER_PORTS.env()  # the sample and rendezvous listeners, pinned
    trainer = pod_template.container(
        "learner",
        job,
        role_command(
            "learner", job, run_dir=RUN_DIR, config_path=CONFIG_PATH, node_ip=POD_IP, resume=True
        ),
        resources=resources,
        mounts=[
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "run", "mountPath": RUN_DIR},
        ],
        ports=[
            ("gcs", DEFAULT_PORTS.gcs),
            ("node-manager", DEFAULT_PORTS.node_manager),
            ("object-manager", DEFAULT_PORTS.object_manager),
            ("ray-metrics", DEFAULT_PORTS.metrics_export),
            ("samples", LEARNER_PORTS.samples),
            *([("collective", LEARNER_PORTS.store)] if job.spec.learner.replicas > 1 else []),
        ],
        extra_env=learner_env,
    )
    secret_ref = job.spec.checkpoint.secret_ref
    if secret_ref is not None:
        # The store's credentials and endpoint (AWS_*), for the driver's uploads alone.
        trainer["envFrom"] = [{"secretRef": {"name": secret_ref.name}}]
    return trainer


def _status_sidecar(job: ImpalaJob) -> dict[str, Any]:
    sidecar = pod_template.container(
        "status",
        job,
        status_command(RUN_DIR, metrics_port=METRICS_PORT, host="0.0.0.0"),
        resources=pod_template.SIDECAR_RESOURCES,
        mounts=[
            {"name": "run", "mountPath": RUN_DIR, "readOnly": True},
            {"name": "auth", "mountPath": AUTH_DIR, "readOnly": True},
        ],
        ports=[("http", STATUS_PORT), ("metrics", METRICS_PORT)],
        extra_env=[
            {"name": "IMPALA_STATUS_JOB_NAME", "value": job.name},
            # Every endpoint but /healthz and /readyz wants the bearer token.
            {"name": "IMPALA_STATUS_TOKEN_FILE", "value": f"{AUTH_DIR}/{names.STATUS_TOKEN_KEY}"},
        ],
    )
    sidecar["readinessProbe"] = pod_template.http_probe(
        "/readyz", STATUS_PORT, period=5, failures=3
    )
    sidecar["livenessProbe"] = pod_template.http_probe(
        "/healthz", STATUS_PORT, period=10, failures=6
    )
    # A native sidecar (init container that keeps running): the pod ends, Succeeded or Failed,
    # when the learner container does, so the pod phase is the learner's outcome.
    sidecar["restartPolicy"] = "Always"
    return sidecar


def build_learner_service(job: ImpalaJob, uid: str) -> Manifest:
    """Headless Service `<job>-learner`: the DNS name rollout/aggregator nodes join through.

    Not-ready addresses are published because the learner pod's readiness is the sidecar's
    (a first snapshot written), while the nodes may connect as soon as the GCS listens."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, uid, names.child_name(job.name, "learner"), "learner"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": names.selector_labels(job.name, "learner"),
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
        "metadata": _meta(job, uid, names.child_name(job.name, "status"), "status"),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector_labels(job.name, "learner"),
            "ports": [{"name": "http", "port": STATUS_PORT, "targetPort": STATUS_PORT}],
        },
    }


def build_node_deployment(job: ImpalaJob, uid: str, role: NodeRole, replicas: int) -> Manifest:
    """Deployment `<job>-rollout` / `<job>-aggregator`: pods that join the learner's Ray cluster."""
    group = job.spec.rollouts if role == "rollout" else job.spec.aggregators
    host = names.learner_host(job.name, _namespace(job))
    node = pod_template.container(
        role,
        job,
        role_command(role, job, learner_host=host, node_ip=POD_IP),
        resources=pod_template.resources(group.resources),
        mounts=[],
        ports=[
            ("node-manager", DEFAULT_PORTS.node_manager),
            ("object-manager", DEFAULT_PORTS.object_manager),
        ],
        extra_env=[ray_token_env(job)],
    )
    pod_meta: dict[str, Any] = {"labels": names.child_labels(job.name, role, job.metadata.labels)}
    pod_spec = {
        **pod_template.pod_defaults(),
        # The node process drains on SIGTERM itself, so no preStop hook: one would only delay
        # the signal that starts the drain.
        "terminationGracePeriodSeconds": group.termination_grace_period_seconds,
        "containers": [node],
        "volumes": pod_template.scratch_volumes(),
        **pod_template.placement(group.node_selector, pod_template.tolerations(group.tolerations)),
    }
    pod_template.apply_overrides(pod_meta, pod_spec, node, group.pod)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(job, uid, names.child_name(job.name, role), role),
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 2,
            "selector": {"matchLabels": names.selector_labels(job.name, role)},
            "template": {"metadata": pod_meta, "spec": pod_spec},
        },
    }


LEARNER_COMPONENTS = ["learner", "learner-peer"]


def build_learner_disruption_budget(job: ImpalaJob, uid: str) -> Manifest:
    """PodDisruptionBudget `<job>-learner`: no voluntary eviction of a learner pod (drains wait
    for the job). Only the pod API's eviction honours it; disruptions it cannot stop restart
    the learner from its checkpoint without using a retry (run_policy)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(job, uid, names.child_name(job.name, "learner"), "learner"),
        "spec": {
            # minAvailable, not maxUnavailable 0: a maxUnavailable budget makes the disruption
            # controller read the pods' owner's scale, and the ImpalaJob's scale subresource is
            # its rollouts'.
            "minAvailable": job.spec.learner.replicas,
            # Every learner pod: losing any one restarts the whole group.
            "selector": {
                "matchLabels": names.selector_labels(job.name),
                "matchExpressions": [
                    {"key": names.COMPONENT, "operator": "In", "values": LEARNER_COMPONENTS}
                ],
            },
            # A learner that is not Ready (stuck pulling, crash-looping sidecar) protects no
            # progress: let a drain take it rather than block the node.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def _tcp(port: int, end: int | None = None) -> dict[str, Any]:
    return {"protocol": "TCP", "port": port, **({"endPort": end} if end else {})}


def _job_ports() -> list[dict[str, Any]]:
    """What a job's pods reach on each other: every port a Ray node listens on (all pinned,
    roles.RayPorts) and the driver's direct sample connections."""
    ray = DEFAULT_PORTS
    return [
        _tcp(ray.gcs),
        _tcp(ray.node_manager),
        _tcp(ray.object_manager),
        _tcp(ray.min_worker, ray.max_worker),
        _tcp(ray.dashboard_agent_listen),
        _tcp(ray.dashboard_agent_grpc),
        _tcp(ray.runtime_env_agent),
        _tcp(ray.metrics_export),
        _tcp(LEARNER_PORTS.samples),
    ]


def _collective_ports() -> list[dict[str, Any]]:
    """What learner pods reach on each other beyond Ray's: rank 0's TCPStore and gloo's pairs."""
    return [_tcp(LEARNER_PORTS.store), _tcp(*LEARNER_PORTS.pairs)]


def build_network_policy(
    job: ImpalaJob, uid: str, operator_namespace: str, monitoring_namespace: str | None = None
) -> Manifest:
    """NetworkPolicy `<job>-network`: the job's pods accept, from the job's own pods, Ray's
    pinned ports and the driver's sample port; from its learner pods, the learners' collective
    ports (the TCPStore and gloo's pairs, `roles.LearnerPorts`); and the status port only from
    pods labelled `impala.dev/status-access: "true"` in the job's namespace or the operator's
    (the operator's own pods carry it). What gets through still needs the status token. The
    sidecar's metrics port, which needs none, admits `monitoring_namespace`'s pods (Prometheus)
    when the operator names one."""
    access = {names.STATUS_ACCESS_LABEL: "true"}
    learners = {
        "matchLabels": names.selector_labels(job.name),
        "matchExpressions": [
            {"key": names.COMPONENT, "operator": "In", "values": ["learner", "learner-peer"]}
        ],
    }
    ingress: list[dict[str, Any]] = [
        {
            "from": [{"podSelector": {"matchLabels": names.selector_labels(job.name)}}],
            "ports": _job_ports(),
        },
        {"from": [{"podSelector": learners}], "ports": _collective_ports()},
        {
            "from": [
                {"podSelector": {"matchLabels": access}},
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": operator_namespace}
                    },
                    "podSelector": {"matchLabels": access},
                },
            ],
            "ports": [{"protocol": "TCP", "port": STATUS_PORT}],
        },
    ]
    if monitoring_namespace is not None:
        monitoring = {"kubernetes.io/metadata.name": monitoring_namespace}
        ingress.append({
            "from": [{"namespaceSelector": {"matchLabels": monitoring}}],
            "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
        })  # fmt: skip
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(job, uid, names.child_name(job.name, "network"), "network"),
        "spec": {
            "podSelector": {"matchLabels": names.selector_labels(job.name)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
