"""/status: the latest snapshot, the end-of-run summary, and the snapshot's age."""

from __future__ import annotations

from fastapi import APIRouter, Response

from impala_trainer.sidecar.deps import SidecarDep
from impala_trainer.sidecar.models import ERRORS_401, ERRORS_503, StatusResponse
from impala_trainer.sidecar.routers.health import snapshot_age

router = APIRouter(tags=["status"])


@router.get("/status", response_model=StatusResponse, responses={**ERRORS_401, **ERRORS_503})
async def get_status(sidecar: SidecarDep) -> Response:
    """Phase, counters, returns, throughput, learner stats, timings, queue, membership,
    checkpoint and stop progress, as of the trainer's latest snapshot."""
    reader = sidecar.reader
    snap = reader.status.read()
    summary = reader.summary_or_none()
    # The body only changes when a file does: serialise once per file version and splice in the
    # age, which changes every request. This keeps /status at a stat() and a bytes concat.
    key = (reader.status.key, reader.summary.key)
    if sidecar.status_body is None or sidecar.status_body[0] != key:
        body = StatusResponse.model_validate(
            {**snap.model_dump(), "summary": summary}
        ).model_dump_json(exclude={"age_seconds"})
        sidecar.status_body = (key, body.encode())
    age = snapshot_age(snap.updated_at, reader.status.mtime)
    cached = sidecar.status_body[1]
    return Response(
        b'{"age_seconds":' + f"{age:.3f}".encode() + b"," + cached[1:],
        media_type="application/json",
    )
