"""The pure child builders and role_command: what the operator would create, with no cluster."""

from __future__ import annotations

import base64
import sys
from typing import Any

import pytest
import yaml

from impala_api import names
from impala_api.manifest import ManifestError, parse_manifest
from impala_api.roles import (
    COLLECTIVE_PORT_ENV,
    DEFAULT_PORTS,
    LEARNER_PORTS,
    METRICS_PORT,
    POD_IP,
    SAMPLE_PORT_ENV,
    STATUS_PORT,
    SUBCOMMAND,
    RayPorts,
    role_command,
)
from impala_api.spec import ImpalaJob
from impala_operator.build import children
from impala_operator.lifecycle import plan
from impala_operator.runtime import kube
from tests.support.jobs import operator_access

UID = "0c1d2e3f-0000-4000-8000-000000000001"


def _job(name: str = "cartpole", labels: dict[str, str] | None = None, **spec: Any) -> ImpalaJob:
    return parse_manifest(
        {
            "apiVersion": "impala.dev/v1alpha1",
            "kind": "ImpalaJob",
            "metadata": {"name": name, "namespace": "team-a", "labels": labels or {}},
            "spec": {
                "rollouts": {"minReplicas": 2, "maxReplicas": 5, "workersPerPod": 3},
                "stop": {"timesteps": 1_000_000},
                **spec,
            },
        }
    )


