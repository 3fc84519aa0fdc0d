"""The real-node harness's teardown tolerates the kubelet removing cgroups while it walks them:
CI once lost a passing e2e test to a FileNotFoundError raised from `Path.rglob` mid-teardown."""

from __future__ import annotations

import os
import tarfile
import threading
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


def test_an_archive_names_its_manifests_and_the_thin_copy_keeps_them(tmp_path: Path) -> None:
    """The kept image store prunes by the archives' manifest digests, and imports a copy without
    the blobs it holds: the copy keeps the index and every blob the store lacks."""
    pause = tmp_path / "pause"
    pause.write_bytes(b"\0" * 64)
    archive = node.pause_image_archive(pause, tmp_path / "pause.oci.tar")
    digests = node.manifest_digests(archive)
    assert len(digests) == 1 and next(iter(digests)).startswith("sha256:")
    layer_blobs = {f"sha256:{p.name}" for p in _blobs(archive)} - digests
    thin = node.without_blobs(archive, layer_blobs, tmp_path / "thin.oci.tar")
    assert thin is not None
    assert {f"sha256:{p.name}" for p in _blobs(thin)} == digests
    assert node.manifest_digests(thin) == digests
    assert node.without_blobs(archive, set(), tmp_path / "none.oci.tar") is None


def _blobs(archive: Path) -> list[Path]:
    with tarfile.open(archive) as tar:
        return [Path(m.name) for m in tar.getmembers() if m.isfile() and "/sha256/" in m.name]


def test_the_kept_store_waits_for_an_import_and_is_refused_to_a_holder(tmp_path: Path) -> None:
    """tests/run.sh's preload holds the store while it imports; the node waits for it, and a
    holder that outlasts the wait leaves the node its own root (None)."""
    preload = node.hold_store(tmp_path)
    assert preload is not None
    assert node.hold_store(tmp_path, wait=0.0) is None
    threading.Timer(0.5, preload.close).start()  # the import ends
    waited = node.hold_store(tmp_path, wait=30.0)
    assert waited is not None
    waited.close()
