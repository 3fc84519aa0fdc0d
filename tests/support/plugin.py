"""`kubectl impalajob ...`: the real kubectl running the plugin the package installs."""

from __future__ import annotations

import os
import sysconfig

from harness.cluster import Kube


def kubectl_impalajob(kube: Kube, *args: str) -> str:
    """`kubectl impalajob ARGS --context C --kubeconfig F`: kubectl finds `kubectl-impalajob`
    on PATH (where `pip install` puts the package's scripts), and the plugin reaches the cluster
    the way a kubectl user points it there, by the flags, with no KUBECONFIG set. Its stdout."""
    scripts = sysconfig.get_path("scripts")
    assert os.path.exists(os.path.join(scripts, "kubectl-impalajob")), "the plugin is installed"
    env = {k: v for k, v in kube.env.items() if k != "KUBECONFIG"}
    env["PATH"] = scripts + os.pathsep + env.get("PATH", os.defpath)
    context = kube.kubectl("config", "current-context").stdout.strip()
    flags = ("--context", context, "--kubeconfig", str(kube.kubeconfig))
    return kube.kubectl("impalajob", *args, *flags, env=env).stdout