def _by_kind(manifests: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for child in manifests:
        out.setdefault(child["kind"], []).append(child)
    return out


def _pod_specs(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    specs = []
    for child in manifests:
        if child["kind"] == "Pod":
            specs.append(child["spec"])
        elif child["kind"] == "Deployment":
            specs.append(child["spec"]["template"]["spec"])
    return specs


def _containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def _learner(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return next(c for c in manifests if c["kind"] == "Pod")


def _all_children(job: ImpalaJob, attempt: int = 0) -> list[dict[str, Any]]:
    """Every child of a fresh job: what the create handler applies (`plan.plan_children`) and
    what the timer creates (the Deployments at their initial replicas, the learner pod of
    `attempt`)."""
    return [
        *plan.plan_children(job, UID, **operator_access(UID)),
        *(plan.deployment(job, UID, role, group.initial_replicas, plan.requested(job, role))
          for role, group in (("rollout", job.spec.rollouts),
                              ("aggregator", job.spec.aggregators))),
        plan.learner_pod(job, UID, attempt),
    ]  # fmt: skip


def _container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in _containers(pod_spec) if c["name"] == name)


def test_all_children_exist_with_owner_labels_and_short_names() -> None:
    job = _job("j" + "x" * 39, labels={"team": "rl", names.COMPONENT: "hijack"})  # 40 characters
    manifests = _all_children(job, attempt=999)
    kinds = {c["kind"] for c in manifests}
    assert kinds == {
        "ConfigMap",
        "Pod",
        "Service",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Secret",
    }
    assert kinds <= set(kube.PLURALS)  # the one API client can write every kind built
    for child in manifests:
        meta = child["metadata"]
        assert len(meta["name"]) <= 63, meta["name"]
        assert meta["namespace"] == "team-a"
        (owner,) = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "impala.dev/v1alpha1",
            "kind": "ImpalaJob",
            "name": job.name,
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        labels = meta["labels"]
        assert labels["team"] == "rl"  # the job's own labels are copied ...
        assert labels[names.COMPONENT] != "hijack"  # ... but never override the operator's
        for key in (
            names.NAME,
            names.INSTANCE,
            names.COMPONENT,
            names.PART_OF_KEY,
            names.MANAGED_BY_KEY,
        ):
            assert labels[key] and len(labels[key]) <= 63
        assert labels[names.INSTANCE] == job.name


def test_queue_labels_stay_on_the_job() -> None:
    """Kueue admits the ImpalaJob as one workload by its queue-name label: on a child it would
    make Kueue queue that pod or Deployment as a workload of its own."""
    kueue = {
        "kueue.x-k8s.io/queue-name": "team-q",
        "kueue.x-k8s.io/priority-class": "high",
        "scheduling.x-k8s.io/pod-group": "g",
    }
    job = _job(labels={"team": "rl", **kueue})
    for child in _all_children(job):
        metas = [child["metadata"]]
        if child["kind"] == "Deployment":
            metas.append(child["spec"]["template"]["metadata"])
        for meta in metas:
            assert meta["labels"]["team"] == "rl", child["kind"]
            assert not set(kueue) & set(meta["labels"]), (child["kind"], meta["labels"])


def test_deployment_selectors_match_their_pod_templates() -> None:
    job = _job(labels={"team": "rl"})
    for dep in _by_kind(_all_children(job))["Deployment"]:
        selector = dep["spec"]["selector"]["matchLabels"]
        template_labels = dep["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= template_labels.items()
        assert "team" not in selector  # mutable labels must stay out of an immutable selector
        component = selector[names.COMPONENT]
        text = names.selector_string(job.name, component)
        assert dict(kv.split("=") for kv in text.split(",")) == selector


def test_learner_pod_runs_trainer_and_status_sidecar() -> None:
    job = _job()
    pod = _learner(_all_children(job))
    spec = pod["spec"]
    assert pod["metadata"]["name"] == "cartpole-learner-0"
    assert spec["restartPolicy"] == "Never"
    trainer = _container(spec, "learner")
    assert trainer["command"] == role_command(
        "learner",
        job,
        run_dir=children.RUN_DIR,
        config_path=children.CONFIG_PATH,
        node_ip=POD_IP,
        resume=True,
    )
    (sidecar,) = spec["initContainers"]
    assert sidecar["restartPolicy"] == "Always"  # native sidecar: pod phase = learner outcome
    assert sidecar["command"][:2] == ["impalajob", "status-server"]
    assert f"--run-dir={children.RUN_DIR}" in sidecar["command"]
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8080}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8080}
    # both containers share the run directory; the config map is mounted where -f points
    run_volume = next(v for v in spec["volumes"] if v["name"] == "run")
    assert run_volume == {"name": "run", "emptyDir": {}}
    for c in (trainer, sidecar):
        assert any(
            m["name"] == "run" and m["mountPath"] == children.RUN_DIR for m in c["volumeMounts"]
        )
    assert any(m["mountPath"] == "/etc/impalajob" for m in trainer["volumeMounts"])


def test_learners_beyond_rank_0_are_ray_nodes_of_the_same_resources() -> None:
    """learner.replicas 3: ranks 1 and 2 run `impalajob learner-node`, joining rank 0's head
    through the learner Service, with the learner's resources, GPUs and placement; no sidecar,
    no run directory; a component of their own, so the learner Service selects rank 0 alone."""
    resources = {"requests": {"cpu": "4"}, "limits": {"memory": "8Gi"}}
    job = _job(learner={"replicas": 3, "gpus": 1, "resources": resources,
                        "nodeSelector": {"pool": "gpu"}})  # fmt: skip
    leader = children.build_learner_pod(job, "uid-1", restart_count=2)
    peer = children.build_learner_pod(job, "uid-1", restart_count=2, rank=2)
    assert (leader["metadata"]["name"], peer["metadata"]["name"]) == (
        "cartpole-learner-2", "cartpole-learner-2-2"
    )  # fmt: skip
    labels = peer["metadata"]["labels"]
    assert labels[names.COMPONENT] == "learner-peer"
    assert (labels[names.RESTART_KEY], labels[names.RANK_KEY]) == ("2", "2")
    assert leader["metadata"]["labels"][names.RANK_KEY] == "0"
    spec = peer["spec"]
    assert "initContainers" not in spec and spec["restartPolicy"] == "Never"
    (node,) = spec["containers"]
    assert node["command"][:2] == ["impalajob", "learner-node"]
    assert "--address=cartpole-learner.team-a.svc:6379" in node["command"]
    assert node["resources"] == _container(leader["spec"], "learner")["resources"]
    assert node["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] == {"pool": "gpu"} == leader["spec"]["nodeSelector"]
    assert not any(v["name"] in ("run", "config", "auth") for v in spec["volumes"])
    service = next(
        c for c in _all_children(job) if c["kind"] == "Service" and c["metadata"]["name"]
        == "cartpole-learner"
    )  # fmt: skip
    assert service["spec"]["selector"][names.COMPONENT] == "learner"


def _admitted(rule: dict[str, Any]) -> set[int]:
    """Every port a NetworkPolicy rule opens (ranges expanded)."""
    return {
        port for p in rule["ports"] for port in range(p["port"], p.get("endPort", p["port"]) + 1)
    }


def test_network_policy_opens_the_pinned_listeners_and_the_collective_to_learners_only() -> None:
    """The job's pods reach each other on Ray's pinned ports and the driver's sample port, and
    nothing else; only learner pods reach the learners' TCPStore and gloo range. Every port a
    job pod declares is admitted from the job's pods, but the sidecar's (the status rule)."""
    job = _job(learner={"replicas": 2})
    policy = children.build_network_policy(job, "uid-1", "impala-system")
    ray_rule, collective_rule, _status = policy["spec"]["ingress"]
    ray = RayPorts()
    assert _admitted(ray_rule) == {
        ray.gcs, ray.node_manager, ray.object_manager, *range(ray.min_worker, ray.max_worker + 1),
        ray.dashboard_agent_listen, ray.dashboard_agent_grpc, ray.runtime_env_agent,
        ray.metrics_export, LEARNER_PORTS.samples,
    }  # fmt: skip
    low, high = LEARNER_PORTS.pairs
    assert _admitted(collective_rule) == {LEARNER_PORTS.store, *range(low, high + 1)}
    (learners,) = collective_rule["from"]
    assert learners["podSelector"]["matchExpressions"] == [
        {"key": names.COMPONENT, "operator": "In", "values": ["learner", "learner-peer"]}
    ]
    # Each collective port is open to learners alone, and no fixed listener is in gloo's range.
    assert not _admitted(ray_rule) & _admitted(collective_rule)
    assert not low <= STATUS_PORT <= high and not low <= METRICS_PORT <= high
    pods = [children.build_learner_pod(job, "uid-1"), children.build_learner_pod(job, "uid-1",
            rank=1), *_by_kind(_all_children(job))["Deployment"]]  # fmt: skip
    for pod in pods:
        spec = pod["spec"].get("template", {}).get("spec") or pod["spec"]
        for c in spec["containers"]:
            declared = {p["containerPort"] for p in c.get("ports", [])}
            assert declared <= _admitted(ray_rule) | _admitted(collective_rule), c["name"]


def test_learner_pods_pin_their_listeners_and_bound_their_ephemeral_ports() -> None:
    """Rank 0's driver and TCPStore listen where the NetworkPolicy expects (environment, which
    Ray's workers inherit); with replicas above 1 every learner pod's ephemeral range (gloo's
    listeners) is the collective's range, through a safe sysctl; one learner leaves it alone."""
    job = _job(learner={"replicas": 2})
    leader = children.build_learner_pod(job, "uid-1")
    peer = children.build_learner_pod(job, "uid-1", rank=1)
    env = {e["name"]: e.get("value") for e in _container(leader["spec"], "learner")["env"]}
    assert env[SAMPLE_PORT_ENV] == str(LEARNER_PORTS.samples)
    assert env[COLLECTIVE_PORT_ENV] == str(LEARNER_PORTS.store)
    low, high = LEARNER_PORTS.pairs
    for pod in (leader, peer):
        assert pod["spec"]["securityContext"]["sysctls"] == [
            {"name": "net.ipv4.ip_local_port_range", "value": f"{low} {high}"}
        ]
        assert pod["spec"]["securityContext"]["runAsNonRoot"]
    assert (low % 2, high % 2) == (1, 0)  # the kernel wants ends of unlike parity
    single = children.build_learner_pod(_job(), "uid-1")
    assert "sysctls" not in single["spec"]["securityContext"]


def test_gpu_request_only_with_gpus() -> None:
    cpu = _container(_learner(_all_children(_job()))["spec"], "learner")
    assert "nvidia.com/gpu" not in str(cpu["resources"])
    resources = {"requests": {"cpu": "4"}, "limits": {"memory": "8Gi"}}
    job = _job(learner={"gpus": 2, "resources": resources})
    spec = _learner(_all_children(job))["spec"]
    res = _container(spec, "learner")["resources"]
    assert res["limits"] == {"memory": "8Gi", "nvidia.com/gpu": "2"}
    assert res["requests"] == {"cpu": "4", "nvidia.com/gpu": "2"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]


def test_run_directory_on_the_claim_or_an_empty_dir() -> None:
    spec = _learner(_all_children(_job()))["spec"]
    assert {"name": "run", "emptyDir": {}} in spec["volumes"]
    assert not any("persistentVolumeClaim" in v for v in spec["volumes"])
    job = _job(checkpoint={"volumeClaim": "results"})
    spec = _learner(_all_children(job))["spec"]
    # the whole run directory (checkpoints, summary.json, history.jsonl) is the claim
    assert {"name": "run", "persistentVolumeClaim": {"claimName": "results"}} in spec["volumes"]
    assert {"name": "run", "mountPath": children.RUN_DIR} in _container(spec, "learner")[
        "volumeMounts"
    ]
    assert {"name": "run", "mountPath": children.RUN_DIR, "readOnly": True} in _container(
        spec, "status"
    )["volumeMounts"]


def test_storage_secret_reaches_the_learner_container_alone() -> None:
    job = _job(checkpoint={"storageUri": "s3://results/cartpole", "secretRef": {"name": "s3"}})
    learner = _learner(_all_children(job))
    trainer = _container(learner["spec"], "learner")
    assert trainer["envFrom"] == [{"secretRef": {"name": "s3"}}]
    assert {
        "name": "IMPALA_JOB_UID",
        "value": learner["metadata"]["ownerReferences"][0]["uid"],
    } in (trainer["env"])
    assert "envFrom" not in _container(learner["spec"], "status")
    # a user's own envFrom goes first; for a key in both, the operator's secret wins
    job = _job(
        checkpoint={"storageUri": "s3://results/cartpole", "secretRef": {"name": "s3"}},
        learner={"pod": {"envFrom": [{"secretRef": {"name": "wandb"}}]}},
    )
    trainer = _container(_learner(_all_children(job))["spec"], "learner")
    assert trainer["envFrom"] == [{"secretRef": {"name": "wandb"}}, {"secretRef": {"name": "s3"}}]


def test_every_container_is_non_root_and_locked_down() -> None:
    job = _job(aggregators={"minReplicas": 1, "maxReplicas": 2})
    for pod_spec in _pod_specs(_all_children(job)):
        assert pod_spec["securityContext"]["runAsNonRoot"] is True
        assert pod_spec["securityContext"]["runAsUser"] == 1000
        assert pod_spec["automountServiceAccountToken"] is False
        volumes = {v["name"]: v for v in pod_spec["volumes"]}
        assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}
        for c in _containers(pod_spec):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
            env = {e["name"]: e for e in c["env"]}
            assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
            assert c["image"] == job.spec.image


def test_node_deployments_join_the_learner_service() -> None:
    grace = {"terminationGracePeriodSeconds": 300}
    job = _job(aggregators={"minReplicas": 1, "maxReplicas": 2, **grace})
    deps = {d["metadata"]["name"]: d for d in _by_kind(_all_children(job))["Deployment"]}
    rollout = deps["cartpole-rollout"]["spec"]["template"]["spec"]
    cmd = rollout["containers"][0]["command"]
    assert cmd == role_command(
        "rollout", job, learner_host="cartpole-learner.team-a.svc", node_ip=POD_IP
    )
    assert "--address=cartpole-learner.team-a.svc:6379" in cmd and "--workers-per-pod=3" in cmd
    assert "--node-ip-address=$(POD_IP)" in cmd
    # Each group's own grace: the rollouts' default, the aggregators' as set.
    assert rollout["terminationGracePeriodSeconds"] == 60
    aggregator = deps["cartpole-aggregator"]["spec"]["template"]["spec"]
    assert aggregator["terminationGracePeriodSeconds"] == 300
    agg = aggregator["containers"][0]["command"]
    assert agg[:2] == ["impalajob", "aggregator-node"]
    assert not any("--workers-per-pod" in a for a in agg)


def test_replicas_follow_the_decision_and_suspend() -> None:
    job = _job(aggregators={"minReplicas": 1, "maxReplicas": 2})

    def replicas(manifests: list[dict[str, Any]]) -> dict[str, int]:
        return {
            d["metadata"]["name"].rsplit("-", 1)[1]: d["spec"]["replicas"]
            for d in _by_kind(manifests)["Deployment"]
        }

    assert replicas(_all_children(job)) == {"rollout": 2, "aggregator": 1}  # initial: min
    rollout = children.build_node_deployment(job, UID, "rollout", 4)  # the autoscaler's decision
    assert rollout["spec"]["replicas"] == 4
    suspended = _job(runPolicy={"suspend": True})
    manifests = plan.plan_children(suspended, UID, **operator_access(UID))
    assert "Pod" not in _by_kind(manifests) and "Deployment" not in _by_kind(manifests)
    assert "ConfigMap" in _by_kind(manifests)  # the job's config survives a suspend


def test_restart_gets_a_new_learner_pod_that_resumes() -> None:
    pod = _learner(_all_children(_job(), attempt=3))
    assert pod["metadata"]["name"] == "cartpole-learner-3"
    assert pod["metadata"]["labels"][names.RESTART_KEY] == "3"
    assert "--resume" in _container(pod["spec"], "learner")["command"]


def test_services_and_network_policy() -> None:
    job = _job()
    manifests = _all_children(job)
    services = {s["metadata"]["name"]: s["spec"] for s in _by_kind(manifests)["Service"]}
    learner_svc = services["cartpole-learner"]
    assert learner_svc["clusterIP"] == "None" and learner_svc["publishNotReadyAddresses"]
    assert {p["port"] for p in learner_svc["ports"]} == {6379, 8080}
    status_svc = services["cartpole-status"]
    assert status_svc["ports"] == [{"name": "http", "port": 8080, "targetPort": 8080}]
    pod_labels = _learner(manifests)["metadata"]["labels"]
    for svc in services.values():
        assert svc["selector"].items() <= pod_labels.items()
    assert names.status_url(job.name, "team-a", 8080) == "http://cartpole-status.team-a.svc:8080"
    (policy,) = _by_kind(manifests)["NetworkPolicy"]
    job_pods = {"matchLabels": names.selector_labels(job.name)}
    assert policy["spec"]["podSelector"] == job_pods
    # Ray's and the samples' rule: the job's own pods only (test_network_policy_opens_...).
    ray_rule, _collective_rule, _status_rule = policy["spec"]["ingress"]
    assert ray_rule["from"] == [{"podSelector": job_pods}]


def test_config_map_round_trips_the_job() -> None:
    raw = _job(training={"lr": 0.002, "lrSchedule": [[0, 0.002], [1000, 0.001]]}).to_manifest()
    raw["metadata"].update(resourceVersion="123", uid=UID, managedFields=[{"manager": "kubectl"}])
    job = parse_manifest(raw)  # as read back from the cluster
    cm = children.build_config_map(job, UID)
    parsed = parse_manifest(yaml.safe_load(cm["data"]["job.yaml"]))
    assert parsed.spec == job.spec and parsed.name == job.name
    # only what the trainer needs: server-side metadata would change the hash on every update
    assert (
        "resourceVersion" not in cm["data"]["job.yaml"]
        and "managedFields" not in cm["data"]["job.yaml"]
    )
    pod = _learner(_all_children(job))
    assert pod["metadata"]["annotations"][names.CONFIG_HASH_KEY] == children.config_hash(job)
    assert children.config_hash(_job(training={"lr": 0.003})) != children.config_hash(job)


def test_placement_is_copied_and_empty_placement_left_out() -> None:
    tol = {"key": "pool", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}
    job = _job(
        rollouts={
            "nodeSelector": {"pool": "cpu"},
            "tolerations": [tol],
            "resources": {"requests": {"cpu": "500m"}},
        }
    )
    dep = next(
        d
        for d in _by_kind(_all_children(job))["Deployment"]
        if d["metadata"]["name"].endswith("rollout")
    )
    spec = dep["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"pool": "cpu"} and spec["tolerations"] == [tol]
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "500m"}}
    assert "nodeSelector" not in _learner(_all_children(job))["spec"]


