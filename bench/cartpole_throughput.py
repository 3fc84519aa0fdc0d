"""CartPole-v1 env steps/s with 2 rollout workers, ours vs RLlib's IMPALA.

Both sides train manifests/examples/cartpole.yaml for a fixed window (default 120 s) and report
the steady env steps/s after a warm-up (bench/throughput.py).

    python bench/cartpole_throughput.py                  # 3 alternating rounds of 120 s
    python bench/cartpole_throughput.py --seconds 20 --runs 1
"""

from __future__ import annotations

import sys

import throughput

if __name__ == "__main__":
    sys.exit(
        throughput.main(
            sys.argv[1:],
            scenario="cartpole_throughput",
            manifest="cartpole",
            description=__doc__.splitlines()[0],
            default_seconds=120.0,
            unit="env steps",
        )
    )
