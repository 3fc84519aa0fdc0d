#!/usr/bin/env bash
# Prepare the e2e control plane before pytest runs: Debian packages the harness needs, then the
# cached Kubernetes binaries (build.sh; a no-op once they are built), and versitygw (build-s3.sh).
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

bash "$here/build.sh" >/dev/null
bash "$here/build-s3.sh" >/dev/null   # versitygw: the S3-compatible server of the storage tests
