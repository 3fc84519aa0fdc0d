"""Leader election's hand-over: a leader that stops releases its Lease, and a standby takes it
at its next poll instead of after `duration` (client-go's ReleaseOnCancel)."""

from __future__ import annotations

import itertools
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from impala_operator.runtime import leader as leader_module
from impala_operator.runtime.leader import LeaderElection


class FakeLeases:
    """CoordinationV1Api's three Lease calls over one stored Lease, with resourceVersion."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    def read_namespaced_lease(self, name: str, namespace: str) -> Any:
        if self.lease is None:
            raise ApiException(status=404)
        spec = self.lease["spec"]
        return SimpleNamespace(
            metadata=SimpleNamespace(resource_version=str(self.version)),
            spec=SimpleNamespace(
                holder_identity=spec.get("holderIdentity"),
                renew_time=None,
                lease_duration_seconds=spec.get("leaseDurationSeconds"),
                lease_transitions=spec.get("leaseTransitions"),
            ),
        )

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any]) -> None:
        self.lease, self.version = body, 1

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        if body["metadata"].get("resourceVersion") != str(self.version):
            raise ApiException(status=409)
        self.lease, self.version = body, self.version + 1


def _election(leases: FakeLeases, identity: str) -> LeaderElection:
    election = LeaderElection(None, "ns", "impala-operator", identity, duration=15.0)
    election._api = leases  # type: ignore[assignment]
    return election


def test_a_released_lease_is_taken_at_once_by_a_standby() -> None:
    leases = FakeLeases()
    leader, standby = _election(leases, "a"), _election(leases, "b")
    assert leader.try_acquire_or_renew()
    assert not standby.try_acquire_or_renew()  # held and fresh: the standby waits
    assert leader.release()
    assert leases.lease is not None and leases.lease["spec"]["holderIdentity"] == ""
    assert standby.try_acquire_or_renew()  # no 15 s wait for the lease to lapse
    assert leases.lease["spec"]["holderIdentity"] == "b"


def test_only_the_holder_releases() -> None:
    leases = FakeLeases()
    leader, standby = _election(leases, "a"), _election(leases, "b")
    assert leader.try_acquire_or_renew()
    assert not standby.release()
    assert leases.lease is not None and leases.lease["spec"]["holderIdentity"] == "a"
    assert not _election(FakeLeases(), "c").release()  # no Lease at all


class Outage(FakeLeases):
    """The API server unreachable for the first `failures` calls (what urllib3 raises)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def read_namespaced_lease(self, name: str, namespace: str) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise OSError("Connection refused")
        return super().read_namespaced_lease(name, namespace)


def test_a_standby_waits_out_an_api_outage_instead_of_exiting() -> None:
    # Both replicas once restarted on every API server restart: the standby's poll raised.
    leases = Outage(failures=3)
    standby = _election(leases, "b")
    standby.retry_every = 0.01
    assert standby.acquire()
    assert leases.lease is not None and leases.lease["spec"]["holderIdentity"] == "b"


def test_a_leader_stops_at_the_renew_deadline_before_a_standby_may_take_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leases = Outage(failures=0)
    leader = _election(leases, "a")
    leader.renew_every = 0.001
    assert leader.acquire()
    leases.failures = 10**6  # the API goes away for good
    # The leader's clock, one second per reading: the deadline is checked without wall time.
    ticks = itertools.count()
    monkeypatch.setattr(
        leader_module, "time", SimpleNamespace(monotonic=lambda: float(next(ticks)), time=time.time)
    )
    lost_at: list[float] = []
    done = threading.Event()
    leader.keep(lambda: (lost_at.append(leader_module.time.monotonic()), done.set()),
                threading.Event())  # fmt: skip
    assert done.wait(10)
    # client-go's 10 of 15 s: the leader gives up at 2/3 of the Lease's duration, so a standby
    # (which waits the whole duration from the last renewal it saw) never overlaps it.
    assert 10 <= lost_at[0] < 15
