"""`impalajob evaluate` and `impalajob export` refuse bad input with exit 2 and one line naming
the file or flag, before any work: no run directory or job, a directory without a checkpoint, an
unknown format, an output or video directory that cannot be written."""

from __future__ import annotations

from pathlib import Path

import pytest

from impala_cli.main import main
from impala_trainer.rundir.writer import RunDir
from tests.support.jobs import make_job


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse's own refusals
        code = int(exit_.code or 0)
    return code, capsys.readouterr().err.strip()


def test_bad_input_is_refused_with_exit_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    RunDir(run).prepare(make_job("fresh", env={"id": "CartPole-v1"}))
    code, err = _run(capsys, "evaluate", "--run-dir", str(run))
    assert code == 2 and f"{run} has no checkpoint yet" in err
    code, err = _run(capsys, "evaluate", "--run-dir", str(tmp_path / "nothing"))
    assert code == 2 and "is not a run directory: it has no config.yaml" in err
    code, err = _run(capsys, "export", "--run-dir", str(run), "--format", "savedmodel", "-o", "x")
    assert code == 2 and "invalid choice: 'savedmodel'" in err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "policy.onnx"
    code, err = _run(capsys, "export", "--run-dir", str(run), "--format", "torchscript",
                     "-o", str(out))  # fmt: skip
    assert code == 2 and f"-o {out} cannot be written" in err
    code, err = _run(capsys, "evaluate", "--run-dir", str(run), "--video", str(blocker / "v"))
    assert code == 2 and f"--video {blocker / 'v'} cannot be written" in err
    code, err = _run(capsys, "evaluate", "cartpole", "--run-dir", str(run))
    assert code == 2 and "one of them" in err