def test_a_job_without_namespace_is_refused() -> None:
    job = _job()
    job.metadata.namespace = None
    with pytest.raises(ValueError, match="namespace"):
        _all_children(job)


def test_role_command_for_local_processes() -> None:
    job = _job()
    exe = (sys.executable, "-m", "impala_cli.main")
    ports = DEFAULT_PORTS.shifted(100)
    cmd = role_command(
        "rollout",
        job,
        learner_host="127.0.0.1",
        ports=ports,
        learner_gcs_port=DEFAULT_PORTS.gcs,
        node_ip="127.0.0.1",
        executable=exe,
    )
    assert cmd[:4] == [*exe, "rollout-node"]
    assert "--address=127.0.0.1:6379" in cmd  # still the learner's GCS port
    assert "--node-manager-port=6480" in cmd and "--min-worker-port=10102" in cmd
    assert "--node-ip-address=127.0.0.1" in cmd
    learner = role_command(
        "learner", job, run_dir="/r", config_path="/c.yaml", resume=False, ports=RayPorts(gcs=7000)
    )
    assert "--gcs-port=7000" in learner and "--resume" not in learner
    assert not any(a.startswith("--node-ip-address") for a in learner)
    status = role_command("status", job, run_dir="/r", status_port=9000)
    assert status == ["impalajob", "status-server", "--run-dir=/r", "--status-port=9000"]
    with pytest.raises(ValueError, match="learner_host"):
        role_command("aggregator", job)
    with pytest.raises(ValueError, match="run_dir"):
        role_command("learner", job, config_path="/c.yaml")


