"""`impalajob evaluate` and `impalajob export` refuse bad input with exit 2 and one line naming
the file or flag, before any work: no run directory or job, a directory without a checkpoint, an
unknown format, an output or video directory that cannot be written, an env module that is not
importable here (and a failed export leaves no output file behind)."""

from __future__ import annotations

from pathlib import Path

import pytest

from impala_cli.main import main
from impala_trainer.rundir.writer import RunDir
from tests.support.jobs import make_job
from tests.support.run_dirs import checkpointed_run_dir


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


def test_game_flags_on_a_single_agent_run_are_refused_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = checkpointed_run_dir(tmp_path / "run", make_job("solo", env={"id": "CartPole-v1"}))
    code, err = _run(capsys, "evaluate", "--run-dir", str(run), "--opening", "2")
    assert code == 2 and "error: --opening: only a multi-agent run" in err, err
    code, err = _run(capsys, "evaluate", "--run-dir", str(run), "--opponent", "main")
    assert code == 2 and "error: --opponent: only a multi-agent run" in err, err


def test_a_job_whose_env_module_is_not_importable_here_is_one_line_and_leaves_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = checkpointed_run_dir(tmp_path / "run", make_job("mine", env={"id": "CartPole-v1"}))
    config = run / "config.yaml"  # as a job trained with its own env package leaves it
    config.write_text(config.read_text().replace("CartPole-v1", "not_here_envs:CartPole-v1"))
    code, err = _run(capsys, "evaluate", "--run-dir", str(run), "--episodes", "1")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "cannot import module 'not_here_envs'" in err and "PYTHONPATH" in err
    out = tmp_path / "out" / "policy.pt"
    code, err = _run(capsys, "export", "--run-dir", str(run), "--format", "torchscript",
                     "-o", str(out))  # fmt: skip
    assert code == 2 and len(err.splitlines()) == 1 and "not_here_envs" in err, err
    assert not out.exists(), "a failed export left its output file behind"
