"""`impalajob operator`'s flags: `--log-level` (the status sidecar's word and choices) and what
each level does to the loggers; no cluster, kopf's own configure() stubbed."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from impala_cli.commands import LOG_LEVELS, status_server
from impala_cli.commands import operator as operator_command
from impala_cli.main import main
from impala_operator.runtime import runner

LOGGERS = ("", "httpx", "impala_operator", "kopf.objects")


def _parser(register: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="impalajob")
    register(parser)
    return parser


def _log_levels(parser: argparse.ArgumentParser) -> list[str]:
    (action,) = [a for a in parser._actions if "--log-level" in a.option_strings]
    return list(action.choices or [])


@pytest.fixture
def kopf_configure(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """kopf.configure's calls (its handlers stay off the test's root logger); the levels of the
    loggers configure_logging sets are put back afterwards."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(runner.kopf, "configure", lambda **kw: calls.append(kw))
    levels = {name: logging.getLogger(name).level for name in LOGGERS}
    yield calls
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_log_level_has_the_status_servers_choices_and_defaults_to_info() -> None:
    parser = _parser(operator_command.register)
    assert _log_levels(parser) == ["critical", "error", "warning", "info", "debug"]
    assert _log_levels(parser) == _log_levels(_parser(status_server.register)) == list(LOG_LEVELS)
    assert list(runner.LOG_LEVELS) == list(LOG_LEVELS)
    assert parser.parse_args([]).log_level == "info"
    assert parser.parse_args(["--log-level", "debug"]).log_level == "debug"


def test_unknown_levels_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["operator", "--log-level", "trace"])
    assert exc.value.code == 2
    assert "impalajob operator: error: argument --log-level: invalid choice: 'trace'" in (
        capsys.readouterr().err
    )


def test_run_hands_the_level_to_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(runner, "serve", lambda settings, *, log_level: seen.append(log_level))
    monkeypatch.delenv("IMPALA_OPERATOR_NAMESPACES", raising=False)
    assert main(["operator", "-n", "team-a", "--log-level", "debug"]) == 0
    assert main(["operator", "-n", "team-a"]) == 0
    assert seen == ["debug", "info"]


def test_debug_is_what_verbose_was(kopf_configure: list[dict[str, Any]]) -> None:
    runner.configure_logging("debug")
    assert kopf_configure == [{"verbose": True}]  # kopf's verbose mode
    assert logging.getLogger().level == logging.DEBUG
    # Every handler run's line ("Handler ... succeeded") comes through.
    assert logging.getLogger("kopf.objects").getEffectiveLevel() == logging.DEBUG
    assert logging.getLogger("httpx").level == logging.WARNING
    assert logging.getLogger("impala_operator").level == logging.INFO


def test_info_keeps_kopfs_per_handler_lines_out(kopf_configure: list[dict[str, Any]]) -> None:
    runner.configure_logging()  # the default, as the operator ran without --verbose
    assert kopf_configure == [{"verbose": False}]
    assert logging.getLogger().level == logging.INFO
    assert logging.getLogger("kopf.objects").level == logging.WARNING
    assert logging.getLogger("httpx").level == logging.WARNING
    assert logging.getLogger("impala_operator").level == logging.INFO


@pytest.mark.parametrize("level", ["warning", "error", "critical"])
def test_quieter_levels_quiet_every_logger(
    level: str, kopf_configure: list[dict[str, Any]]
) -> None:
    runner.configure_logging(level)
    expected = getattr(logging, level.upper())
    for name in LOGGERS:
        assert logging.getLogger(name).level == expected, name


def test_unknown_level_is_a_value_error(kopf_configure: list[dict[str, Any]]) -> None:
    with pytest.raises(ValueError, match="unknown log level 'trace'"):
        runner.configure_logging("trace")
    assert kopf_configure == []
