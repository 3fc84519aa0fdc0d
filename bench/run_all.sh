#!/usr/bin/env bash
# Every trainer-vs-RLlib scenario at its documented length, in the order the doc needs them
# (the rollout ceiling reads the CartPole throughput results), then publishes them: their tables
# in docs/benchmarks.md (bench/render_doc.py --publish, which updates bench/published.json).
# About 3 hours on the shared 2-core machine. Extra arguments go to every script.
set -uo pipefail
cd "$(dirname "$0")/.."
run() { echo "== $(date +%H:%M:%S) $* (load: $(cut -d' ' -f1-3 /proc/loadavg))"; nice python "$@"; }
run bench/cartpole_throughput.py "$@"
run bench/rollout_ceiling.py "$@"
run bench/cartpole_time_to_return.py "$@"
run bench/learner_only.py "$@"
run bench/pong_throughput.py "$@"
run bench/cpu_budget.py --seconds 90 "$@"
run bench/cpu_budget.py --manifest pong --seconds 150 "$@"
run bench/multi_agent_spread.py "$@"
# Fixed lengths (1M env steps a side, ~12 min each): the marks are env steps, not seconds.
run bench/mujoco_vs_rllib.py --env HalfCheetah-v5 --steps 1000000
run bench/mujoco_vs_rllib.py --env Hopper-v5 --steps 1000000
run bench/render_doc.py --publish cartpole_throughput rollout_ceiling cartpole_time_to_return \
  learner_only pong_throughput cpu_budget_cartpole cpu_budget_pong multi_agent_spread \
  mujoco_halfcheetah mujoco_hopper
echo "== $(date +%H:%M:%S) done (load: $(cut -d' ' -f1-3 /proc/loadavg))"