@pytest.mark.parametrize("role", ["learner", "rollout", "aggregator", "status"])
def test_rendered_commands_parse_with_the_role_entrypoints(role: str) -> None:
    """What the pods run is accepted by the real `impalajob` subcommand parsers."""
    import argparse
    import importlib

    from impala_cli.main import command_module

    job = _job(aggregators={"minReplicas": 1, "maxReplicas": 2})
    pod_specs = _pod_specs(_all_children(job))
    commands = [c["command"] for spec in pod_specs for c in _containers(spec)]
    (argv,) = [c for c in commands if c[1] == SUBCOMMAND[role]]  # type: ignore[index]
    parser = argparse.ArgumentParser(prog="impalajob")
    sub = parser.add_subparsers(dest="command")
    importlib.import_module(command_module(argv[1])).register(sub.add_parser(argv[1]))
    args = parser.parse_args(argv[1:])
    if role in ("rollout", "aggregator"):
        assert args.address == "cartpole-learner.team-a.svc:6379"
        assert args.node_ip_address == "$(POD_IP)"
    if role == "rollout":
        assert args.workers_per_pod == 3
    if role == "learner":
        assert str(args.file) == children.CONFIG_PATH and str(args.run_dir) == children.RUN_DIR
        assert args.resume is True
    if role == "status":
        assert args.status_port == 8080 and args.host == "0.0.0.0"


