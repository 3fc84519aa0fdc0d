"""node/cpus.py: the CPUs a process may use (affinity, cgroup v1/v2 quotas) and the learner's
intra-op threads from them, the learner's CPU request and OMP_NUM_THREADS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from impala_api.spec.pods import Resources
from impala_trainer.node import cpus
from impala_trainer.node.cpus import (
    cgroup_cpus,
    cpu_quantity,
    local_learner_threads,
    pod_learner_threads,
    quota_v1,
    quota_v2,
    reserved_cpus,
)


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("500m", 0.5), ("2", 2.0), ("1.5", 1.5), ("2500m", 2.5), ("1k", 1000.0)],
)
def test_cpu_quantities_in_cpus(quantity: str, expected: float) -> None:
    assert cpu_quantity(quantity) == expected


def test_a_cpu_quantity_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="not a CPU quantity"):
        cpu_quantity("two")


def test_the_request_is_what_is_reserved_else_the_limit() -> None:
    assert reserved_cpus(Resources(requests={"cpu": "3"}, limits={"cpu": "8"})) == 3.0
    assert reserved_cpus(Resources(limits={"cpu": "1500m"})) == 1.5  # the API server's default
    assert reserved_cpus(Resources(requests={"memory": "4Gi"})) is None
    assert reserved_cpus(Resources()) is None


def test_cfs_quotas_in_cpus() -> None:
    assert quota_v2("200000 100000\n") == 2.0
    assert quota_v2("150000 100000") == 1.5
    assert quota_v2("max 100000\n") is None
    assert quota_v1("400000\n", "100000\n") == 4.0
    assert quota_v1("-1", "100000") is None


def _v2_machine(tmp_path: Path, cgroup: str, mount_root: str = "/") -> tuple[Path, Path]:
    point = tmp_path / "sys-fs-cgroup"
    point.mkdir()
    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text(f"0::{cgroup}\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 28 0:21 / /proc rw,nosuid - proc proc rw\n"
        f"35 28 0:30 {mount_root} {point} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    return proc_cgroup, mountinfo


def test_cgroup_v2_takes_the_tightest_quota_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    proc_cgroup, mountinfo = _v2_machine(tmp_path, "/kubepods/burstable/pod1/ctr")
    point = tmp_path / "sys-fs-cgroup"
    ctr = point / "kubepods" / "burstable" / "pod1" / "ctr"
    ctr.mkdir(parents=True)
    (ctr / "cpu.max").write_text("max 100000\n")
    (ctr.parent / "cpu.max").write_text("250000 100000\n")  # the pod's limit
    (point / "kubepods" / "cpu.max").write_text("1600000 100000\n")
    assert cgroup_cpus(proc_cgroup, mountinfo) == 2.5


def test_cgroup_v2_in_its_own_namespace_reads_the_mount_point(tmp_path: Path) -> None:
    proc_cgroup, mountinfo = _v2_machine(tmp_path, "/")
    (tmp_path / "sys-fs-cgroup" / "cpu.max").write_text("100000 100000\n")
    assert cgroup_cpus(proc_cgroup, mountinfo) == 1.0


def test_cgroup_v2_mounted_at_the_containers_own_cgroup(tmp_path: Path) -> None:
    proc_cgroup, mountinfo = _v2_machine(tmp_path, "/kubepods/pod1/ctr", "/kubepods/pod1/ctr")
    (tmp_path / "sys-fs-cgroup" / "cpu.max").write_text("300000 100000\n")
    assert cgroup_cpus(proc_cgroup, mountinfo) == 3.0


def test_cgroup_v1_reads_the_cpu_controllers_hierarchy(tmp_path: Path) -> None:
    point = tmp_path / "cpu,cpuacct"
    own = point / "kubepods" / "pod1" / "ctr"
    own.mkdir(parents=True)
    (own / "cpu.cfs_quota_us").write_text("-1\n")
    (own / "cpu.cfs_period_us").write_text("100000\n")
    (own.parent / "cpu.cfs_quota_us").write_text("50000\n")
    (own.parent / "cpu.cfs_period_us").write_text("100000\n")
    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text("5:cpuset:/kubepods/pod1/ctr\n4:cpu,cpuacct:/kubepods/pod1/ctr\n0::/\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"33 31 0:30 / {tmp_path}/cpuset rw - cgroup cgroup rw,cpuset\n"
        f"34 31 0:31 / {point} rw - cgroup cgroup rw,cpu,cpuacct\n"
    )
    assert cgroup_cpus(proc_cgroup, mountinfo) == 0.5


def test_no_quota_or_no_cgroup_is_none(tmp_path: Path) -> None:
    proc_cgroup, mountinfo = _v2_machine(tmp_path, "/")
    assert cgroup_cpus(proc_cgroup, mountinfo) is None  # no cpu.max: the root cgroup
    (tmp_path / "sys-fs-cgroup" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(proc_cgroup, mountinfo) is None
    assert cgroup_cpus(tmp_path / "absent", mountinfo) is None  # not Linux


def test_available_cpus_is_the_affinity_within_the_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda _pid: set(range(64)))
    monkeypatch.setattr(cpus, "cgroup_cpus", lambda: 2.5)
    assert cpus.available_cpus() == 2  # rounded down
    monkeypatch.setattr(cpus, "cgroup_cpus", lambda: 0.5)
    assert cpus.available_cpus() == 1  # at least one
    monkeypatch.setattr(cpus, "cgroup_cpus", lambda: None)
    assert cpus.available_cpus() == 64
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda _pid: {3})
    assert cpus.available_cpus() == 1


def test_this_machine_reads_without_error() -> None:
    assert 1 <= cpus.available_cpus() <= (len(cpus.os.sched_getaffinity(0)))


def test_a_learner_pod_computes_with_the_cpus_reserved_for_it() -> None:
    def threads(resources: Resources, cores: int = 64, **env: str) -> int:
        return pod_learner_threads(resources, environ=env, cpus=cores)[0]

    assert threads(Resources()) == 1  # nothing reserved: as Ray gives an actor of num_cpus 1
    assert threads(Resources(requests={"cpu": "4"}, limits={"cpu": "8"})) == 4
    assert threads(Resources(limits={"cpu": "3"})) == 3
    assert threads(Resources(requests={"cpu": "2500m"})) == 2
    assert threads(Resources(requests={"cpu": "500m"})) == 1
    assert threads(Resources(requests={"cpu": "16"}), cores=6) == 6  # no more than it may use
    assert threads(Resources(requests={"cpu": "4"}), OMP_NUM_THREADS="2") == 2  # the pod's env
    assert threads(Resources(), OMP_NUM_THREADS="nonsense") == 1


def test_a_local_run_leaves_a_core_to_each_actor() -> None:
    assert local_learner_threads(2, environ={}, cpus=2)[0] == 1
    assert local_learner_threads(3, environ={}, cpus=2)[0] == 1
    assert local_learner_threads(2, environ={}, cpus=8)[0] == 6
    assert local_learner_threads(2, environ={"OMP_NUM_THREADS": "3"}, cpus=8)[0] == 3
    # learner.replicas learners share what the actors leave: each its part.
    threads, why = local_learner_threads(2, environ={}, cpus=8, learners=3)
    assert threads == 2 and "shared by 3 learners" in why
    assert local_learner_threads(2, environ={}, cpus=2, learners=2)[0] == 1


def test_the_threads_set_are_those_the_learner_thread_takes() -> None:
    """In a fresh process, as the learner command runs it before it builds the driver."""
    probe = (
        "from impala_api.spec.pods import Resources\n"
        "from impala_trainer.node.cpus import pod_learner_threads, set_learner_threads\n"
        "from impala_trainer.learners.threads import _take_intra_op_threads\n"
        "import torch\n"
        "torch.set_num_threads(2)\n"  # what torch would take on a 2-core node
        "set_learner_threads(*pod_learner_threads(Resources(), environ={}))\n"
        "print(_take_intra_op_threads())\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
