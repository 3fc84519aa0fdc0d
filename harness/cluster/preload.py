"""`python -m harness.cluster.preload ARCHIVE...` (as root): import OCI archives into the real
node's kept containerd store (`node.default_image_store`) before any node starts.

A first import of the product image unpacks ~3.4 GB of layers, 80-110 s of mostly disk on the
CI machine. The real-node tests' setup used to wait for it; tests/run.sh runs this as soon as
the image is built, while the Go builds hold the CPU, and the node then finds every blob in place.
The import runs against a containerd of its own on the kept root, with the CRI plugin off (no
pods, no network), holding the store's lock, which the node waits for (`node.STORE_WAIT_S`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .kube import wait_for
from .node import (
    containerd_ctr,
    default_image_store,
    hold_store,
    import_archives,
    stop_process,
)

WAIT_S = 1800.0
"""How long to wait for the store when a real-node session holds it."""


def _config(root: Path, tmp: Path) -> str:
    return f"""version = 2
root = "{root}"
state = "{tmp / "state"}"
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
]
[grpc]
  address = "{tmp / "containerd.sock"}"
[ttrpc]
  address = "{tmp / "containerd.ttrpc.sock"}"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{tmp / "opt"}"
"""


def preload(archives: list[Path], store: Path | None = None) -> None:
    """Import `archives` into the kept store's `k8s.io` namespace, as the real node would."""
    store = store or default_image_store()
    lock = hold_store(store, wait=WAIT_S)
    if lock is None:
        raise SystemExit(f"preload: {store} stayed locked for {WAIT_S:.0f} s")
    with lock, tempfile.TemporaryDirectory(prefix="impala-preload-") as scratch:
        tmp = Path(scratch)
        (tmp / "config.toml").write_text(_config(store / "root", tmp))
        socket = tmp / "containerd.sock"
        with (tmp / "containerd.log").open("w") as log:
            containerd = subprocess.Popen(
                ["containerd", "--config", str(tmp / "config.toml")], stdout=log, stderr=log
            )
        try:
            wait_for(
                lambda: containerd.poll() is not None or socket.exists(),
                timeout=60,
                what="containerd socket",
            )
            if containerd.poll() is not None:
                log_text = (tmp / "containerd.log").read_text()
                raise SystemExit(f"preload: containerd exited:\n{log_text}")
            import_archives(containerd_ctr(socket), archives, tmp)
        finally:
            stop_process(containerd, timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.cluster.preload", description=__doc__)
    parser.add_argument("archives", type=Path, nargs="+", help="OCI archives (hack/build-image.sh)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("preload: containerd needs root")
    started = time.monotonic()
    preload(args.archives)
    print(f"[preload] done in {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
