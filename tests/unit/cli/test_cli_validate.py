"""`impalajob validate`: exit 0 and one success line for a good manifest; exit 2 and field-naming
lines (never the success line) for a bad one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.jobs import job_manifest

EXAMPLE = "manifests/examples/cartpole.yaml"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "impala_cli.main", *args],
                          capture_output=True, text=True, timeout=60)


def test_validate_accepts_example() -> None:
    res = _run("validate", "-f", EXAMPLE)
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"{EXAMPLE}: ImpalaJob cartpole is valid\n"
    assert res.stderr == ""


def test_validate_rejects_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(job_manifest("b", training={"numSgdIter": 0})))
    res = _run("validate", "-f", str(bad))
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "is valid" not in res.stdout
    assert "spec.training.numSgdIter" in res.stderr


def test_cli_does_not_import_torch_for_light_commands() -> None:
    code = ("import sys; from impala_cli.main import main; "
            f"assert main(['validate', '-f', {EXAMPLE!r}]) == 0; "
            "assert 'torch' not in sys.modules and 'ray' not in sys.modules")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
