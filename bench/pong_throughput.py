"""ALE/Pong-v5 frames/s with 2 rollout processes, ours vs RLlib's IMPALA.

Both sides train manifests/examples/pong.yaml (same fragment length, train batch, envs per
worker, frame skip and stack, CNN layers) for a fixed window (default 300 s). Frames are emulator
frames: env steps x frameSkip. RLlib uses its own Atari pipeline (wrap_atari_for_new_api_stack:
84x84 grayscale, max-pooled frame skip, frame stack, float32 frames) with the same settings.

    python bench/pong_throughput.py                      # 3 alternating rounds of 300 s
    python bench/pong_throughput.py --seconds 60 --runs 1
"""

from __future__ import annotations

import sys

import throughput

if __name__ == "__main__":
    sys.exit(
        throughput.main(
            sys.argv[1:],
            scenario="pong_throughput",
            manifest="pong",
            description=__doc__.splitlines()[0],
            default_seconds=300.0,
            unit="frames",
            scale_of=lambda spec: spec.env.frame_skip,
        )
    )
