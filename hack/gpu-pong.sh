#!/usr/bin/env bash
# The Pong example with its learner on cuda:0, on a lent GPU machine (CI has no GPU), then the same
# run with the learner on the CPU for a shorter window: env steps/s side by side and the GPU run's
# return curve. Needs .whl/site-cp<XY>.tar.xz from `bash hack/gpu-site.sh X.Y` (Ray and the rest
# of what the machine lacks; it has torch). Results go to $OUT (default /tmp/gpu-pong).
# GPU_PROCESSES runs the GPU learner once per `learner.process` named, back to back.
#
#   WORKERS=12 GPU_SECONDS=300 CPU_SECONDS=120 bash hack/gpu-pong.sh
#   GPU_PROCESSES="driver separate" GPU_SECONDS=120 CPU_SECONDS=0 bash hack/gpu-pong.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-pong}
PYTHON=${PYTHON:-python3}
WORKERS=${WORKERS:-$(($(nproc) - 4))}
GPU_SECONDS=${GPU_SECONDS:-300}
CPU_SECONDS=${CPU_SECONDS:-120}
GPU_PROCESSES=${GPU_PROCESSES:-driver}
mkdir -p "$OUT"
tag=$($PYTHON -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
if [ -f ".whl/site-$tag.tar.xz" ]; then
  if [ ! -d /tmp/site/ray ]; then  # unpacked already where gpu-check.sh ran first
    mkdir -p /tmp/site && tar -C /tmp/site -xJf ".whl/site-$tag.tar.xz" || exit 1
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/api:$PWD/trainer:$PWD/cli${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0

# Everything a run imports, before Ray starts: a missing package costs seconds, not a run.
$PYTHON -c 'import impala_cli.main, impala_cli.commands.train, impala_cli.commands.progress
import impala_trainer.driver.launch, impala_trainer.rollouts.worker
import impala_trainer.learners.multi_gpu_learner_thread, ale_py, ray, torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "ray", ray.__version__)' \
  2>&1 | tee "$OUT/versions.txt" || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | tee -a "$OUT/versions.txt"
echo "cpus $(nproc), rollout workers $WORKERS" | tee -a "$OUT/versions.txt"

train() {  # NAME SECONDS GPUS PROCESS
  local run=/tmp/pong-$1
  rm -rf "$run"
  timeout $(($2 + 120)) $PYTHON -m impala_cli.main train -f manifests/examples/pong.yaml \
    --run-dir "$run" --num-rollout-workers "$WORKERS" --set "learner.gpus=$3" \
    --set "learner.process=$4" --set "stop.timeLimitSeconds=$2" > "$OUT/$1.log" 2>&1
  echo "$1: exit $?" | tee -a "$OUT/versions.txt"
  cp "$run/summary.json" "$OUT/$1-summary.json" 2>/dev/null
  cp "$run/history.jsonl" "$OUT/$1-history.jsonl" 2>/dev/null
  tail -3 "$OUT/$1.log"
}
if [ "$GPU_SECONDS" -gt 0 ]; then
  for process in $GPU_PROCESSES; do
    name=gpu
    [ "$GPU_PROCESSES" = driver ] || name=gpu-$process
    train "$name" "$GPU_SECONDS" 1 "$process"
  done
fi
[ "$CPU_SECONDS" -gt 0 ] && train cpu "$CPU_SECONDS" 0 driver
exit 0
