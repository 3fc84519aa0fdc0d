"""The contract packages stay light: the operator, the CRD generator and `impalajob validate`
import them, and must not pay for (or depend on) torch and Ray."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "ray", "gymnasium")

LIGHT = [
    "impala_api",
    "impala_api.spec",
    "impala_api.manifest",
    "impala_api.roles",
    "impala_api.snapshot",
    "impala_cli.main",
    "impala_cli.commands",
    "impala_cli.commands.status",
    "impala_cli.commands.crd",
    "impala_api.crd",
    "impala_operator.runtime.handlers",
    "impala_operator.runtime.runner",
    "impala_trainer.sidecar.app",
]


@pytest.mark.parametrize("module", LIGHT)
def test_module_loads_neither_torch_nor_ray(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    assert out == "", f"importing {module} loaded {out}"
