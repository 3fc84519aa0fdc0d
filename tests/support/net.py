"""A free TCP port for a server the test starts as a separate process.

Imported as `tests.support.net` by the tests, and as `support.net` by tests/cluster/, whose
import root is tests/ (`cd tests && python -m cluster`). The module imports nothing from the
test tree, so both names work and give the same function.

In-process servers do not need it: bind port 0 and read the port back (as
`tests.support.sidecar.serve_in_thread` does), which has no race at all.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that is free now.

    The port is released before the caller's server binds it, so another process could take it
    in between; for a test harness on one machine that tiny race is accepted.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
