"""How a training command stops on SIGTERM (what a supervisor or the kubelet sends) and SIGINT.

The first signal raises KeyboardInterrupt in the main thread, the driver's "Stopped" path: a
final checkpoint, the summary, exit 130. That holds from the command's first line, not only once
training runs: `ray.init` installs its own SIGTERM handler (`sys.exit(15)` at once, leaving the
Ray processes it started so far behind), so it runs inside `ray_starting()`, which turns that exit
into the same stop and puts our handler back. A later signal changes nothing: the stop under way
finishes, bounded by the watchdog where one is armed (`impalajob train`: a local run stops in a
minute or says where it hung; a learner pod has the kubelet's grace period for that).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from impala_cli.commands import EXIT_FAILED

stopping = threading.Event()
"""Set by the first stop signal."""
_grace_seconds: float | None = None


def install(grace_seconds: float | None = None) -> None:
    """Stop on SIGTERM, and on SIGINT unless the process was started with it ignored (a
    background job of a non-interactive shell, `nohup`), which then stays ignored.

    `grace_seconds`: how long the stop may take before the process dumps its threads' stacks
    to stderr and exits 1 (None: as long as it takes)."""
    global _grace_seconds
    _grace_seconds = grace_seconds
    stopping.clear()
    signal.signal(signal.SIGTERM, _on_signal)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_signal)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    if stopping.is_set():
        return  # the stop under way goes on
    stopping.set()
    if _grace_seconds is not None:
        watchdog = threading.Timer(_grace_seconds, _overdue, args=(signal.Signals(signum).name,))
        watchdog.daemon = True
        watchdog.start()
    raise KeyboardInterrupt


def _overdue(name: str) -> None:
    print(
        f"impalajob: error: the run did not stop within {_grace_seconds:g} s of {name}; exiting "
        "without its final checkpoint (the newest one written stays). Where each thread was:",
        file=sys.stderr,
        flush=True,
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    kill_descendants()
    os._exit(EXIT_FAILED)


@contextlib.contextmanager
def ray_starting() -> Iterator[None]:
    """Around `ray.init`: its SIGTERM exit becomes a stop, and our handler is back after it."""
    try:
        yield
    except SystemExit as exc:
        if exc.code != signal.SIGTERM:
            raise
        stopping.set()
        raise KeyboardInterrupt from None
    finally:
        signal.signal(signal.SIGTERM, _on_signal)


def kill_descendants() -> None:
    """SIGKILL every process this one started, and theirs (a half-started Ray: its GCS, raylet
    and agents; the learner's forkserver), listed before any is killed: a child killed first
    would hand its own children to init, out of reach."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
