#!/usr/bin/env bash
# Build (once) and cache versitygw, the S3-compatible server the storage tests run against
# (`checkpoint.storageUri`): a real S3 API over a directory, compiled from its Go module (no
# Docker, no release downloads), like the cluster's binaries (build.sh).
#
# Cached in ${IMPALA_TEST_CACHE:-$HOME/.cache/impalajob}/versitygw-<version>-<go version>/bin;
# idempotent. Prints the bin dir on the last line. Knobs: VERSITYGW_VERSION, BUILD_PARALLELISM.
set -euo pipefail

VERSITYGW_VERSION="${VERSITYGW_VERSION:-v1.8.0}"
BUILD_PARALLELISM="${BUILD_PARALLELISM:-2}"
NODWARF="-gcflags=all=-dwarf=false"   # the linker drops DWARF (-w): the compiler need not make it
export GOTOOLCHAIN=local
export CGO_ENABLED=0
GO_VERSION="$(go env GOVERSION)"
ROOT="${IMPALA_TEST_CACHE:-$HOME/.cache/impalajob}/versitygw-${VERSITYGW_VERSION}-${GO_VERSION}"
BIN="$ROOT/bin"
mkdir -p "$BIN"

log() { echo "[build-s3.sh] $*" >&2; }

exec 9>"$ROOT/.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
fi

if [[ -x "$BIN/versitygw" ]]; then
  log "versitygw cached in $BIN"
  echo "$BIN"
  exit 0
fi

log "building versitygw $VERSITYGW_VERSION with $GO_VERSION (first build takes a few minutes)"
tmp="$(mktemp -d "$ROOT/out.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# `go install pkg@version` builds the module with its own go.mod (its replaces included).
GOBIN="$tmp" GOFLAGS=-mod=mod go install -p "$BUILD_PARALLELISM" -trimpath "$NODWARF" -ldflags "-s -w" \
  "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
mv "$tmp/versitygw" "$BIN/versitygw"
log "done: $BIN/versitygw"
echo "$BIN"
