#!/usr/bin/env bash
# The CUDA path on a GPU machine that already has torch (CI has no GPU): the learner tests,
# test_learner_cuda.py among them, then bench/learner_only.py with the learner on the CPU and on
# cuda:0 of the same machine. Results go to $OUT (default /tmp/gpu-check).
#
# Packages the machine lacks travel as wheels in .whl/ (docs/testing.md, "The CUDA path"); Ray is
# not needed: the learner and its threads run without it.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/api:$PWD/trainer:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())' \
  | tee -a "$OUT/gpu.txt"

python3 -m pytest -q -p no:cacheprovider -rs \
  tests/unit/trainer/test_learner_cuda.py tests/unit/trainer/test_learner.py \
  tests/unit/trainer/test_learner_thread.py tests/unit/trainer/test_multi_gpu_learner_thread.py \
  tests/unit/trainer/test_losses.py tests/unit/trainer/test_vtrace.py 2>&1 | tee "$OUT/pytest.log" \
  | tail -15

seconds=${SECONDS_PER_CASE:-6}
bench() {  # NAME, then --set overrides
  local name=$1
  shift
  timeout 200 python3 bench/learner_only.py --sides ours --runs 1 --seconds "$seconds" \
    --warmup 3 --json-out "$OUT/learner-$name.json" "$@" 2>&1 | grep -E '^\|' \
    | tee "$OUT/learner-$name.txt"
}
echo "== learner on the CPU (torch threads: $(nproc) cores)"
bench cpu
echo "== learner on cuda:0"
bench cuda --set learner.gpus=1
echo "== learner on cuda:0, 2 tower stacks (batches loaded on a side stream)"
bench cuda-stacks --set learner.gpus=1 --set training.numMultiGpuTowerStacks=2
echo "== CNN, trainBatchSize 4000 (a GPU learner's usual batch), CPU then cuda:0"
bench cnn4k-cpu --models cnn --set training.trainBatchSize=4000
bench cnn4k-cuda --models cnn --set training.trainBatchSize=4000 --set learner.gpus=1
