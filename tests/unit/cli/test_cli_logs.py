"""`impalajob logs`: its flags, and which pods' logs it prints (the API calls are e2e-tested on
the real node)."""

from __future__ import annotations

from typing import Any

import pytest

from impala_api import names
from impala_cli.commands.logs import select_pods
from impala_cli.main import main


def _pod(name: str, attempt: int | None = None) -> dict[str, Any]:
    labels = {} if attempt is None else {names.RESTART_KEY: str(attempt)}
    return {"metadata": {"name": name, "labels": labels}}


def test_learner_logs_are_the_current_attempts_or_the_one_before() -> None:
    # Attempt 10 sorts after 9 by number, not by name.
    pods = [_pod("j-learner-9", 9), _pod("j-learner-10", 10), _pod("j-learner-8", 8)]
    assert [p["metadata"]["name"] for p in select_pods(pods, "learner", False)] == [
        "j-learner-10"
    ]
    assert [p["metadata"]["name"] for p in select_pods(pods, "status", True)] == ["j-learner-9"]
    assert select_pods([_pod("j-learner-0", 0)], "learner", True) == []


def test_group_logs_are_every_pod_by_name() -> None:
    pods = [_pod("j-rollout-b"), _pod("j-rollout-a")]
    assert [p["metadata"]["name"] for p in select_pods(pods, "rollout", False)] == [
        "j-rollout-a",
        "j-rollout-b",
    ]


def test_follow_has_no_short_form_but_parses_long(monkeypatch: pytest.MonkeyPatch) -> None:
    from impala_cli.commands import logs

    seen: list[bool] = []
    monkeypatch.setattr(logs, "run", lambda args: seen.append(args.follow) or 0)
    assert main(["logs", "cartpole", "--follow", "--role", "rollout"]) == 0
    assert main(["logs", "cartpole"]) == 0
    assert seen == [True, False]
    with pytest.raises(SystemExit) as refused:  # -f is --file in every other command
        main(["logs", "cartpole", "-f"])
    assert refused.value.code == 2
