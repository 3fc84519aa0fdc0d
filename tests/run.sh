#!/usr/bin/env bash
# The project's one test command (README, .ci/run): install everything the tests need, then pytest.
# Extra arguments go to pytest, e.g. `bash tests/run.sh -m "not slow"` for the fast set.
set -euo pipefail
cd "$(dirname "$0")/.."

# The lock's versions (hack/lock.sh): the tests run what the image ships.
python -m pip install --quiet --disable-pip-version-check -e '.[dev]' -c requirements/dev.lock
bash tests/setup-system.sh            # Debian packages (chromium, wrk; the real node's, as root)

# The product image for the real-node tests (hack/build-image.sh: cached by content, so a warm
# machine skips it) builds mostly on disk and network while the Go build below takes the CPU.
# The fast set (`-m "not slow"`) never starts the real node: no image for it.
image_pid=""
if [ "$(id -u)" -eq 0 ] && [[ " $* " != *"not slow"* ]]; then
  mkdir -p "${IMPALA_IMAGE_CACHE:-$HOME/.cache/impalajob/image}"
  image_log="${IMPALA_IMAGE_CACHE:-$HOME/.cache/impalajob/image}/build.log"
  bash hack/build-image.sh >"$image_log" 2>&1 &
  image_pid=$!
fi
bash harness/cluster/setup.sh         # kube-apiserver, etcd, kcm, kubelet, CoreDNS, ... (cached)
if [ -n "$image_pid" ] && ! wait "$image_pid"; then
  echo "hack/build-image.sh failed; its log:" >&2
  tail -n 40 "$image_log" >&2
  exit 1
fi

# Lint and types before the minutes of tests: each names its line (config in pyproject.toml).
python -m ruff check .
python -m mypy

# Ray must not try to reach the internet or collect usage stats in tests.
export RAY_USAGE_STATS_ENABLED=0
# The slowest tests are listed at the end: CI's time budget is watched from there.
exec python -m pytest --durations=25 "$@"
