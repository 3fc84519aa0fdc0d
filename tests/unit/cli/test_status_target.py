"""`impalajob status NAME`: which status URLs go through the API server's Service proxy."""

from __future__ import annotations

import pytest

from impala_cli.commands.status_transport import StatusCommandError, is_service_url, service_of


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://cartpole-status.team-a.svc:8080", ("team-a", "cartpole-status", 8080)),
        (
            "http://cartpole-status.team-a.svc.cluster.local:8080/",
            ("team-a", "cartpole-status", 8080),
        ),
        ("http://s.ns.svc", ("ns", "s", 80)),
    ],
)
def test_service_urls_name_namespace_service_and_port(
    url: str, expected: tuple[str, str, int]
) -> None:
    assert is_service_url(url)
    assert service_of(url) == expected


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8080", "http://status.example.com:8080", "http://a.b:80", "http://svc:1"],
)
def test_other_urls_are_fetched_directly(url: str) -> None:
    assert not is_service_url(url)
    with pytest.raises(StatusCommandError, match="not a Service address"):
        service_of(url)
