"""/history: the time series behind the dashboard plots, bounded however long the run."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from impala_trainer.rundir.reader import SnapshotError, downsample
from impala_trainer.sidecar.deps import ReaderDep, SettingsDep
from impala_trainer.sidecar.models import ERRORS_401, ERRORS_422, ERRORS_503, HistoryResponse

router = APIRouter(tags=["history"])

MAX_LIMIT = 100_000


@router.get(
    "/history",
    response_model=HistoryResponse,
    responses={**ERRORS_401, **ERRORS_422, **ERRORS_503},
)
async def get_history(
    reader: ReaderDep,
    settings: SettingsDep,
    since: Annotated[
        int | None,
        Query(ge=0, description="Only points with env_steps greater than this."),
    ] = None,
    limit: Annotated[
        int | None,
        Query(ge=1, le=MAX_LIMIT, description="At most this many points, spread evenly."),
    ] = None,
) -> HistoryResponse:
    """History points oldest first: full resolution recently, thinned further back."""
    buffer = reader.history.refresh()
    points = list(buffer) if since is None else [p for p in buffer if p.env_steps > since]
    try:
        job: str | None = reader.status.read().job
    except SnapshotError:
        job = None  # history is still worth serving while status.json is being replaced
    stats = reader.history.stats
    return HistoryResponse(
        job=job,
        points=downsample(points, limit or settings.history_default_limit),
        matched=len(points),
        held=len(buffer),
        lines_read=stats.lines_read,
        skipped_lines=stats.skipped_lines,
    )
