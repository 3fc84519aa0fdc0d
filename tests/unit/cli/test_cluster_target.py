"""`--kubeconfig` and `--context`, as kubectl reads them: which cluster and namespace a command
that looks a job up uses (`kubectl impalajob status NAME --context C`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from impala_cli.commands import cluster
from impala_cli.main import main


def _kubeconfig(path: Path) -> Path:
    """Two contexts on two servers (nothing listens: only the configuration is read)."""
    def ctx(name: str, ns: str) -> dict:
        return {"name": name, "context": {"cluster": name, "user": "u", "namespace": ns}}

    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "a",
        "clusters": [{"name": n, "cluster": {"server": f"https://127.0.0.1:{p}"}}
                     for n, p in (("a", 1), ("b", 2))],
        "contexts": [ctx("a", "team-a"), ctx("b", "team-b")],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))  # fmt: skip
    return path


@pytest.fixture(autouse=True)
def default_target() -> Iterator[None]:
    yield
    cluster.use(cluster.Target())


def test_the_context_named_gives_its_server_and_namespace(tmp_path: Path) -> None:
    from kubernetes import client

    config = _kubeconfig(tmp_path / "config")
    cluster.use(cluster.Target(str(config), None))
    assert cluster.connect(None).namespace == "team-a"
    assert client.Configuration.get_default_copy().host == "https://127.0.0.1:1"
    cluster.use(cluster.Target(str(config), "b"))
    assert cluster.connect(None).namespace == "team-b"
    assert client.Configuration.get_default_copy().host == "https://127.0.0.1:2"
    assert cluster.connect("mine").namespace == "mine"  # -n wins, as kubectl's


def test_a_kubeconfig_or_context_that_cannot_load_is_an_error_not_another_cluster(
    tmp_path: Path,
) -> None:
    cluster.use(cluster.Target(str(tmp_path / "missing"), None))
    with pytest.raises(cluster.NoClusterError, match=r"--kubeconfig .*missing"):
        cluster.connect(None)
    cluster.use(cluster.Target(str(_kubeconfig(tmp_path / "config")), "nope"))
    with pytest.raises(cluster.NoClusterError, match="--context nope"):
        cluster.connect(None)


def test_the_flags_reach_every_command_that_looks_a_job_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["status", "j"], ["logs", "j"], ["evaluate", "j"], ["export", "j", "--format",
                 "torchscript", "-o", str(tmp_path / "p.pt")]):  # fmt: skip
        code = main([*argv, "--kubeconfig", str(tmp_path / "missing"), "--context", "c"])
        err = capsys.readouterr().err
        assert code != 0 and "--kubeconfig" in err and "missing" in err, (argv, err)
        assert "Traceback" not in err
