"""Per-job tokens: derived from the operator's key and the job's uid, never stored by it."""

from __future__ import annotations

from impala_operator.build.tokens import job_tokens


def test_tokens_are_per_job_per_purpose_and_stable() -> None:
    key = b"k" * 32
    first = job_tokens(key, "uid-1")
    assert first == job_tokens(key, "uid-1")  # every replica, every restart: the same
    assert first.status != first.ray
    again = job_tokens(key, "uid-2")  # a new job of the same name has a new uid
    assert {again.status, again.ray}.isdisjoint({first.status, first.ray})
    assert job_tokens(b"j" * 32, "uid-1") != first  # a new key rotates every job's tokens
    assert len(first.status) == 64 and int(first.status, 16) >= 0
