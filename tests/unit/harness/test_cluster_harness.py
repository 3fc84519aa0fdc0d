"""The real-node harness's teardown tolerates the kubelet removing cgroups while it walks them:
CI once lost a passing e2e test to a FileNotFoundError raised from `Path.rglob` mid-teardown."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.cluster import node


@pytest.fixture
def vanishing_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cgroup-like tree whose pod directory is removed just as the walk reaches it."""
    pod = tmp_path / "kubepods" / "besteffort" / "pod1"
    (pod / "c1").mkdir(parents=True)
    (pod / "cgroup.procs").write_text("")
    (tmp_path / "cgroup.procs").write_text("")
    real_scandir = os.scandir

    def scandir(path):  # type: ignore[no-untyped-def]
        if isinstance(path, (str, os.PathLike)) and Path(path) == pod and pod.exists():
            (pod / "cgroup.procs").unlink()
            (pod / "c1").rmdir()
            pod.rmdir()
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    return tmp_path


def test_kill_survives_a_cgroup_removed_mid_walk(vanishing_tree: Path) -> None:
    node._kill_cgroup_tree(vanishing_tree)  # raised FileNotFoundError with rglob


def test_remove_survives_a_cgroup_removed_mid_walk(vanishing_tree: Path) -> None:
    (vanishing_tree / "cgroup.procs").unlink()  # plain files would block rmdir outside cgroupfs
    node._remove_cgroup_tree(vanishing_tree, timeout=1.0)
    assert not vanishing_tree.exists()


def test_cgroup_dirs_are_deepest_first(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert node._cgroup_dirs(tmp_path) == [tmp_path / "a" / "b", tmp_path / "a", tmp_path]
