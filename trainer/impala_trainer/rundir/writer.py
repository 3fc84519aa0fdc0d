"""The run directory writer: config.yaml, status.json, history.jsonl, summary.json, checkpoints/.

The file formats are `snapshot.py`'s; this module only decides when to write. status.json is
replaced atomically at most every `status_interval` seconds (the sidecar and the operator poll
it; rewriting it on every fast driver iteration would only burn the driver's time), history.jsonl
gets a line at most every `history_interval` seconds, and each line's scalars go to TensorBoard
event files under `tensorboard/` (step: env steps sampled).
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from impala_api.snapshot import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    HISTORY_FILE,
    STATUS_FILE,
    SUMMARY_FILE,
    VIDEO_DIR,
    HistoryPoint,
    StatusSnapshot,
    Summary,
    append_history,
    write_json_atomic,
)
from impala_api.spec import ImpalaJob
from impala_trainer.rundir.checkpoint import list_checkpoints
from impala_trainer.rundir.tensorboard import TENSORBOARD_DIR, EventFileWriter

LOG_FILE = "trainer.log"
_RUN_LOG = "impala_run_log"
"""Marks the handlers `log_to_file` installed."""
MAX_VIDEOS = 20
"""Evaluation videos kept in videos/ (a Pong episode's is about a megabyte)."""
"""The trainer's log (actor failures, tracebacks); the console only gets progress and a reason."""


class RunDir:
    """Writes one run's files under `path`."""

    def __init__(
        self, path: Path, status_interval: float = 0.5, history_interval: float = 1.0
    ) -> None:
        self.path = Path(path)
        self.status_interval = status_interval
        self.history_interval = history_interval
        self._last_status = float("-inf")
        self._last_history = float("-inf")
        self._events: EventFileWriter | None = None
        self._last_evaluation: int | None = None

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINT_DIR

    @property
    def status_file(self) -> Path:
        return self.path / STATUS_FILE

    @property
    def history_file(self) -> Path:
        return self.path / HISTORY_FILE

    @property
    def summary_file(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / TENSORBOARD_DIR

    def has_previous_run(self) -> bool:
        """True when the directory already holds a run's checkpoints or status."""
        return bool(list_checkpoints(self.checkpoints)) or self.status_file.exists()

    def clear(self) -> None:
        """Remove a previous run's files (only the ones this module writes)."""
        for name in (STATUS_FILE, HISTORY_FILE, SUMMARY_FILE, CONFIG_FILE, LOG_FILE):
            (self.path / name).unlink(missing_ok=True)
        shutil.rmtree(self.checkpoints, ignore_errors=True)
        shutil.rmtree(self.tensorboard_dir, ignore_errors=True)

    def write_video(self, env_steps: int, data: bytes, suffix: str = ".mp4") -> str:
        """Store an evaluation video as videos/eval-<env steps><suffix>, keeping the newest
        MAX_VIDEOS; its path relative to the run directory."""
        videos = self.path / VIDEO_DIR
        videos.mkdir(parents=True, exist_ok=True)
        name = f"eval-{env_steps:012d}{suffix}"
        tmp = videos / f".{name}.tmp"
        tmp.write_bytes(data)
        tmp.replace(videos / name)
        for old in sorted(videos.glob("eval-*"))[:-MAX_VIDEOS]:
            old.unlink(missing_ok=True)
        return f"{VIDEO_DIR}/{name}"

    def add_video_preview(self, env_steps: int, gif: bytes, height: int, width: int) -> None:
        """An evaluation episode as an animated GIF in TensorBoard (`evaluation/episode`)."""
        if self._events is None:
            self._events = EventFileWriter(self.tensorboard_dir)
        self._events.add_image(env_steps, "evaluation/episode", gif, height, width)

    def prepare(self, job: ImpalaJob, chosen: Sequence[str] = ()) -> None:
        """Create the directory and write config.yaml (the manifest with defaults filled in;
        `chosen`: the defaults set for the env's spaces, each said in a comment at the top and
        in the log)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        header = "".join(f"# set for this env: {line}\n" for line in chosen)
        text = header + yaml.safe_dump(job.to_manifest(), sort_keys=False)
        tmp = self.path / f".{CONFIG_FILE}.tmp"
        tmp.write_text(text)
        tmp.replace(self.path / CONFIG_FILE)
        # A resumed run starts a new summary; the old one described a run that ended. The old
        # status.json is the live snapshot of a process that is gone (a killed learner's, on
        # the claim): served until the new driver's first snapshot, it would show counters
        # behind the checkpoint this run resumes from, as if it were this run's.
        self.summary_file.unlink(missing_ok=True)
        self.status_file.unlink(missing_ok=True)

    def status_due(self) -> bool:
        """True when `status_interval` has passed since status.json was last written."""
        return time.monotonic() - self._last_status >= self.status_interval

    def write_status(self, snapshot: StatusSnapshot, force: bool = False) -> bool:
        """Replace status.json if `status_interval` has passed (or `force`); True if written."""
        now = time.monotonic()
        if not force and now - self._last_status < self.status_interval:
            return False
        write_json_atomic(self.status_file, snapshot)
        self._last_status = now
        return True

    def append_history(self, point: HistoryPoint, force: bool = False) -> bool:
        """Append a history line if `history_interval` has passed (or `force`)."""
        now = time.monotonic()
        if not force and now - self._last_history < self.history_interval:
            return False
        append_history(self.history_file, point)
        if self._events is None:
            self._events = EventFileWriter(self.tensorboard_dir)
        self._events.add_scalars(point.env_steps, tensorboard_scalars(point), point.time)
        evaluated = point.evaluation_env_steps
        if evaluated is not None and evaluated != self._last_evaluation:
            # Once per evaluation, at the env step of the weights it played.
            self._last_evaluation = evaluated
            scalars = {"evaluation/episode_return_mean": point.evaluation_return_mean}
            self._events.add_scalars(evaluated, scalars, point.time)
        self._last_history = now
        return True

    def log_to_file(self, also_stderr: bool = False) -> None:
        """Send the `impala_trainer` loggers to trainer.log in this directory (appending), and
        to stderr with `also_stderr` (a pod's log, which `kubectl logs` reads)."""
        handlers: list[logging.Handler] = [logging.FileHandler(self.path / LOG_FILE)]
        if also_stderr:
            handlers.append(logging.StreamHandler(sys.stderr))
        log = logging.getLogger("impala_trainer")
        # A second run in the same process (tests, notebooks) logs to its own directory only.
        for old in [h for h in log.handlers if getattr(h, _RUN_LOG, False)]:
            log.removeHandler(old)
            old.close()
        log.setLevel(logging.INFO)
        for handler in handlers:
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
            setattr(handler, _RUN_LOG, True)
            log.addHandler(handler)
        log.propagate = False

    def write_summary(self, summary: Summary) -> None:
        """Write summary.json (once, at the end)."""
        write_json_atomic(self.summary_file, summary)


def tensorboard_scalars(point: HistoryPoint) -> dict[str, float | None]:
    """A history line as TensorBoard tags: return, throughput, losses, the learner queue."""
    return {
        "episode/return_mean": point.episode_return_mean,
        "episode/count": float(point.episodes),
        "throughput/env_steps_per_s": point.env_steps_per_s,
        "throughput/trained_steps_per_s": point.trained_steps_per_s,
        "learner/policy_loss": point.policy_loss,
        "learner/vf_loss": point.vf_loss,
        "learner/entropy": point.entropy,
        "learner/updates": float(point.learner_updates),
        "learner_queue/fill": point.learner_queue_fill,
    }
