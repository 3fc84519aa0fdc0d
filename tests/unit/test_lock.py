"""The lock files (hack/lock.sh) agree with pyproject.toml and with each other, the image installs
from the hashed one, and the test environment runs the locked versions: what the tests test is
what the image ships."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
RUNTIME, DEV = ROOT / "requirements" / "runtime.lock", ROOT / "requirements" / "dev.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", re.MULTILINE)
REGENERATE = "run `bash hack/lock.sh` and commit requirements/"


def pins(path: Path) -> dict[str, str]:
    return {canonicalize_name(name): version for name, version in PIN.findall(path.read_text())}


def project() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project: dict[str, Any] = config["project"]
    return project


def test_every_dependency_is_locked_at_a_version_pyproject_allows() -> None:
    deps = project()["dependencies"]
    extras = project()["optional-dependencies"]
    for lock, reqs in ((RUNTIME, deps), (DEV, [*deps, *extras["dev"], *extras["export"]])):
        locked = pins(lock)
        for text in reqs:
            req = Requirement(text)
            if canonicalize_name(req.name) == "impalajob":
                continue  # the project's own extras, listed above
            name = canonicalize_name(req.name)
            assert name in locked, f"{req.name} is not in {lock.name}: {REGENERATE}"
            assert req.specifier.contains(locked[name], prereleases=True), (
                f"{lock.name} pins {req.name}=={locked[name]}, outside {req.specifier}: "
                f"{REGENERATE}"
            )


def test_the_dev_lock_runs_the_runtime_versions() -> None:
    runtime, dev = pins(RUNTIME), pins(DEV)
    assert len(runtime) > 50, "the runtime lock lost its pins"
    differ = {n: (v, dev.get(n)) for n, v in runtime.items() if dev.get(n) != v}
    assert not differ, f"dev.lock differs from runtime.lock (runtime, dev): {differ}; {REGENERATE}"


def test_every_runtime_pin_is_hashed_and_the_image_requires_the_hashes() -> None:
    blocks = re.split(r"\n(?=[A-Za-z0-9])", RUNTIME.read_text().split("\n", 2)[2])
    unhashed = [b.split("==")[0] for b in blocks if "==" in b and "--hash=sha256:" not in b]
    assert not unhashed, f"pins without hashes in runtime.lock: {unhashed}; {REGENERATE}"
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--require-hashes" in dockerfile and "requirements/runtime.lock" in dockerfile
    assert "requirements/runtime.lock" in (ROOT / ".dockerignore").read_text()


def test_this_environment_runs_the_locked_versions() -> None:
    """tests/run.sh installs with the dev lock as constraints; a package at another version here
    means the tests did not test what the image ships."""
    locked = pins(DEV)
    names = [Requirement(r).name for r in project()["dependencies"]]
    installed = {canonicalize_name(n): importlib.metadata.version(n) for n in names}
    differ = {n: (v, locked[n]) for n, v in installed.items() if locked.get(n) != v}
    assert not differ, (
        f"installed versions differ from requirements/dev.lock (installed, locked): {differ}; "
        "install with `pip install -e '.[dev]' -c requirements/dev.lock`"
    )
