"""pyproject.toml's lower bounds are what the code needs: the unit tests pass with the lowest
versions it allows of every direct dependency (`uv pip compile --resolution lowest-direct`),
torch and Ray held at the lock's (Ray is pinned; torch's lowest would be gigabytes more to fetch).

The lowest versions are installed into a directory of their own (cached by their pins) that goes
first on PYTHONPATH, so they shadow this environment's packages and nothing here changes.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from harness.cache import cache_root

ROOT = Path(__file__).resolve().parents[2]
CACHE = cache_root()
HEAVY = re.compile(r"^(torch|ray|triton|nvidia-[a-z0-9-]+)==", re.MULTILINE)
"""Held at the lock's versions: the same wheels the environment already has."""

pytestmark = [pytest.mark.slow]


def _lowest_pins(tmp_path: Path) -> list[str]:
    heavy = tmp_path / "heavy.txt"
    lock = (ROOT / "requirements" / "runtime.lock").read_text()
    held = (f"{m.group(0)}{_version(lock, m.end())}" for m in HEAVY.finditer(lock))
    heavy.write_text("\n".join(held) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "uv", "pip", "compile", "--quiet", "pyproject.toml",
         "--resolution", "lowest-direct", "--python-version", "3.11",
         "--python-platform", "x86_64-manylinux_2_28", "-c", str(heavy),
         "--no-header", "--no-annotate"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=True,
    ).stdout  # fmt: skip
    return [line.strip() for line in out.splitlines() if "==" in line]


def _version(text: str, start: int) -> str:
    return re.match(r"[^\s\\;]+", text[start:]).group(0)  # type: ignore[union-attr]


def _differing(pins: list[str]) -> list[str]:
    """The pins this environment does not already have."""
    wanted = []
    for pin in pins:
        name, version = pin.split("==")
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have != version and not HEAVY.match(pin):
            wanted.append(pin)
    return wanted


def test_the_unit_tests_pass_at_the_lowest_versions_pyproject_allows(tmp_path: Path) -> None:
    pins = _lowest_pins(tmp_path)
    lowest = dict(pin.split("==") for pin in pins)
    # What the bounds say, resolved: the oldest kubernetes with ApiClient.param_serialize, the
    # oldest kopf with label selectors on its watches, the oldest FastAPI allowed.
    oldest = (lowest["kubernetes"], lowest["kopf"], lowest["fastapi"])
    assert oldest == ("37.0.0", "1.45.0", "0.115.0"), oldest
    wanted = _differing(pins)
    key = hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:16]
    target = CACHE / "lowest" / key
    if not (target / ".complete").exists():
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--no-deps", "--target", str(target), *wanted],
            check=True, timeout=900,
        )  # fmt: skip
        (target / ".complete").touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)])}
    shown = subprocess.run(
        [sys.executable, "-c", "import kubernetes, kopf, fastapi, pydantic; "
         "print(kubernetes.__version__, fastapi.__version__, pydantic.VERSION)"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()  # fmt: skip
    assert shown == [lowest["kubernetes"], lowest["fastapi"], lowest["pydantic"]], shown
    # Not the check that this environment runs the lock's versions: here it deliberately does not.
    locked_here = "tests/unit/test_lock.py::test_this_environment_runs_the_locked_versions"
    # The fast unit set: the slow unit tests (the policy-lag loop, the ONNX export) exercise
    # torch, which is the lock's here too, and run at the lock's versions in the session itself.
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/unit",
         "-m", "not slow", "--deselect", locked_here],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, f"at {sorted(wanted)}:\n{proc.stdout[-6000:]}{proc.stderr[-2000:]}"
