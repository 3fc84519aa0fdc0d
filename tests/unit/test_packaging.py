"""Every data file the packages read at run time is declared as package data, so the wheel (and
the image built from it) has it: an editable install would hide a missing pattern."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_non_python_file_of_the_packages_ships_in_the_wheel() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_data: dict[str, list[str]] = config["tool"]["setuptools"]["package-data"]
    roots = {"impala_trainer": ROOT / "trainer" / "impala_trainer",
             "impala_operator": ROOT / "operator" / "impala_operator"}
    missing = []
    for package, root in roots.items():
        patterns = package_data.get(package, [])
        for path in root.rglob("*"):
            if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root).as_posix()
            if not any(fnmatch.fnmatch(rel, p) for p in patterns):
                missing.append(f"{package}/{rel}")
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
