"""/metrics: Prometheus exposition of the latest snapshot (see `collector.py`)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from impala_trainer.sidecar.deps import SidecarDep
from impala_trainer.sidecar.models import ERRORS_401, ERRORS_503

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition format (impala_* families, `job` label)",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **ERRORS_401,
        **ERRORS_503,
    },
)
async def get_metrics(sidecar: SidecarDep) -> Response:
    """Counters and gauges from status.json; 503 (not an empty scrape) when it is unreadable."""
    # Read first so a bad snapshot becomes a 503 with a reason rather than an exception inside
    # the registry's collect loop; the collector's own read then hits the parse cache.
    status_file = sidecar.reader.status
    status_file.read()
    # The exposition is a pure function of status.json (see collector.py): render it once per
    # file version, not per scrape.
    if sidecar.metrics_body is None or sidecar.metrics_body[0] != status_file.key:
        sidecar.metrics_body = (status_file.key, generate_latest(sidecar.registry))
    return Response(sidecar.metrics_body[1], media_type=CONTENT_TYPE_LATEST)
