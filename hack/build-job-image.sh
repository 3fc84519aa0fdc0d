#!/usr/bin/env bash
# Build a job image: the product image with your own package added, from a Dockerfile that says
# `FROM` it (examples/custom/Dockerfile), without Docker, on hack/build-image.sh's buildah storage.
#
#   bash hack/build-job-image.sh examples/custom my-impala:0.1.0   # archive path on the last line
#
# The product image is built (or found cached) first. The archive is cached beside it, keyed by
# the product archive and the content of the build context, so an unchanged package costs nothing.
# Load it where the nodes run (`ctr -n k8s.io images import`, or push it to your registry with
# skopeo) and set the job's spec.image to the tag.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[build-job-image] $*" >&2; }
[[ $# -eq 2 ]] || { echo "usage: $0 CONTEXT_DIR IMAGE:TAG" >&2; exit 2; }
context="$1"
tag="$2"
[[ -f "$context/Dockerfile" ]] || { echo "$context has no Dockerfile" >&2; exit 2; }

product_archive="$(bash hack/build-image.sh | tail -n 1)"
# Read without Python: whatever python3 this shell has (or none) must not matter.
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)"
product="impalajob:$VERSION"
CACHE="${IMPALA_IMAGE_CACHE:-$HOME/.cache/impalajob/image}"

key="$( { basename "$product_archive"; echo "$tag";
          find "$context" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' | LC_ALL=C sort \
            | xargs -d '\n' sha256sum; } | sha256sum | cut -c1-16)"
archive="$CACHE/${tag//[:\/]/_}-$key.oci.tar"
if [[ -f "$archive" ]]; then
  log "cached: $archive"
  echo "$archive"
  exit 0
fi

exec 8>"$CACHE/.lock"
command -v flock >/dev/null 2>&1 && flock 8
source hack/buildah-storage.sh
t0=$SECONDS
if ! "${B[@]}" inspect --type image "localhost/$product" >/dev/null 2>&1; then
  # The product archive came from another machine's cache: load it into this storage.
  "${B[@]}" pull --quiet "oci-archive:$product_archive" >/dev/null
  "${B[@]}" tag "$("${B[@]}" images --quiet --filter reference="*impalajob*" | head -n 1)" \
    "localhost/$product"
fi
"${B[@]}" build --quiet --layers --build-arg BASE="localhost/$product" \
  -f "$context/Dockerfile" -t "localhost/$tag" "$context" >&2
export_archive "$tag" "$archive"
log "built $tag FROM $product in $((SECONDS - t0)) s: $archive ($(du -h "$archive" | cut -f1))"
echo "$archive"
