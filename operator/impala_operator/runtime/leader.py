"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it.

Several operator replicas may run; only the one holding the Lease reconciles. A standby polls the
Lease and takes it over once its record has not changed for `duration` seconds of the standby's
own clock (so clocks need not agree). The holder renews every `renew_every` seconds; if it cannot
renew for 2/3 of `duration` it stops leading: the process exits and the kubelet restarts it as a
standby, which is client-go's convention too (half-done work is safe: every reconcile is
level-based and idempotent). Takeover after a crash therefore takes about `duration` seconds.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


def _micro_time(t: float) -> str:
    """A Lease's MicroTime (RFC 3339 with microseconds, UTC)."""
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Record:
    """What a Lease says, as far as election goes."""

    holder: str
    renew_time: str
    duration: int
    transitions: int
    resource_version: str


class LeaderElection:
    """Acquire and keep Lease `namespace/name` as `identity`."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        name: str,
        identity: str,
        *,
        duration: float = 15.0,
        renew_every: float = 5.0,
        retry_every: float = 2.0,
    ) -> None:
        from kubernetes import client

        self._api = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration, self.renew_every, self.retry_every = duration, renew_every, retry_every
        self._observed: Record | None = None
        self._observed_at = 0.0  # monotonic time the observed record last changed

    def _read(self) -> Record | None:
        from kubernetes.client.exceptions import ApiException

        try:
            lease = self._api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        spec = lease.spec
        renew = spec.renew_time.isoformat() if spec.renew_time is not None else ""
        return Record(
            holder=spec.holder_identity or "",
            renew_time=renew,
            duration=int(spec.lease_duration_seconds or self.duration),
            transitions=int(spec.lease_transitions or 0),
            resource_version=lease.metadata.resource_version,
        )

    def _body(self, now: float, transitions: int, acquire: bool, version: str | None) -> Any:
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }
        if acquire:
            spec["acquireTime"] = _micro_time(now)
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if version is not None:
            meta["resourceVersion"] = version  # optimistic concurrency: one writer wins
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": spec}  # fmt: skip

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this identity holds the Lease afterwards."""
        from kubernetes.client.exceptions import ApiException

        record, now, mono = self._read(), time.time(), time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, mono
        try:
            if record is None:
                self._api.create_namespaced_lease(self.namespace, self._body(now, 0, True, None))
            elif record.holder == self.identity:
                body = self._body(now, record.transitions, False, record.resource_version)
                self._api.replace_namespaced_lease(self.name, self.namespace, body)
            elif not record.holder or mono - self._observed_at >= record.duration:
                body = self._body(now, record.transitions + 1, True, record.resource_version)
                self._api.replace_namespaced_lease(self.name, self.namespace, body)
                log.info("took over lease %s/%s from %r", self.namespace, self.name, record.holder)
            else:
                return False
        except ApiException as err:
            if err.status in (409, 422):  # another replica wrote first
                return False
            raise
        return True

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Block until this identity leads (True), or `stop` is set (False)."""
        waiting_logged = failing = False
        while stop is None or not stop.is_set():
            try:
                acquired = self.try_acquire_or_renew()
            except Exception as err:  # an API outage: a standby waits it out
                # It once let the exception end the process: both replicas restarted on every
                # API server restart. client-go's standby keeps polling too.
                if not failing:
                    log.warning("lease %s/%s unreadable (%s); retrying", self.namespace,
                                self.name, err)  # fmt: skip
                failing, acquired = True, False
            else:
                failing = False
            if acquired:
                log.info("leading as %s (lease %s/%s)", self.identity, self.namespace, self.name)
                return True
            if not waiting_logged and self._observed is not None:
                log.info("standing by: lease %s/%s is held by %s", self.namespace, self.name,
                         self._observed.holder)  # fmt: skip
                waiting_logged = True
            time.sleep(self.retry_every)
        return False

    def release(self) -> bool:
        """Give the Lease up now (client-go's ReleaseOnCancel): an empty holder that a standby
        takes at its next poll instead of waiting `duration` for it to lapse. True if released."""
        from kubernetes.client.exceptions import ApiException

        try:
            record = self._read()
            if record is None or record.holder != self.identity:
                return False
            body = self._body(time.time(), record.transitions, False, record.resource_version)
            body["spec"].update(holderIdentity="", leaseDurationSeconds=1)
            self._api.replace_namespaced_lease(self.name, self.namespace, body)
        except (ApiException, OSError) as err:  # the API is gone: the Lease lapses instead
            log.warning("releasing lease %s/%s: %s", self.namespace, self.name, err)
            return False
        log.info("released lease %s/%s", self.namespace, self.name)
        return True

    def keep(self, on_lost: Callable[[], None], stop: threading.Event) -> threading.Thread:
        """Renew in a daemon thread; `on_lost()` once renewing has failed for the renew deadline
        (2/3 of `duration`, client-go's 10 of 15 s): the leader stops before a standby, which
        waits the whole `duration`, can take over, so two never lead at once."""
        deadline = self.duration * 2 / 3

        def loop() -> None:
            last_ok = time.monotonic()
            while not stop.wait(self.renew_every):
                try:
                    if self.try_acquire_or_renew():
                        last_ok = time.monotonic()
                        continue
                except Exception:  # an API outage: keep trying until the lease would lapse
                    log.exception("renewing lease %s/%s", self.namespace, self.name)
                if time.monotonic() - last_ok >= deadline:
                    log.error("lost lease %s/%s", self.namespace, self.name)
                    on_lost()
                    return

        thread = threading.Thread(target=loop, name="leader-election", daemon=True)
        thread.start()
        return thread
