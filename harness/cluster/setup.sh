#!/usr/bin/env bash
# Prepare the e2e control plane (tests/run.sh runs it beside pytest): Debian packages the harness
# needs, versitygw (build-s3.sh), then the cached Kubernetes binaries (build.sh; no-ops once built).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

need=()
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v flock >/dev/null 2>&1 || need+=(util-linux)
command -v git >/dev/null 2>&1 || need+=(git)   # `go` fetches nothing through it, but vcs stamping looks for it
if [ ${#need[@]} -gt 0 ]; then
  echo "[setup.sh] installing Debian packages: ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  sudo_=""
  [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq
  $sudo_ apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1; then
  echo "[setup.sh] Go is required to build the control plane (see docs/testing.md)" >&2
  exit 1
fi

# versitygw first: the storage tests of the integration layer, which runs while build.sh does.
bash "$here/build-s3.sh" >/dev/null
bash "$here/build.sh" >/dev/null
