"""The contract packages stay light: the operator, the CRD generator and `impalajob validate`
import them, and must not pay for (or depend on) torch and Ray."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "ray", "gymnasium")

LIGHT = [
    "impala_trainer.job",
    "impala_trainer.job.spec",
    "impala_trainer.job.manifest",
    "impala_trainer.job.roles",
    "impala_trainer.rundir.snapshot",
    "impala_trainer.cli",
    "impala_trainer.commands",
    "impala_trainer.commands.status",
    "impala_trainer.commands.crd",
    "impala_operator.crd",
    "impala_operator.handlers",
    "impala_operator.runner",
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
