"""/videos/{name}: the evaluation videos of the run directory (spec.evaluation.video), which the
dashboard plays. Only names the trainer writes (`eval-<env steps>.mp4|.gif`) are served, from
videos/ alone; Starlette's FileResponse answers Range requests, so a browser can seek."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

from impala_api.snapshot import VIDEO_DIR
from impala_trainer.sidecar.deps import SettingsDep
from impala_trainer.sidecar.models import ERRORS_401, ErrorResponse

router = APIRouter(tags=["videos"])

_NAME = re.compile(r"^eval-\d{12}\.(mp4|gif)$")
_MEDIA = {"mp4": "video/mp4", "gif": "image/gif"}


@router.get(
    "/videos/{name}",
    response_class=FileResponse,
    responses={**ERRORS_401, 404: {"model": ErrorResponse, "description": "No such video"}},
)
async def get_video(name: str, settings: SettingsDep) -> FileResponse:
    """One evaluation video (mp4, or GIF where no encoder was installed)."""
    match = _NAME.match(name)
    path = Path(settings.run_dir) / VIDEO_DIR / name
    if match is None or not path.is_file():
        raise HTTPException(status_code=404, detail=f"no evaluation video named {name!r}")
    return FileResponse(path, media_type=_MEDIA[match.group(1)],
                        headers={"Cache-Control": "max-age=3600"})  # fmt: skip
