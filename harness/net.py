"""A free TCP port for a server the caller starts as a separate process (the control plane's
components, Kueue, the operator, a sidecar): `harness.net.free_port`, for the harness, the tests
and the benchmarks alike.

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
