"""Both install paths on a real API server: the Helm chart (lint, template, install, namespaced
mode) and `kubectl apply -f manifests/`; RBAC is least-privilege and enough for the operator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import CommandError, Kube, build_binaries
from tests.support.crd import install_crd

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHART = str(ROOT / "charts" / "impala-operator")
MANIFESTS = ROOT / "manifests"

# (verb, resource) the operator needs, and some it must not have.
NEEDED = [
    *[(v, "impalajobs.impala.dev") for v in ("get", "list", "watch", "patch", "update", "delete")],
    *[(v, "impalajobs.impala.dev/status") for v in ("get", "patch", "update")],
    *[
        (v, r)
        for r in (
            "pods",
            "services",
            "configmaps",
            "deployments.apps",
            "networkpolicies.networking.k8s.io",
            "poddisruptionbudgets.policy",
        )
        for v in ("create", "get", "list", "watch", "patch", "update", "delete")
    ],
    *[(v, "persistentvolumeclaims") for v in ("get", "list", "watch")],
    ("create", "events"),
    ("create", "secrets"),  # each job's auth Secret, applied...
    ("patch", "secrets"),
]
FORBIDDEN = [
    ("get", "secrets"),  # ...but never read: the operator derives its tokens
    ("list", "secrets"),
    ("create", "persistentvolumeclaims"),
    ("create", "impalajobs.impala.dev"),
    ("create", "roles.rbac.authorization.k8s.io"),
    ("delete", "namespaces"),
    ("create", "pods/exec"),
    ("update", "deployments.apps/scale"),
    ("patch", "pods/status"),
]


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _template(kube: Kube, *args: str) -> list[dict[str, Any]]:
    out = kube.helm("template", "impala", CHART, "--namespace", "impala-system", *args).stdout
    return _docs(out)


def _rules(
    docs: list[dict[str, Any]], kind: str = "ClusterRole", own: bool = False
) -> list[dict[str, Any]]:
    """The rules of the one `kind` object (the Role in the operator's own namespace apart, or
    only it)."""
    (role,) = [
        d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith("-self") == own
    ]
    return list(role["rules"])


def _can(kube: Kube, sa: str, verb: str, resource: str, ns: str, name: str | None = None) -> bool:
    # `can-i VERB a/b` would read b as an object name; subresources need --subresource.
    resource, _, sub = resource.partition("/")
    extra = [f"--subresource={sub}"] if sub else []
    target = f"{resource}/{name}" if name else resource
    proc = kube.kubectl("auth", "can-i", verb, target, *extra, "-n", ns, f"--as={sa}", check=False)
    return proc.stdout.strip() == "yes"


def test_helm_lint_is_clean(kube: Kube) -> None:
    proc = kube.helm("lint", "--strict", CHART)
    assert "0 chart(s) failed" in proc.stdout, proc.stdout
    kube.helm("lint", "--strict", CHART, "--set", "watchNamespaces={team-a,team-b}")
    # values.schema.json closes every level: a misspelt key fails instead of being ignored
    with pytest.raises(CommandError) as err:
        kube.helm("lint", "--strict", CHART, "--set", "metrics.prot=9091")
    assert "prot" in err.value.stdout + err.value.stderr


def test_template_renders_one_object_per_template_with_short_names(kube: Kube) -> None:
    docs = _template(kube, "--set", "fullnameOverride=" + "x" * 63)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding", "Service",
        "ServiceAccount",
    ]  # fmt: skip
    for doc in docs:
        assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]
        for value in doc["metadata"].get("labels", {}).values():
            assert len(str(value)) <= 63
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    command = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["impalajob", "operator", "--all-namespaces"]
    # CRDs are not templated: they ship untouched in crds/
    assert not any(d["kind"] == "CustomResourceDefinition" for d in docs)


def test_chart_and_manifests_grant_the_same_least_privilege(kube: Kube) -> None:
    chart_rules = _rules(_template(kube))
    manifest_docs = _docs((MANIFESTS / "rbac.yaml").read_text())
    manifest_rules = _rules(manifest_docs)
    assert chart_rules == manifest_rules
    # In the operator's own namespace: its token key Secret (by name), making it, and leases.
    own = [
        {"apiGroups": [""], "resources": ["secrets"],
         "resourceNames": ["impala-operator-token-key"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "verbs": ["get", "create", "update"]},
    ]  # fmt: skip
    assert _rules(_template(kube), "Role", own=True) == own
    assert _rules(manifest_docs, "Role", own=True) == own
    namespaced = _template(kube, "--set", "watchNamespaces={team-a}")
    for rules in (chart_rules, _rules(namespaced), _rules(namespaced, "Role")):
        for rule in rules:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], rule
    # namespaced mode: only kopf's CRD discovery and reads of the cluster-scoped objects a
    # Kueue admission names (flavors, priority classes) stay cluster-wide
    assert _rules(namespaced) == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list", "watch"],
        },
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["resourceflavors", "workloadpriorityclasses"],
            "verbs": ["get"],
        },
        {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": ["get"]},
    ]
    (role,) = [
        d for d in namespaced if d["kind"] == "Role" and not d["metadata"]["name"].endswith("-self")
    ]
    assert role["metadata"]["namespace"] == "team-a"


def test_helm_install_grants_the_operator_what_it_needs(kube: Kube, namespace: str) -> None:
    install_crd(kube)
    release = "impala-e2e"
    proc = kube.helm("install", release, CHART, "--namespace", namespace)
    assert "kubectl get ij" in proc.stdout  # NOTES.txt tells the next command
    try:
        fullname = f"{release}-impala-operator"
        sa = f"system:serviceaccount:{namespace}:{fullname}"
        dep = kube.get("deployment", fullname, "-n", namespace)
        assert dep["spec"]["template"]["spec"]["serviceAccountName"] == fullname
        kube.kubectl(
            "rollout", "status", f"deployment/{fullname}", "-n", namespace, "--timeout=120s"
        )
        kube.get("service", f"{fullname}-metrics", "-n", namespace)
        for verb, resource in NEEDED:
            assert _can(kube, sa, verb, resource, "some-other-namespace"), (verb, resource)
        for verb, resource in FORBIDDEN:
            assert not _can(kube, sa, verb, resource, namespace), (verb, resource)
        # the leader Lease and the token key: in the release namespace only, the key by name
        assert _can(kube, sa, "update", "leases.coordination.k8s.io", namespace)
        key = "impala-operator-token-key"
        assert _can(kube, sa, "get", "secrets", namespace, name=key)
        assert not _can(kube, sa, "get", "secrets", "kube-system", name=key)
        assert not _can(kube, sa, "update", "leases.coordination.k8s.io", "kube-system")
        # and the account really works as a client (token from the TokenRequest API)
        env = kube.env_for(kube.sa_kubeconfig(namespace, fullname))
        kube.kubectl("get", "impalajobs", "--all-namespaces", env=env)
    finally:
        kube.helm("uninstall", release, "--namespace", namespace, check=False)


def test_helm_install_namespaced_mode(kube: Kube, namespace: str) -> None:
    install_crd(kube)
    release = "impala-ns"
    with kube.namespace("watched") as watched:
        kube.helm(
            "install",
            release,
            CHART,
            "--namespace",
            namespace,
            "--set",
            f"watchNamespaces={{{watched}}}",
        )
        try:
            fullname = f"{release}-impala-operator"
            sa = f"system:serviceaccount:{namespace}:{fullname}"
            dep = kube.get("deployment", fullname, "-n", namespace)
            command = dep["spec"]["template"]["spec"]["containers"][0]["command"]
            assert f"--namespace={watched}" in command and "--all-namespaces" not in command
            assert _can(kube, sa, "create", "pods", watched)
            assert _can(kube, sa, "patch", "impalajobs.impala.dev/status", watched)
            assert not _can(kube, sa, "create", "pods", namespace)
            assert not _can(kube, sa, "list", "impalajobs.impala.dev", "default")
        finally:
            kube.helm("uninstall", release, "--namespace", namespace, check=False)


def test_kubectl_apply_manifests_installs_the_operator(kube: Kube) -> None:
    proc = kube.kubectl("apply", "--validate=strict", "-f", str(MANIFESTS))
    # (other tests may have created the CRD server-side: kubectl notes it adopts it, harmlessly)
    warnings = [
        line
        for line in proc.stderr.splitlines()
        if "Warning" in line and "last-applied-configuration" not in line
    ]
    assert not warnings, proc.stderr
    sa = "system:serviceaccount:impala-system:impala-operator"
    kube.wait_crd_established("impalajobs.impala.dev")
    kube.kubectl(
        "rollout", "status", "deployment/impala-operator", "-n", "impala-system", "--timeout=120s"
    )
    for verb, resource in NEEDED:
        assert _can(kube, sa, verb, resource, "default"), (verb, resource)
    for verb, resource in FORBIDDEN:
        assert not _can(kube, sa, verb, resource, "default"), (verb, resource)
    # idempotent: a second apply changes nothing
    again = kube.kubectl("apply", "-f", str(MANIFESTS)).stdout
    assert all(line.endswith("unchanged") for line in again.strip().splitlines()), again
    # the operator's own namespace enforces the restricted Pod Security Standard, which the
    # operator pod meets (it was admitted above); the example job is accepted too
    ns = kube.get("namespace", "impala-system")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    kube.kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        "default",
        "-f",
        str(MANIFESTS / "examples" / "cartpole.yaml"),
    )
    # Two replicas, one leading on the Lease: a rolling update keeps one running throughout.
    dep = kube.get("deployment", "impala-operator", "-n", "impala-system")
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "--leader-elect" in dep["spec"]["template"]["spec"]["containers"][0]["command"]


def test_crd_upgrade_path(kube: Kube, namespace: str, tmp_path: Path) -> None:
    """The documented upgrade (README, "Upgrading"): `helm upgrade` never touches a chart's
    crds/, so the new CRD is applied server-side first, from the new release's `impalajob crd`.
    The previous release is simulated by a copy of the chart whose CRD lacks a field this one
    has (runPolicy.startupDeadlineSeconds), installed by Helm as a real previous install was."""
    import shutil
    import subprocess
    import sys

    old_chart = tmp_path / "impala-operator"
    shutil.copytree(CHART, old_chart)
    old_crd, population_crd = yaml.safe_load_all((MANIFESTS / "crd.yaml").read_text())
    schema = old_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    del schema["properties"]["runPolicy"]["properties"]["startupDeadlineSeconds"]
    (old_chart / "crds" / "impala-crds.yaml").write_text(
        yaml.safe_dump_all([old_crd, population_crd])
    )
    # Helm installs crds/ only where the CRD is absent: start from a cluster without it.
    kube.kubectl("delete", "crd", "impalajobs.impala.dev", "--ignore-not-found", "--wait=true")
    release = "impala-upgrade"
    kube.helm("install", release, str(old_chart), "--namespace", namespace)
    try:
        kube.wait_crd_established("impalajobs.impala.dev")
        job = {
            "apiVersion": "impala.dev/v1alpha1",
            "kind": "ImpalaJob",
            "metadata": {"name": "upgraded", "namespace": namespace},
            "spec": {"stop": {"timesteps": 1000}, "runPolicy": {"startupDeadlineSeconds": 600}},
        }
        # The old CRD does not know the field: strict validation refuses it.
        refused = kube.kubectl("apply", "--validate=strict", "--dry-run=server", "-f", "-",
                               stdin=json.dumps(job), check=False)  # fmt: skip
        assert refused.returncode != 0 and "startupDeadlineSeconds" in refused.stderr
        # 1. the new CRD, from the new release's CLI (the same bytes as manifests/crd.yaml)
        crd = subprocess.run([sys.executable, "-m", "impala_cli.main", "crd"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=crd)
        kube.wait_crd_established("impalajobs.impala.dev")
        # 2. the operator
        kube.helm("upgrade", release, CHART, "--namespace", namespace)
        kube.kubectl("apply", "--validate=strict", "-f", "-", stdin=json.dumps(job))
        live = kube.get("ij", "upgraded", "-n", namespace)
        assert live["spec"]["runPolicy"]["startupDeadlineSeconds"] == 600
    finally:
        kube.kubectl("delete", "ij", "upgraded", "-n", namespace, "--ignore-not-found")
        kube.helm("uninstall", release, "--namespace", namespace, check=False)
        install_crd(kube)  # the current CRD for the tests after this one


def test_krew_installs_the_kubectl_plugin_from_the_repository(
    kube: Kube, namespace: str, tmp_path: Path
) -> None:
    """plugins/krew/impalajob.yaml matches the archive hack/krew-plugin.sh packs, krew (from
    its Go module) installs it from the checkout, and `kubectl impalajob` then reaches the
    cluster through the launcher krew put on PATH."""
    build_binaries("krew", quiet=True)  # beside the kube fixture's binaries (tests/run.sh)
    subprocess.run(["bash", str(ROOT / "hack" / "krew-plugin.sh"), "--check"], check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    (archive,) = (ROOT / "dist").glob("kubectl-impalajob-v*.tar.gz")
    krew_root = tmp_path / "krew"
    env = {**kube.env, "KREW_ROOT": str(krew_root)}
    kube.run("krew", "install", f"--manifest={ROOT / 'plugins' / 'krew' / 'impalajob.yaml'}",
             f"--archive={archive}", env=env)  # fmt: skip
    launcher = krew_root / "bin" / "kubectl-impalajob"
    assert launcher.is_symlink() or launcher.exists()
    env["PATH"] = f"{krew_root / 'bin'}{os.pathsep}{env['PATH']}"
    env["IMPALAJOB_PYTHON"] = sys.executable
    assert kube.kubectl("impalajob", "--help", env=env).stdout.startswith(
        "usage: kubectl impalajob"
    )
    missing = kube.kubectl("impalajob", "status", "nosuch", "-n", namespace, env=env, check=False)
    assert missing.returncode == 1, missing.stderr
    assert f"ImpalaJob {namespace}/nosuch not found" in missing.stderr
