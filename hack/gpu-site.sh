#!/usr/bin/env bash
# Packs what a lent GPU machine lacks to train locally (`impalajob train` on an embedded Ray) and to
# run RLlib's side of bench/ into .whl/site-cp<XY>.tar.xz: the same versions as this environment,
# for that machine's Python. The machine has torch, numpy, pandas, pyarrow and scipy and reaches no
# index, and what travels to it is capped at 64 MiB. Ray's wheel alone is 79 MB: 32 of them are
# the Java workers' jar (left out, with Serve, the C++ API and the dashboard's web client), and
# most of the rest is three native binaries with their symbol tables, which `strip
# --strip-unneeded` drops (the dynamic symbols they link by stay). xz then packs it all in ~30 MB.
#
#   bash hack/gpu-site.sh 3.12      # then carry .whl (hack/gpu-check.sh, gpu-pong.sh unpack it)
set -euo pipefail
py=${1:?usage: gpu-site.sh PYTHON_VERSION (e.g. 3.12)}
tag=cp${py/./}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

dists=(
  ray click jsonschema jsonschema-specifications referencing rpds-py attrs msgpack protobuf pyyaml
  requests urllib3 idna certifi charset-normalizer packaging filelock
  gymnasium farama-notifications cloudpickle ale-py
  pydantic pydantic-core annotated-types typing-inspection typing-extensions
  rich markdown-it-py mdurl pygments
  dm-tree lz4 ormsgpack tensorboardX  # RLlib's, beyond what the machine has
)
pinned() {  # DIST... -> DIST==VERSION as installed here
  python3 -c 'import sys, importlib.metadata as m; print(*(f"{d}=={m.version(d)}" for d in sys.argv[1:]))' "$@"
}
read -ra pins <<< "$(pinned "${dists[@]}")"
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --target "$work/site" \
  --python-version "$py" --implementation cp --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 "${pins[@]}"
rm -rf "$work/site/bin" "$work/site/ray/jars" "$work/site/ray/serve" "$work/site/ray/llm" \
  "$work/site/ray/cpp" "$work/site/ray/dashboard/client/build"
strip --strip-unneeded "$work/site/ray/_raylet.so" "$work/site/ray/core/src/ray/gcs/gcs_server" \
  "$work/site/ray/core/src/ray/raylet/raylet"
mkdir -p "$root/.whl"
rm -f "$root/.whl/site-$tag".tar.*
tar -C "$work/site" -cf - . | xz -T0 -6 > "$root/.whl/site-$tag.tar.xz"
# The test runner as wheels beside it, the versions the suite runs with here (gpu-check.sh
# installs them over the machine's own).
read -ra test_pins <<< "$(pinned pytest pluggy iniconfig)"
rm -f "$root"/.whl/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
  --implementation cp -d "$root/.whl" "${test_pins[@]}"
du -h "$root/.whl/site-$tag.tar.xz" "$root"/.whl/*.whl
