"""Checkpoints: learner state (model, optimisers, policy version) plus the driver's counters.

Layout: `checkpoints/ckpt-<seq>/` with `learner.pt` (torch: each policy's learner state under
`policies`, by name, and a self-play pool under `self_play`) and `state.json` (counters, the
episode-return window, accumulated wall seconds). A checkpoint is written into a hidden temporary
directory and renamed into place, so a crash mid-write never leaves a half checkpoint that
`latest_checkpoint` would pick. No RNG state is saved: a resumed run continues the counters and
the learning, not the exact random streams.

A checkpoint that cannot be read back (a volume that lost its last writes, a truncated file) is
moved aside as `.corrupt-ckpt-<seq>` and the next older one is used (`load_newest_readable`);
a write that fails (a full volume) leaves the older checkpoints as they were.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

OLD_LAYOUT = (
    "{path} is a checkpoint of the old single-policy layout (one learner's state at its top, "
    "not each policy's under `policies`): this version cannot read it; train the run again"
)
"""Every checkpoint keeps its policies by name, a gymnasium env's one as `default`."""
LEARNER_FILE = "learner.pt"
STATE_FILE = "state.json"
_NAME = re.compile(r"^ckpt-(\d{6,})$")
CORRUPT_PREFIX = ".corrupt-"
logger = logging.getLogger(__name__)


@dataclass
class DriverState:
    """What the driver needs to continue a run exactly where the checkpoint left it."""

    counters: dict[str, int] = field(default_factory=dict)
    """snapshot.Counters as a dict."""
    wall_seconds: float = 0.0
    """Training seconds accumulated over every run so far."""
    episode_returns: list[float] = field(default_factory=list)
    """The last (up to 100) episode returns: the stop criterion's window."""
    episode_lengths: list[int] = field(default_factory=list)
    """Their lengths."""
    iteration: int = 0
    """Driver iterations that wrote a snapshot."""
    started_at: float = 0.0
    """Unix time the first run started."""
    evaluation: dict[str, Any] | None = None
    """The latest evaluation and the best so far (snapshot.EvaluationInfo), if any."""
    return_trend: dict[str, Any] | None = None
    """The training return's first and best window means (snapshot.ReturnTrend)."""
    control: dict[str, Any] | None = None
    """The control request in effect (rundir.control.ControlRequest), if one was applied."""


def _seq(path: Path) -> int | None:
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else None


def list_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not checkpoint_dir.is_dir():
        return []
    found = [
        p
        for p in checkpoint_dir.iterdir()
        if _seq(p) is not None and (p / STATE_FILE).is_file() and (p / LEARNER_FILE).is_file()
    ]
    return sorted(found, key=lambda p: _seq(p) or 0)


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(checkpoint_dir)
    return found[-1] if found else None


def _write_checkpoint_dir(
    checkpoint_dir: Path, learner_state: dict[str, Any], state: DriverState
) -> Path:
    """Both files in a new hidden directory of `checkpoint_dir`, synced; its path."""
    # Serialised in memory, then written as plain bytes: torch's own file writer reports a full
    # volume as a RuntimeError from its zip writer ("unexpected pos"), which the caller, which
    # trains on through write failures (OSError), would take for a crash.
    weights = io.BytesIO()
    torch.save(learner_state, weights)
    tmp = Path(tempfile.mkdtemp(dir=checkpoint_dir, prefix=".tmp-ckpt-"))
    try:
        (tmp / LEARNER_FILE).write_bytes(weights.getbuffer())
        (tmp / STATE_FILE).write_text(json.dumps(asdict(state), separators=(",", ":")))
        for name in (LEARNER_FILE, STATE_FILE):
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def save_checkpoint(
    checkpoint_dir: Path, learner_state: dict[str, Any], state: DriverState, keep: int
) -> Path:
    """Write a new checkpoint atomically, then delete all but the newest `keep`."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    for stale in checkpoint_dir.glob(".tmp-ckpt-*"):  # left by a crash mid-write
        shutil.rmtree(stale, ignore_errors=True)
    existing = list_checkpoints(checkpoint_dir)
    seq = (_seq(existing[-1]) or 0) + 1 if existing else 1
    final = checkpoint_dir / f"ckpt-{seq:06d}"
    tmp = _write_checkpoint_dir(checkpoint_dir, learner_state, state)
    try:
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(checkpoint_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def policy_state(
    weights: dict[str, Any], policy_version: int, global_timestep: int
) -> dict[str, Any]:
    """A policy's weights as a checkpoint's learner state, without an optimiser (what
    `save_policy_checkpoint` keeps)."""
    model = {k: torch.as_tensor(v) for k, v in weights.items()}
    return {"model": model, "policy_version": policy_version, "global_timestep": global_timestep}


def save_policy_checkpoint(path: Path, learner_state: dict[str, Any], state: DriverState) -> Path:
    """Replace the checkpoint directory `path` (checkpoints/best) with a policy's weights alone
    (`policy_state`, or a multi-agent job's policies of them: no optimiser, it is for evaluate
    and export, never resumed from); the old one stays whole until the new one is complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_checkpoint_dir(path.parent, learner_state, state)
    old = path.with_name(f".old-{path.name}")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.rename(path, old)
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def load_checkpoint(path: Path) -> tuple[dict[str, Any], DriverState]:
    """(learner state for Learner.load_state_dict, driver state) of one checkpoint directory."""
    learner_state = torch.load(path / LEARNER_FILE, map_location="cpu", weights_only=True)
    raw = json.loads((path / STATE_FILE).read_text())
    known = {k: v for k, v in raw.items() if k in DriverState.__dataclass_fields__}
    return learner_state, DriverState(**known)


@dataclass
class Restored:
    """The newest checkpoint that could be read, and the newer ones that could not."""

    path: Path
    learner_state: dict[str, Any]
    state: DriverState
    skipped: list[str] = field(default_factory=list)
    """"ckpt-000005 (why)" for each unreadable checkpoint set aside, newest first."""


def load_newest_readable(checkpoint_dir: Path) -> Restored | tuple[str, ...] | None:
    """The newest checkpoint that loads, newer unreadable ones moved aside (so nothing picks
    them again, and they stay for a post-mortem); None when there was none, or the reasons when
    none could be read."""
    skipped: list[str] = []
    for path in reversed(list_checkpoints(checkpoint_dir)):
        try:
            learner_state, state = load_checkpoint(path)
        except Exception as exc:  # truncated zip, bad JSON, a short read: the next one, then
            why = f"{path.name} ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
            skipped.append(why)
            logger.warning("checkpoint %s cannot be read; trying the one before it", why)
            os.rename(path, path.with_name(CORRUPT_PREFIX + path.name))
            continue
        return Restored(path, learner_state, state, skipped)
    return tuple(skipped) if skipped else None
