"""`impalajob validate`: exit 2 and field-naming lines for a bad manifest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "impala_trainer.cli", *args],
                          capture_output=True, text=True, timeout=60)


def test_validate_accepts_example() -> None:
    res = _run("validate", "-f", "manifests/examples/cartpole.yaml")
    assert res.returncode == 0, res.stderr
    assert "valid" in res.stdout


def test_validate_rejects_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: impala.dev/v1alpha1\nkind: ImpalaJob\nmetadata: {name: b}\n"
                   "spec: {training: {numSgdIter: 0}}\n")
    res = _run("validate", "-f", str(bad))
    assert res.returncode == 2
    assert "spec.training.numSgdIter" in res.stderr and "got 0" in res.stderr


def test_cli_does_not_import_torch_for_light_commands() -> None:
    code = ("import sys; from impala_trainer.cli import main; "
            "main(['validate', '-f', 'manifests/examples/cartpole.yaml']); "
            "assert 'torch' not in sys.modules and 'ray' not in sys.modules")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
