"""Steering a running run from outside: a population's controller asks, the driver applies.

The controller writes `control.json` into the run directory (`write_request`): a numbered
request to train with new live hyperparameters from the next update, and optionally to adopt
another run's newest checkpoint first (PBT's exploit and explore). The driver looks for a newer
request every few seconds, applies it once, and answers in `control-applied.json`
(`write_applied`): which request, at which env step, from which checkpoint. Both files are
written whole and renamed into place, so neither side reads half a file. The run's checkpoints
keep the request in effect (`DriverState.control`), so a resumed run trains with it, and a run
that stopped before its checkpoint caught up applies the request again.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from impala_trainer.rundir.checkpoint import list_checkpoints, load_checkpoint

CONTROL_FILE = "control.json"
APPLIED_FILE = "control-applied.json"
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControlRequest:
    """One numbered request; a larger `seq` replaces every earlier one."""

    seq: int
    values: dict[str, float] = field(default_factory=dict)
    """Live field paths (`impala_api.population.paths.LIVE_FIELDS`) to their values."""
    adopt: str | None = None
    """Another run's checkpoints directory: its newest readable checkpoint is adopted first."""
    parent: str | None = None
    """Whose checkpoint that is (a population member's name), for the record."""


@dataclass(frozen=True)
class Applied:
    """The driver's answer to a request."""

    seq: int
    timesteps: int
    """The run's env steps sampled when it applied the request."""
    adopted: str | None = None
    """The checkpoint it adopted (None: none asked, or none could be read: `error`)."""
    parent: str | None = None
    error: str | None = None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_request(run_dir: Path, request: ControlRequest) -> None:
    _write_json(run_dir / CONTROL_FILE, asdict(request))


def read_request(run_dir: Path) -> ControlRequest | None:
    """The request in the run directory, or None (none, or not one of ours: logged)."""
    data = _read_json(run_dir / CONTROL_FILE)
    if data is None:
        return None
    try:
        return ControlRequest(int(data["seq"]), {k: float(v) for k, v in data["values"].items()},
                              data.get("adopt"), data.get("parent"))  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        logger.error("%s is not a control request (%s): ignored", run_dir / CONTROL_FILE, exc)
        return None


def write_applied(run_dir: Path, applied: Applied) -> None:
    _write_json(run_dir / APPLIED_FILE, asdict(applied))


def read_applied(run_dir: Path) -> Applied | None:
    data = _read_json(run_dir / APPLIED_FILE)
    if data is None:
        return None
    try:
        return Applied(**data)
    except TypeError:
        return None


def newest_adoptable(checkpoint_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """Another run's newest checkpoint that loads, and its learner state; None when none does.
    Read only: a checkpoint that does not load (being rotated away as it is read) is passed
    over, and nothing of the other run's is moved."""
    for path in reversed(list_checkpoints(checkpoint_dir)):
        try:
            learner_state, _ = load_checkpoint(path)
        except Exception as exc:  # rotated away mid-read, truncated: the one before it
            logger.info("checkpoint %s not adopted (%s); trying the one before it", path, exc)
            continue
        return path, learner_state
    return None
