"""Kubernetes conditions (metav1.Condition) and the API's timestamps, for every status the
operator writes: the ImpalaJob's and its Kueue Workload's."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

MAX_MESSAGE = 32768
"""metav1.Condition's longest message; a longer one is cut."""


def rfc3339(t: float) -> str:
    """Unix seconds as the API's timestamp format (UTC, second precision)."""
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> float | None:
    """An API timestamp (RFC 3339) as unix seconds; None stays None."""
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: float,
    generation: int | None = None,
) -> tuple[dict[str, Any], ...]:
    """Conditions with `type_` set, where it was (else appended); lastTransitionTime moves only
    when the status flips. The message is cut to MAX_MESSAGE; `observedGeneration` is set when
    `generation` is given (the ImpalaJob's conditions get theirs all at once, `stamp_conditions`).
    """
    value = "True" if status else "False"
    out: list[dict[str, Any]] = []
    found = False
    for cond in conditions:
        if cond.get("type") != type_:
            out.append(dict(cond))
            continue
        found = True
        changed = cond.get("status") != value
        stamp = rfc3339(now) if changed else cond.get("lastTransitionTime", rfc3339(now))
        out.append(_condition(type_, value, reason, message, stamp, generation))
    if not found:
        out.append(_condition(type_, value, reason, message, rfc3339(now), generation))
    return tuple(out)


def _condition(
    type_: str, value: str, reason: str, message: str, stamp: str, generation: int | None
) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "lastTransitionTime": stamp,
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def stamp_conditions(
    conditions: Sequence[Mapping[str, Any]], generation: int | None
) -> list[dict[str, Any]]:
    """Conditions with `observedGeneration` (metav1.Condition's), when a generation is known."""
    if generation is None:
        return [dict(c) for c in conditions]
    return [{**c, "observedGeneration": generation} for c in conditions]
