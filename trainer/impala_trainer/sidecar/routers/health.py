"""/healthz (the process is alive) and /readyz (there is a fresh snapshot to serve)."""

from __future__ import annotations

import time

from fastapi import APIRouter

from impala_trainer.rundir.reader import SnapshotError
from impala_trainer.sidecar.deps import ReaderDep, SettingsDep
from impala_trainer.sidecar.models import (
    ERRORS_503,
    HealthResponse,
    ReadyResponse,
)

# Finished runs stop writing snapshots; their last one stays valid, so age does not apply.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed", "Stopped"})

open_router = APIRouter(tags=["health"])
"""Never behind the token: the kubelet's liveness and readiness probes cannot send one without
writing it into the pod spec. /readyz tells only the phase and the snapshot's age."""


@open_router.get("/healthz", response_model=HealthResponse)
async def healthz() -> HealthResponse:
    """The sidecar process is up; says nothing about the run."""
    return HealthResponse()


@open_router.get("/readyz", response_model=ReadyResponse, responses=ERRORS_503)
async def readyz(reader: ReaderDep, settings: SettingsDep) -> ReadyResponse:
    """Ready when status.json is readable and, while the run is live, fresh enough."""
    snap = reader.status.read()
    age = snapshot_age(snap.updated_at, reader.status.mtime)
    if snap.phase not in TERMINAL_PHASES and age > settings.ready_max_age_seconds:
        raise SnapshotError(
            "stale",
            reader.status.name,
            f"the {snap.phase} run's snapshot is {age:.0f} s old (limit "
            f"{settings.ready_max_age_seconds:g} s): is the trainer still writing it?",
        )
    return ReadyResponse(
        phase=snap.phase, age_seconds=round(age, 3), max_age_seconds=settings.ready_max_age_seconds
    )


def snapshot_age(updated_at: float, mtime: float) -> float:
    """Seconds since the snapshot was written: its own timestamp, else the file's mtime."""
    return max(0.0, time.time() - (updated_at or mtime))
