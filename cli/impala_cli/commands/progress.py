"""Console progress for `impalajob train`: a rich progress bar on a terminal, log lines otherwise.

The bar's completion is progress toward the nearest stop criterion. When stdout is not a TTY
(CI, `| tee`, a pod's log) a bar would print escape codes, so a plain line is written every
`log_interval` seconds instead.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from impala_api.snapshot import StatusSnapshot, duration_text


def describe(snap: StatusSnapshot) -> str:
    """One-line summary of a snapshot: steps, the return the run is judged by, throughput."""
    return (
        f"steps {snap.counters.num_env_steps_sampled:,}  {_return(snap)}  "
        f"{snap.throughput.env_steps_per_s:,.0f} steps/s  "
        f"updates {snap.counters.learner_updates:,}  workers {snap.membership.rollout_workers}"
    )


def _return(snap: StatusSnapshot) -> str:
    """The training return, or for a job scored against an opponent its evaluation's (with the
    round's win rate): the return its trend follows."""
    value = snap.followed_return_mean
    if snap.return_trend.source == "training":
        return f"return {'n/a' if value is None else f'{value:.1f}'}"
    if value is None:
        return "eval return n/a"
    ev = snap.evaluation
    assert ev is not None
    won = f", win rate {ev.win_rate:.0%}" if ev.win_rate is not None else ""
    return f"eval return {value:.2f} (vs {ev.opponent}{won})"


class ProgressReporter:
    """Feed it snapshots; it draws or logs them."""

    def __init__(
        self,
        job: str,
        stream: TextIO | None = None,
        tty: bool | None = None,
        log_interval: float = 5.0,
    ) -> None:
        self.job = job
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.log_interval = log_interval
        self._last_log = float("-inf")
        self._progress: Progress | None = None
        self._task = None
        if self.tty:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._task = self._progress.add_task(job, total=1.0, info="starting")
            self._progress.start()

    def update(self, snap: StatusSnapshot) -> None:
        """Show the latest snapshot (rate-limited when logging lines)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=snap.stop.progress, info=describe(snap))
            return
        now = time.monotonic()
        if now - self._last_log < self.log_interval and snap.phase in ("Running", "Starting"):
            return
        self._last_log = now
        line = f"[{self.job}] {snap.phase.lower()} {snap.wall_seconds:6.1f}s  {describe(snap)}"
        line += f"  progress {100 * snap.stop.progress:.0f}%"
        if snap.stop.remaining_seconds is not None and snap.phase in ("Starting", "Running"):
            line += f"  ETA {duration_text(snap.stop.remaining_seconds)}"
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        """Stop drawing (leaves the last bar on screen)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
