#!/usr/bin/env bash
# Build the ImpalaJob image without Docker: buildah runs the repository's Dockerfile on a Debian
# bookworm base that mmdebstrap makes (Python 3.11 from Debian), and the result is exported as an
# OCI archive that containerd (`ctr images import`), podman or skopeo can load.
#
#   bash hack/build-image.sh            # prints the archive's path on the last line
#
# Cached outside the repository, under ${IMPALA_IMAGE_CACHE:-$HOME/.cache/impalajob/image}:
#   base   the mmdebstrap rootfs, keyed by the suite and package list below;
#   deps   the Dockerfile's dependency layer (torch, Ray, ...), keyed by requirements/runtime.lock:
#          buildah's layer cache reuses it until the lock changes;
#   image  the archive, keyed by the content of everything that goes into it, so an unchanged
#          tree costs nothing and a code change rebuilds only the project layer (seconds).
#
# Knobs (environment): IMAGE (default impalajob:<version in pyproject.toml>), IMPALA_IMAGE_CACHE,
# DEBIAN_MIRROR (default: mmdebstrap's), STORAGE_DRIVER (overlay, falling back to vfs).
# Needs root (or a user namespace buildah accepts) and the Debian packages buildah, mmdebstrap and
# an OCI runtime for the Dockerfile's RUN steps (buildah only recommends one), which it installs
# when missing. The image's Python packages are the lock's (requirements/runtime.lock, hashed),
# whatever Python runs this script: the versions the tests ran with, not this shell's `pip freeze`.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[build-image] $*" >&2; }

SUITE=bookworm
BASE_PACKAGES="python3,python3-venv,ca-certificates"
BASE_RECIPE_VERSION=1   # bump when the base recipe below changes in a way the key cannot see
# Read without Python: whatever python3 this shell has (or none) must not matter.
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)"
IMAGE="${IMAGE:-impalajob:$VERSION}"
CACHE="${IMPALA_IMAGE_CACHE:-$HOME/.cache/impalajob/image}"
mkdir -p "$CACHE"

# One builder at a time per cache (CI's setup and a developer's shell may overlap).
exec 8>"$CACHE/.lock"
command -v flock >/dev/null 2>&1 && flock 8

need=()
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
# buildah runs each RUN step with an OCI runtime it only recommends: without one the first RUN
# fails with "error running container ... exit status 1".
command -v runc >/dev/null 2>&1 || command -v crun >/dev/null 2>&1 || need+=(runc)
if [ ${#need[@]} -gt 0 ]; then
  log "installing Debian packages: ${need[*]}"
  sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends \
    "${need[@]}" >/dev/null
fi

# --- what goes into the image, hashed -----------------------------------------------------------
# The same files the Dockerfile copies (.dockerignore's allow-list), read from the work tree so an
# uncommitted change is built too.
sources() {
  printf '%s\n' Dockerfile .dockerignore pyproject.toml README.md requirements/runtime.lock
  find api trainer operator cli -type f ! -name '*.pyc' ! -path '*/__pycache__/*' ! -path '*.egg-info/*' \
    | LC_ALL=C sort
}
base_key="$(printf '%s %s %s' "$SUITE" "$BASE_PACKAGES" "$BASE_RECIPE_VERSION" | sha256sum | cut -c1-12)"
tree_key="$( { echo "$IMAGE $base_key"; sources | xargs -d '\n' sha256sum; } | sha256sum | cut -c1-16)"
archive="$CACHE/${IMAGE//[:\/]/_}-$tree_key.oci.tar"
if [[ -f "$archive" ]]; then
  log "cached: $archive"
  echo "$archive"
  exit 0
fi

# --- buildah storage (outside the repo, persistent: it holds the layer cache) --------------------
source hack/buildah-storage.sh   # sets B: buildah on "$CACHE"'s storage
t0=$SECONDS

# --- base: Debian bookworm with Python 3.11, made by mmdebstrap ----------------------------------
base_ref="localhost/impalajob-base:$SUITE-$base_key"
if ! "${B[@]}" inspect --type image "$base_ref" >/dev/null 2>&1; then
  log "making the $SUITE base with mmdebstrap ($BASE_PACKAGES)"
  tmp="$(mktemp -d)"
  # minbase: essential + apt; the docs, man pages and locales are dropped (nothing reads them).
  mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "$SUITE" "$tmp/base.tar" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"}
  ctr="$("${B[@]}" from scratch)"
  "${B[@]}" add "$ctr" "$tmp/base.tar" /
  "${B[@]}" config --cmd /bin/bash --env LANG=C.UTF-8 "$ctr"
  "${B[@]}" commit --quiet --rm "$ctr" "$base_ref" >/dev/null
  rm -rf "$tmp"
fi

# --- wheelhouse: the lock's wheels, for the image's pip ------------------------------------------
# The host's pip downloads the lock's wheels for the image's platform (bookworm: CPython 3.11,
# glibc 2.36), whatever Python runs this script, checking every hash; the image's pip then
# installs from there alone. On a machine that just ran `pip install` the big wheels come from
# pip's cache, and the image's pip needs no network, which it may not have (a TLS-intercepting
# proxy's CA is the host's, not the base image's). If the download fails, the image's pip takes
# the same hashed lock from the index, as under Docker.
LOCK=requirements/runtime.lock
wheels="$CACHE/wheels"
mkdir -p "$wheels"
pip_flags=""
platforms=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
for glibc in $(seq 36 -1 5); do platforms+=(--platform "manylinux_2_${glibc}_x86_64"); done
# pip checks ~130 hashes in ~40 s: skipped while the lock is the one last downloaded.
stamp="$wheels/.complete-$(sha256sum "$LOCK" | cut -c1-16)"
if [[ -f "$stamp" ]]; then
  pip_flags="--no-index --find-links=/wheels"
elif python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps \
    "${platforms[@]}" --python-version 3.11 --implementation cp --abi cp311 \
    --require-hashes -r "$LOCK" -d "$wheels" >&2; then
  rm -f "$wheels"/.complete-*; touch "$stamp"
  pip_flags="--no-index --find-links=/wheels"
else
  log "pip download failed; the image's pip takes the lock from the index"
fi

# --- the image: the Dockerfile, layer-cached -----------------------------------------------------
t_wheels=$SECONDS
log "wheelhouse ready in $((t_wheels - t0)) s; building $IMAGE from the Dockerfile on $base_ref ($driver storage)"
"${B[@]}" build --quiet --layers --network host \
  --build-arg BASE_IMAGE="$base_ref" --build-arg PIP_INSTALL_FLAGS="$pip_flags" \
  --volume "$wheels:/wheels:ro" \
  -f Dockerfile -t "localhost/$IMAGE" . >&2

t_build=$SECONDS
# The export re-reads every layer from storage (~90 s for 3.2 GB; buildah 1.28 reuses no blob of
# an earlier export), which is most of what a code change costs.
export_archive "$IMAGE" "$archive"
# The images of old project builds (untagged, no children) go; the tagged base and the layer
# cache the current image is built on stay.
"${B[@]}" rmi --prune >/dev/null 2>&1 || true
log "built $IMAGE in $((SECONDS - t0)) s (export $((SECONDS - t_build)) s): $archive ($(du -h "$archive" | cut -f1))"
echo "$archive"
