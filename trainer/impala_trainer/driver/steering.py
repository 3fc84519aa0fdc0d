"""The driver's side of `rundir.control`: a newer request in the run directory becomes a
`LearnerChange` of the running learner (another run's checkpoint adopted, the live
hyperparameters set), applied once, answered, and kept in the run's checkpoints."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from impala_api.population.paths import with_values
from impala_api.spec import ImpalaJobSpec
from impala_trainer.learners.policies import LearnerState
from impala_trainer.learning.learner import LearnerChange
from impala_trainer.rundir.control import (
    Applied,
    ControlRequest,
    newest_adoptable,
    read_request,
    write_applied,
)

POLL_SECONDS = 1.0
"""How often the driver looks for a newer request (a stat and a small read)."""
logger = logging.getLogger(__name__)


class Steering:
    """Applies the run directory's control requests to `learner`, each once."""

    def __init__(self, run_dir: Path, spec: ImpalaJobSpec) -> None:
        self.run_dir = run_dir
        self.spec = spec
        """The job's spec with the live values in effect."""
        self.in_effect: ControlRequest | None = None
        """The newest request applied (resumed from a checkpoint, or read since)."""
        self._kept: ControlRequest | None = None
        """The newest request the learner had taken by the last `checkpoint_state`."""
        self._sent_at_version = 0
        self._last_poll = float("-inf")

    def resume(self, saved: dict[str, Any] | None, learner: LearnerState) -> ImpalaJobSpec:
        """A checkpoint's request in effect (`checkpoint_state`), its values set again before
        the learner's first update (the checkpoint's optimiser state is the adopted one's)."""
        if saved is None:
            return self.spec
        request = ControlRequest(**saved)
        self.spec = with_values(self.spec, request.values)
        learner.change(LearnerChange(training=self.spec.training))
        self.in_effect = self._kept = request
        return self.spec

    def poll(self, learner: LearnerState, timesteps: int, force: bool = False) -> ImpalaJobSpec:
        """Apply a newer request, if there is one and it is time to look; the spec now."""
        now = time.monotonic()
        if not force and now - self._last_poll < POLL_SECONDS:
            return self.spec
        self._last_poll = now
        request = read_request(self.run_dir)
        if request is None or (self.in_effect is not None and request.seq <= self.in_effect.seq):
            return self.spec
        applied = self._apply(request, learner, timesteps)
        write_applied(self.run_dir, applied)
        return self.spec

    def _apply(self, request: ControlRequest, learner: LearnerState, timesteps: int) -> Applied:
        try:
            spec = with_values(self.spec, request.values)
        except ValueError as exc:  # the controller's values do not make a valid job
            logger.error("control request %d refused: %s", request.seq, exc)
            self.in_effect = request  # answered: not tried again
            return Applied(request.seq, timesteps, error=str(exc))
        adopted, state, error = None, None, None
        if request.adopt is not None:
            found = newest_adoptable(Path(request.adopt))
            if found is None:
                error = f"no readable checkpoint in {request.adopt}: kept this run's weights"
                logger.warning("control request %d: %s", request.seq, error)
            else:
                path, state = found
                adopted = str(path)
        learner.change(LearnerChange(state=state, training=spec.training))
        self.spec, self.in_effect = spec, request
        self._sent_at_version = learner.policy_version
        logger.info(
            "control request %d applied at %d env steps: %s%s",
            request.seq, timesteps, request.values,
            f", adopted {adopted} of {request.parent}" if adopted else "",
        )  # fmt: skip
        return Applied(request.seq, timesteps, adopted, request.parent, error)

    def checkpoint_state(self, learner: LearnerState) -> dict[str, Any] | None:
        """The request a checkpoint taken now keeps: the newest once the learner has updated
        since it was sent (and so has taken it), else the one before."""
        if self.in_effect is not None and learner.policy_version > self._sent_at_version:
            self._kept = self.in_effect
        return None if self._kept is None else asdict(self._kept)
