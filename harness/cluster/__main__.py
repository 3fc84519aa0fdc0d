"""`python -m harness.cluster [--real-node]`, run from the repository root: start a cluster and
keep it up until Ctrl-C.

Plain: the control plane with three kwok nodes. `--real-node`: the control plane with one real
node and no kwok nodes, with the product image (hack/build-image.sh, or `--image ARCHIVE`)
imported and a default StorageClass (the local-path provisioner, provisioner.py), so `helm install
charts/impala-operator` and `kubectl apply -f manifests/examples/...` run for real, unchanged,
their claims included (as root; see harness/cluster/node.py).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import time
from pathlib import Path

from .controlplane import ControlPlane, NodeSpec, build_binaries

REPO = Path(__file__).resolve().parents[2]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    """Start a cluster, print how to reach it, wait for Ctrl-C, tear it down."""
    parser = argparse.ArgumentParser(prog="python -m harness.cluster", description=__doc__)
    parser.add_argument("--real-node", action="store_true", help="one real node, no kwok nodes")
    parser.add_argument(
        "--storage-image",
        default="impalajob:0.1.0",
        help="image (imported on the node, with a shell) for the local-path provisioner's helper "
        "pods; claims then bind on their own, through the default StorageClass `local-path`",
    )
    parser.add_argument(
        "--image",
        type=Path,
        action="append",
        default=[],
        help="OCI archive to import, repeatable (default: build the product image); e.g. a job "
        "image of hack/build-job-image.sh beside the product's",
    )
    args = parser.parse_args()
    # `kill PID` should tear down as cleanly as Ctrl-C; a background job may also ignore SIGINT.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    bin_dir = build_binaries()
    images: list[Path] = list(args.image)
    if args.real_node and not images:
        out = subprocess.run(
            ["bash", str(REPO / "hack" / "build-image.sh")],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        ).stdout
        images.append(Path(out.strip().splitlines()[-1]))
    t0 = time.monotonic()
    with ControlPlane.start(
        bin_dir,
        nodes=NodeSpec(count=0) if args.real_node else None,
        real_node=args.real_node,
        images=images,
        taint_real_node=False,
        timeout=900,
        # The product image (built above, or the first --image) runs the provisioner's helpers.
        storage_image=args.storage_image if args.real_node else None,
    ) as kube:
        print(f"cluster {kube.version} ready in {time.monotonic() - t0:.1f}s", flush=True)
        print(f"export KUBECONFIG={kube.kubeconfig} PATH={bin_dir}:$PATH", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
