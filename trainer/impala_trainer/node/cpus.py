"""The CPUs this process may use, and the intra-op threads its learner computes with.

torch sizes its intra-op (OpenMP) team from the machine's cores, not from what a container may
use: in a learner pod on a 64-core node the learner would run 64 threads whatever the pod asked
for, and a CFS quota would throttle them. Even where the cores are there, a team larger than
the CPUs left to it costs more than it gives: OpenMP's workers spin between parallel ops, on
cores the driver loop and other pods want. Measured on a 2-core machine, the learner pod of
`bench/multipod_scaling.py` (one rollout pod beside it): CartPole 51-57K env steps/s with 2
threads, its OpenMP worker alone burning ~12 CPU-ms per 1,000 env steps, against 75-76K with
one; Pong 1,663 against 2,397 (`OMP_NUM_THREADS=2`, then 1, alternating).

So threads follow what was reserved for the learner, as Ray gives an actor `OMP_NUM_THREADS`
equal to the CPUs it reserved (RLlib's learner actor: one):
- a learner pod: its container's CPU request (else its limit), at least 1; without either, 1;
- `impalajob train`: the CPUs this process may use less one per actor sharing them, at least 1;
- either way never more than the CPUs this process may use (its CPU affinity and its cgroup's
  CFS quota, v1 or v2), and `OMP_NUM_THREADS`, where set (a pod's `env`), wins.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path

from impala_api.spec.pods import QUANTITY_PATTERN, Resources

logger = logging.getLogger(__name__)

PROC_CGROUP = Path("/proc/self/cgroup")
PROC_MOUNTINFO = Path("/proc/self/mountinfo")

_SUFFIXES = {"m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}  # fmt: skip
_QUANTITY = re.compile(QUANTITY_PATTERN)


def cpu_quantity(quantity: str) -> float:
    """A Kubernetes CPU quantity in CPUs: "500m" 0.5, "2" 2.0 (the spec's Quantity pattern)."""
    quantity = quantity.strip()
    match = _QUANTITY.match(quantity)
    if match is None:
        raise ValueError(f"not a CPU quantity: {quantity!r}")
    suffix = match.group(2) or ""
    return float(quantity[: len(quantity) - len(suffix)]) * _SUFFIXES[suffix]


def reserved_cpus(resources: Resources) -> float | None:
    """The CPUs Kubernetes reserves for a container: its request, else its limit (which the API
    server then copies into the request); None without either."""
    quantity = resources.requests.get("cpu") or resources.limits.get("cpu")
    return None if quantity is None else cpu_quantity(quantity)


# -- the cgroup's CFS quota --------------------------------------------------------------------


def quota_v2(cpu_max: str) -> float | None:
    """CPUs from cgroup v2's `cpu.max` ("200000 100000": 2.0; "max 100000": no quota)."""
    fields = cpu_max.split()
    if not fields or fields[0] == "max":
        return None
    period = float(fields[1]) if len(fields) > 1 else 100_000.0
    return float(fields[0]) / period if period > 0 else None


def quota_v1(quota_us: str, period_us: str) -> float | None:
    """CPUs from cgroup v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us` (quota -1: none)."""
    quota, period = int(quota_us), int(period_us)
    return quota / period if quota > 0 and period > 0 else None


def _cpu_cgroup(proc_cgroup: str) -> tuple[int, str] | None:
    """(version, path) of this process's cgroup that holds its CPU quota: the v1 hierarchy with
    the cpu controller where there is one, else the v2 (unified) one."""
    unified = None
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            unified = (2, path)
        elif "cpu" in controllers.split(","):
            return 1, path
    return unified


def _mount(mountinfo: str, version: int) -> tuple[str, str] | None:
    """(mount root within the hierarchy, mount point) of the cgroup hierarchy of `version`."""
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point, fstype, options = fields[3], fields[4], tail[0], tail[2].split(",")
        if (version == 2 and fstype == "cgroup2") or (
            version == 1 and fstype == "cgroup" and "cpu" in options
        ):
            return root, point
    return None


def cgroup_cpus(proc_cgroup: Path = PROC_CGROUP, mountinfo: Path = PROC_MOUNTINFO) -> float | None:
    """The tightest CFS quota on this process's cgroup and its ancestors, in CPUs; None where
    there is none or it cannot be read (not Linux, no cgroup mounted)."""
    try:
        found = _cpu_cgroup(proc_cgroup.read_text())
        if found is None:
            return None
        version, path = found
        mount = _mount(mountinfo.read_text(), version)
    except OSError:
        return None
    if mount is None:
        return None
    root, point = mount
    # In a container (its own cgroup namespace, or a bind mount of its cgroup) the mount's root
    # is the process's cgroup, or above it: the path below the mount point is what is left.
    if root == "/" or path == root or path.startswith(root + "/"):
        relative = path[len(root.rstrip("/")) :].lstrip("/")
    else:
        relative = ""
    if ".." in Path(relative).parts:  # a cgroup outside this namespace's view: the mount's own
        relative = ""
    directory = Path(point) / relative
    tightest: float | None = None
    while True:
        try:
            if version == 2:
                cpus = quota_v2((directory / "cpu.max").read_text())
            else:
                cpus = quota_v1((directory / "cpu.cfs_quota_us").read_text(),
                                (directory / "cpu.cfs_period_us").read_text())  # fmt: skip
        except (OSError, ValueError):
            cpus = None
        if cpus is not None and (tightest is None or cpus < tightest):
            tightest = cpus
        if directory == Path(point) or directory.parent == directory:
            return tightest
        directory = directory.parent


def available_cpus() -> int:
    """The CPUs this process may use: its CPU affinity, within its cgroup's quota (rounded
    down, as Ray and Go's automaxprocs do), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpus()
    if quota is not None:
        cores = min(cores, math.floor(quota))
    return max(1, cores)


# -- the learner's threads ---------------------------------------------------------------------


def _from_environment(environ: Mapping[str, str]) -> int | None:
    value = environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return None


def pod_learner_threads(
    resources: Resources, environ: Mapping[str, str] = os.environ, cpus: int | None = None
) -> tuple[int, str]:
    """The learner pod's intra-op threads, and why (for its log)."""
    pinned = _from_environment(environ)
    if pinned is not None:
        return pinned, "OMP_NUM_THREADS"
    cpus = available_cpus() if cpus is None else cpus
    reserved = reserved_cpus(resources)
    if reserved is None:
        return 1, f"learner.resources has no CPU request; {_usable(cpus)}"
    threads = max(1, min(cpus, math.floor(reserved)))
    return threads, f"the learner's CPU request {reserved:g}; {_usable(cpus)}"


def local_learner_threads(
    actors: int,
    environ: Mapping[str, str] = os.environ,
    cpus: int | None = None,
    *,
    learners: int = 1,
) -> tuple[int, str]:
    """`impalajob train`'s intra-op threads per learner, and why: the actors and the
    `learner.replicas` learners share this machine, and a team beyond the cores they leave free
    only contends (a CartPole update is several times slower with 2 threads on a busy 2-core
    box). A learner pod has its own CPUs (`pod_learner_threads`)."""
    pinned = _from_environment(environ)
    if pinned is not None:
        return pinned, "OMP_NUM_THREADS"
    cpus = available_cpus() if cpus is None else cpus
    why = f"{_usable(cpus)}, {actors} actors beside the learner"
    if learners > 1:
        why += f", shared by {learners} learners"
    return max(1, (cpus - actors) // learners), why


def _usable(cpus: int) -> str:
    return f"{cpus} CPU{'' if cpus == 1 else 's'} usable"


def set_learner_threads(threads: int, why: str) -> None:
    """Give the process (and so its learner thread) `threads` intra-op threads."""
    import torch

    torch.set_num_threads(threads)
    logger.info("learner: %d intra-op thread%s (%s)", threads, "" if threads == 1 else "s", why)
