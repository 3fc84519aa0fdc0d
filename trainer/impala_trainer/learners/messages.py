"""What crosses the boundary between the driver and its learner process, typed.

Two pipes join them. The control pipe carries the driver's requests (`Request`) and the
process's replies (`Reply`): `Ready` once the learner is built (or `Failed`), then a
`StateReply` or `Loaded` for each `StateRequest` or `Load`. The outbox pipe carries what the
process reports unasked (`Report`): updates, timings, log records, the thread's error, and its
final state as it ends. Both sides `match` on these classes; the learner's weights do not travel
here but through a buffer both processes map (`shared_weights`).
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass
from typing import Any, ClassVar

from impala_trainer.learners.shared_weights import Layout

POLL_SECONDS = 0.1
"""How long either side waits on a pipe before it looks at anything else."""

# -- driver -> learner process (control pipe) ---------------------------------------------------


@dataclass(frozen=True)
class Start:
    """Start the learner thread, its schedules' clock at `global_timestep` env steps trained."""

    global_timestep: int


@dataclass(frozen=True)
class Stop:
    """Stop the thread, send the `Final` state and exit."""


@dataclass(frozen=True)
class StateRequest:
    """The learner's state, for a checkpoint (answered with a `StateReply`)."""


@dataclass(frozen=True)
class Load:
    """Restore a checkpoint's learner state (`state_bytes`), before `Start`; answered with
    `Loaded`."""

    state: bytes


@dataclass(frozen=True)
class Change:
    """Queue a `LearnerChange` (pickled) for the learner's next update; not answered."""

    change: bytes


Request = Start | Stop | StateRequest | Load | Change

# -- learner process -> driver (control pipe) ---------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The learner is built: what the driver reads of it from then on."""

    kind: ClassVar[str] = "ready"
    device: str
    autocast_dtype: Any
    weights_nbytes: int
    policy_version: int
    shared: Any
    """The shared weights' buffer (a torch tensor: it goes as shared memory, not a copy)."""
    layout: Layout
    stats: dict[str, float]
    queue_stats: dict[str, Any]


@dataclass(frozen=True)
class StateReply:
    kind: ClassVar[str] = "state"
    state: bytes
    """`state_bytes` of the learner's state."""


@dataclass(frozen=True)
class Loaded:
    kind: ClassVar[str] = "loaded"
    policy_version: int
    """Of the weights the loaded state holds (published to the shared buffer)."""


@dataclass(frozen=True)
class Failed:
    """Building the learner, or answering a request, raised (the process goes on after a
    request)."""

    kind: ClassVar[str] = "failed"
    error: BaseException


Reply = Ready | StateReply | Loaded | Failed

# -- learner process -> driver (outbox pipe) ----------------------------------------------------


@dataclass(frozen=True)
class Updates:
    """Updates that waited together, and the policy version of the weights now shared."""

    updates: list[tuple[int, dict[str, float]]]
    policy_version: int


@dataclass(frozen=True)
class Stats:
    """The thread's timings and its queue's statistics (every STATS_SECONDS)."""

    stats: dict[str, float]
    queue_stats: dict[str, Any]


@dataclass(frozen=True)
class Log:
    """A log record of the process, for the driver's logging."""

    record: logging.LogRecord


@dataclass(frozen=True)
class Error:
    """The learner thread's error (it stopped)."""

    error: BaseException


@dataclass(frozen=True)
class Final:
    """The learner's state as the process ends (`state_bytes`), for the last checkpoint."""

    state: bytes
    stats: dict[str, float]
    queue_stats: dict[str, Any]


Report = Updates | Stats | Log | Error | Final


def state_bytes(state: dict[str, Any]) -> bytes:
    """A learner state as plain pickle bytes. Sent as is, its tensors would go by torch's
    multiprocessing reductions, as shared memory that vanishes when the process that sent them
    exits (the final state is read after the learner process ends)."""
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
