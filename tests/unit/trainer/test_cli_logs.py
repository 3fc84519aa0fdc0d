"""`impalajob logs`: which pods' logs it prints (the API calls are e2e-tested on the real node)."""

from __future__ import annotations

from typing import Any

from impala_api import names
from impala_cli.commands.logs import RESTART_LABEL, select_pods


def _pod(name: str, attempt: int | None = None) -> dict[str, Any]:
    labels = {} if attempt is None else {RESTART_LABEL: str(attempt)}
    return {"metadata": {"name": name, "labels": labels}}


def test_learner_logs_are_the_current_attempts_or_the_one_before() -> None:
    assert RESTART_LABEL == names.RESTART_KEY  # the label the operator writes
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
