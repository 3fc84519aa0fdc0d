#!/usr/bin/env bash
# Every trainer-vs-RLlib scenario at its documented length, in the order the doc needs them
# (the rollout ceiling reads the CartPole throughput results), then the doc tables.
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
run bench/render_doc.py
echo "== $(date +%H:%M:%S) done (load: $(cut -d' ' -f1-3 /proc/loadavg))"