def test_pod_overrides_merge_onto_the_built_pods_without_loosening_them() -> None:
    pod = {
        "labels": {"team": "rl", names.COMPONENT: "hijack"},
        "annotations": {"example.com/owner": "rl"},
        "env": [
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "w", "key": "k"}}}
        ],
        "envFrom": [{"secretRef": {"name": "s3"}}],
        "imagePullSecrets": [{"name": "regcred"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
        "affinity": {"podAntiAffinity": {}},
        "priorityClassName": "training",
        "schedulerName": "volcano",
        "serviceAccountName": "trainer",
    }
    job = _job(learner={"pod": pod}, rollouts={"pod": {"env": [{"name": "A", "value": "1"}]}})
    learner = plan.learner_pod(job, UID, 0)
    spec, meta = learner["spec"], learner["metadata"]
    main = _container(spec, "learner")
    assert meta["labels"]["team"] == "rl" and meta["labels"][names.COMPONENT] == "learner"
    assert meta["annotations"]["example.com/owner"] == "rl"
    assert meta["annotations"][names.CONFIG_HASH_KEY]  # the operator's stay
    assert main["env"][-1]["name"] == "WANDB_API_KEY" and main["env"][0]["name"] == "POD_IP"
    assert main["envFrom"] == [{"secretRef": {"name": "s3"}}]
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in main["volumeMounts"]
    assert {v["name"] for v in spec["volumes"]} >= {"config", "run", "tmp", "shm", "data"}
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert (spec["priorityClassName"], spec["schedulerName"]) == ("training", "volcano")
    assert spec["serviceAccountName"] == "trainer" and spec["affinity"] == {"podAntiAffinity": {}}
    # The hardening is untouched: the overrides have no field that could change it.
    assert spec["securityContext"]["runAsNonRoot"] and not spec["automountServiceAccountToken"]
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # The sidecar gets none of the learner container's env or mounts.
    assert "envFrom" not in _container(spec, "status")
    (rollout,) = [
        d
        for d in _by_kind(_all_children(job))["Deployment"]
        if d["metadata"]["name"].endswith("-rollout")
    ]
    node = rollout["spec"]["template"]["spec"]["containers"][0]
    assert node["env"][-1] == {"name": "A", "value": "1"}


@pytest.mark.parametrize(
    ("pod", "says"),
    [
        ({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, "restricted Pod Security"),
        ({"securityContext": {"privileged": True}}, "unknown field"),
        ({"hostNetwork": True}, "unknown field"),
        ({"env": [{"name": "POD_IP", "value": "1.2.3.4"}]}, "set by the operator"),
        ({"env": [{"name": "IMPALA_STATUS_TOKEN", "value": "x"}]}, "set by the operator"),
        ({"volumes": [{"name": "run", "emptyDir": {}}]}, "are the operator's"),
        ({"volumes": [{"name": "v"}]}, "exactly one of"),
        ({"volumeMounts": [{"name": "v", "mountPath": "/x"}]}, "must name one of"),
        (
            {
                "volumes": [{"name": "v", "emptyDir": {}}],
                "volumeMounts": [{"name": "v", "mountPath": "/tmp"}],
            },
            "operator's mounts",
        ),
    ],
)
def test_pod_overrides_refuse_what_would_break_the_pods(pod: dict[str, Any], says: str) -> None:
    with pytest.raises(ManifestError) as exc:
        _job(learner={"pod": pod})
    assert any("spec.learner.pod" in p and says in p for p in exc.value.problems), exc.value


def test_security_is_on_the_auth_secret_tokens_and_every_ray_node() -> None:
    job = _job(aggregators={"minReplicas": 1, "maxReplicas": 2})
    manifests = _all_children(job)
    tokens = operator_access(UID)["tokens"]
    (secret,) = [m for m in manifests if m["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "cartpole-auth"
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {"status-token": tokens.status, "ray-token": tokens.ray}
    assert tokens.status != tokens.ray  # the status token grants no Ray access
    ray_env = {
        "name": "RAY_AUTH_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "cartpole-auth", "key": "ray-token"}},
    }
    for pod_spec in _pod_specs(manifests):
        main = pod_spec["containers"][0]
        assert ray_env in main["env"], main["name"]  # learner, rollout and aggregator alike
    learner = _learner(manifests)["spec"]
    sidecar = _container(learner, "status")
    assert ray_env not in sidecar["env"]
    assert {"name": "IMPALA_STATUS_TOKEN_FILE", "value": "/etc/impalajob-auth/status-token"} in (
        sidecar["env"]
    )
    (auth,) = [v for v in learner["volumes"] if v["name"] == "auth"]
    assert auth["secret"]["items"] == [{"key": "status-token", "path": "status-token"}]
    assert all(m["name"] != "auth" for m in _container(learner, "learner")["volumeMounts"])


def test_network_policy_admits_the_status_port_only_from_labelled_pods() -> None:
    (policy,) = [m for m in _all_children(_job()) if m["kind"] == "NetworkPolicy"]
    ray, _collective, status = policy["spec"]["ingress"]
    assert ray["from"] == [{"podSelector": {"matchLabels": names.selector_labels("cartpole")}}]
    access = {"matchLabels": {"impala.dev/status-access": "true"}}
    assert status["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert status["from"] == [
        {"podSelector": access},  # the job's namespace
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "impala-system"}},
            "podSelector": access,
        },  # the operator's
    ]


def test_the_monitoring_namespace_reaches_the_metrics_port_and_nothing_else() -> None:
    """The sidecar serves /metrics without the token on its metrics port, which only the
    operator's monitoring namespace (Prometheus) may reach; without one, only the job's pods."""
    job = _job()
    policy = children.build_network_policy(job, "uid-1", "impala-system", "monitoring")
    *_, metrics = policy["spec"]["ingress"]
    assert metrics == {
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name":
                                                        "monitoring"}}}],
        "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
    }  # fmt: skip
    assert len(children.build_network_policy(job, "uid-1", "impala-system")["spec"]["ingress"]) == 3
    learner = children.build_learner_pod(job, "uid-1")
    sidecar = next(c for c in learner["spec"]["initContainers"] if c["name"] == "status")
    assert f"--metrics-port={METRICS_PORT}" in sidecar["command"] + sidecar.get("args", [])
    assert {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"} in sidecar["ports"]


def test_rollout_nodes_take_workers_per_pod_from_the_spec_field() -> None:
    """`--workers-per-pod` is named for `spec.rollouts.workersPerPod` (`--num-rollout-workers` of
    `train` is the job's total): rendered by role_command, parsed by `impalajob rollout-node`."""
    import argparse

    from impala_cli.commands import nodes

    job = _job()  # rollouts.workersPerPod: 3
    cmd = role_command("rollout", job, learner_host="127.0.0.1")
    assert [a for a in cmd if a.startswith("--workers")] == ["--workers-per-pod=3"]

    def parse(*argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser(prog="impalajob rollout-node")
        nodes.register(parser)
        return parser.parse_args(list(argv))

    assert parse(*cmd[2:]).workers_per_pod == 3
    assert parse("--address", "127.0.0.1:6379", "--workers-per-pod", "4").workers_per_pod == 4
    assert parse("--address", "127.0.0.1:6379").workers_per_pod == 1
    # A pod an operator of the previous release rendered (`--workers=N`) still parses: argparse
    # reads it as the unambiguous prefix of --workers-per-pod.
    assert parse("--address", "127.0.0.1:6379", "--workers=2").workers_per_pod == 2
