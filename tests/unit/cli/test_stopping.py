"""A training command's stop: the first SIGTERM is a KeyboardInterrupt (the driver's "Stopped"
path), a later one changes nothing, and a stop that hangs past its grace ends the process with
where each thread was."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

HUNG_STOP = textwrap.dedent("""
    import os, signal, sys, time
    from impala_cli.commands import stopping
    stopping.install(grace_seconds=1.0)
    try:
        print("ready", flush=True)
        time.sleep(60)
    except KeyboardInterrupt:
        print("stopping", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal: the stop goes on
        time.sleep(60)  # a final checkpoint that never ends
""")


def test_a_stop_that_hangs_past_its_grace_exits_1_with_the_threads_stacks() -> None:
    proc = subprocess.Popen([sys.executable, "-c", HUNG_STOP], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and time.monotonic() - started < 20
    assert out == "stopping\n", "the first SIGTERM is a KeyboardInterrupt, the second nothing"
    assert "did not stop within 1 s of SIGTERM" in err
    assert "Current thread" in err or "Thread 0x" in err, err  # faulthandler's dump
