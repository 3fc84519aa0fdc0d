#!/usr/bin/env bash
# Re-resolve the lock files from pyproject.toml (uv pip compile):
#   requirements/runtime.lock  the image's packages, every one pinned and hashed (hack/build-image.sh
#                              installs exactly these, --require-hashes): the product's and its
#                              `multiagent` and `mujoco` extras' (PettingZoo and MuJoCo envs run in
#                              the image as is);
#   requirements/dev.lock      the test environment's (`.[dev]`): tests/run.sh installs with it as
#                              constraints, so the tests run the versions the image ships.
# Both target the image's platform (CPython 3.11, x86_64 glibc); the versions already locked are
# kept unless pyproject.toml no longer allows them. `bash hack/lock.sh --upgrade` moves every
# package to its newest allowed version; `--upgrade-package torch` one of them.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet uv
target=(--python-version 3.11 --python-platform x86_64-manylinux_2_28)
uv pip compile --quiet pyproject.toml --extra multiagent --extra mujoco "${target[@]}" --generate-hashes \
  -o requirements/runtime.lock "$@"
# The runtime's pins bind the dev lock too: the same torch, Ray, ... in the tests as in the image.
uv pip compile --quiet pyproject.toml --extra dev "${target[@]}" -c requirements/runtime.lock \
  -o requirements/dev.lock "$@"
