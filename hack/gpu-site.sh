#!/usr/bin/env bash
# Packs what a lent GPU machine lacks to train locally (`impalajob train` on an embedded Ray) into
# .whl/site-cp<XY>.tar.gz: the same versions as this environment, for that machine's Python.
# The machine has torch and numpy and reaches no index, and what travels to it is capped at
# 64 MiB: Ray's wheel alone is 79 MB, 32 of them the Java workers' jar, so the jar and the Ray
# libraries training never imports (RLlib, Tune, Serve, Data, Train, the dashboard's web client)
# are left out.
#
#   bash hack/gpu-site.sh 3.12      # then carry .whl to the machine (hack/gpu-pong.sh unpacks it)
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
)
pins=()
for dist in "${dists[@]}"; do
  pins+=("$dist==$(python3 -c 'import sys, importlib.metadata as m; print(m.version(sys.argv[1]))' "$dist")")
done
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --target "$work/site" \
  --python-version "$py" --implementation cp --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 "${pins[@]}"
rm -rf "$work/site/bin" "$work/site/ray/jars" "$work/site/ray/rllib" "$work/site/ray/tune" \
  "$work/site/ray/serve" "$work/site/ray/data" "$work/site/ray/train" "$work/site/ray/llm" \
  "$work/site/ray/dashboard/client/build"
mkdir -p "$root/.whl"
tar -C "$work/site" -czf "$root/.whl/site-$tag.tar.gz" .
du -h "$root/.whl/site-$tag.tar.gz"
