#!/usr/bin/env bash
# The project's one test command (README, .ci/run): install everything the tests need, then pytest.
# Extra arguments go to pytest, e.g. `bash tests/run.sh -m "not slow"` for the fast set.
set -euo pipefail
cd "$(dirname "$0")/.."

bash tests/setup-system.sh            # Debian packages (chromium, wrk; the real node's, as root)

# The slow builds start first, in the background and niced, so they take the CPU the tests leave
# idle: the Go builds of the control plane and the real node (harness/cluster/setup.sh) and, as
# root, the product image (hack/build-image.sh) then its import into the real node's containerd
# store (harness/cluster/preload.py: ~2 min of disk a first time). All are cached, so a warm
# machine skips them. pytest meanwhile runs the unit and integration layers (pyproject.toml's
# testpaths put them first); the e2e fixtures wait for the builds on their locks. The fast set
# (`-m "not slow"`) needs none of them.
logs="${IMPALA_TEST_CACHE:-$HOME/.cache/impalajob}/logs"
builds=()
if [[ " $* " != *"not slow"* ]]; then
  mkdir -p "$logs"
  nice -n 15 bash harness/cluster/setup.sh >"$logs/cluster.log" 2>&1 &
  builds+=("$!:cluster")
  if [ "$(id -u)" -eq 0 ]; then
    nice -n 10 bash -c 'set -euo pipefail; archive="$(bash hack/build-image.sh | tail -n 1)"
      python3 -m harness.cluster.preload "$archive"' >"$logs/image.log" 2>&1 &
    builds+=("$!:image")
  fi
fi

# The lock's versions (hack/lock.sh): the tests run what the image ships.
python -m pip install --quiet --disable-pip-version-check -e '.[dev]' -c requirements/dev.lock

# Lint and types before the minutes of tests: each names its line (config in pyproject.toml).
python -m ruff check .
python -m mypy

# Ray must not try to reach the internet or collect usage stats in tests.
export RAY_USAGE_STATS_ENABLED=0
# The slowest tests are listed at the end: CI's time budget is watched from there.
status=0
python -m pytest --durations=25 "$@" || status=$?

# A build that failed has failed its tests already (their fixtures rebuild and say why); its log
# is shown too. A run of a few tests waits here for the builds: the next run needs them.
for build in "${builds[@]}"; do
  if ! wait "${build%%:*}"; then
    echo "the ${build#*:} build failed; the end of $logs/${build#*:}.log:" >&2
    tail -n 40 "$logs/${build#*:}.log" >&2
    status=1
  fi
done
exit "$status"
