#!/usr/bin/env bash
# The project's one test command (README, .ci/run): install everything the tests need, then pytest.
# Extra arguments go to pytest, e.g. `bash tests/run.sh -m "not slow"` for the fast set.
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
bash tests/setup-system.sh            # Debian packages: chromium (dashboard test), wrk (bench)
bash tests/cluster/setup.sh           # kube-apiserver, etcd, kcm, kwok, helm, kubectl (cached)

# Ray must not try to reach the internet or collect usage stats in tests.
export RAY_USAGE_STATS_ENABLED=0
exec python -m pytest "$@"
