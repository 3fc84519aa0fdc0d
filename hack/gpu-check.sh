#!/usr/bin/env bash
# The CUDA path on a GPU machine that already has torch (CI has no GPU): the learner tests,
# test_learner_cuda.py among them, then bench/learner_only.py with the learner on the CPU and on
# cuda:0 of the same machine, and against RLlib's learners on the same GPU where Ray travels.
# Results go to $OUT (default /tmp/gpu-check).
#
# What the machine lacks travels in .whl/: site-cp<XY>.tar.xz from `bash hack/gpu-site.sh X.Y`
# (Ray and RLlib, for the `*-rllib` cases) or plain wheels (docs/testing.md, "The CUDA path"); the
# learner and its threads run without Ray.
#
#   CASES="cnn-rllib cnn-fp32" bash hack/gpu-check.sh      # a subset; the default runs them all
#   CASES=none TESTS=tests/unit/trainer/test_learner_cuda.py bash hack/gpu-check.sh  # tests only
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
CASES=${CASES:-cpu cuda cuda-stacks cnn4k-cpu cnn4k-cuda cnn-cuda cnn-cuda-separate cnn-rllib cnn-fp32 cnn4k-rllib}
mkdir -p "$OUT"
tag=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
if [ -f ".whl/site-$tag.tar.xz" ]; then
  mkdir -p /tmp/site && tar -C /tmp/site -xJf ".whl/site-$tag.tar.xz" || exit 1
  export PYTHONPATH=/tmp/site
fi
if compgen -G ".whl/*.whl" >/dev/null; then  # beside the site or instead of it
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/api:$PWD/trainer:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())' \
  | tee -a "$OUT/gpu.txt"

t=tests/unit/trainer
TESTS=${TESTS:-$t/test_learner_cuda.py $t/test_learner.py $t/test_learner_thread.py \
$t/test_multi_gpu_learner_thread.py $t/test_learner_process.py $t/test_losses.py $t/test_vtrace.py}
# shellcheck disable=SC2086  # TESTS is a list of paths
python3 -m pytest -q -p no:cacheprovider -rs --durations=5 $TESTS 2>&1 | tee "$OUT/pytest.log" \
  | tail -15

seconds=${SECONDS_PER_CASE:-6}
bench() {  # NAME SIDES, then learner_only.py's options
  local name=$1 sides=$2
  shift 2
  case " $CASES " in *" $name "*) ;; *) return ;; esac
  echo "== $name: $*"
  timeout "${CASE_TIMEOUT:-600}" python3 bench/learner_only.py --sides "$sides" --runs 1 \
    --seconds "$seconds" --warmup 3 --json-out "$OUT/learner-$name.json" "$@" 2>&1 \
    | grep -E '^\||^\[|rror' \
    | tee "$OUT/learner-$name.txt"
}
gpu=(--set learner.gpus=1)
# The learner on the CPU (torch threads: every core) and on cuda:0 (precision as the example asks).
bench cpu ours
bench cuda ours "${gpu[@]}"
# Batches loaded on a side stream while the last one trains.
bench cuda-stacks ours "${gpu[@]}" --set training.numMultiGpuTowerStacks=2
# A GPU learner's usual batch.
bench cnn4k-cpu ours --models cnn --set training.trainBatchSize=4000
bench cnn4k-cuda ours --models cnn --set training.trainBatchSize=4000 "${gpu[@]}"
# The example's CNN batch on cuda:0, the learner in the driver's process and in its own.
bench cnn-cuda ours --models cnn "${gpu[@]}"
bench cnn-cuda-separate ours --models cnn "${gpu[@]}" --set learner.process=separate
# Against RLlib's old-stack LearnerThread and new-stack Learner on the same GPU (float32 there).
bench cnn-rllib ours,rllib_old,rllib --models cnn "${gpu[@]}"
bench cnn-fp32 ours --models cnn "${gpu[@]}" --set learner.precision=float32
bench cnn4k-rllib ours,rllib_old,rllib --models cnn --set training.trainBatchSize=4000 "${gpu[@]}"
exit 0
