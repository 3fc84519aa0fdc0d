"""`cd tests && python -m cluster`: start the control plane and keep it up until Ctrl-C."""

from __future__ import annotations

import contextlib
import signal
import time

from .controlplane import ControlPlane, build_binaries


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    """Start a cluster, print how to reach it, wait for Ctrl-C, tear it down."""
    # `kill PID` should tear down as cleanly as Ctrl-C; a background job may also ignore SIGINT.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    bin_dir = build_binaries()
    t0 = time.monotonic()
    with ControlPlane.start(bin_dir) as kube:
        print(f"control plane {kube.version} ready in {time.monotonic() - t0:.1f}s")
        print(f"export KUBECONFIG={kube.kubeconfig} PATH={bin_dir}:$PATH")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
