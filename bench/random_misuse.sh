#!/usr/bin/env bash
# The randomized misuse test (tests/comm/test_random.cpp) with a long budget: many seeds, many
# episodes each. CI runs 40 episodes of seed 1; this is for hunting rare failures.
#   bench/random_misuse.sh [BUILD_DIR] [SEEDS] [EPISODES]
set -euo pipefail
build=${1:-build/main} seeds=${2:-20} episodes=${3:-2000}
for seed in $(seq 1 "$seeds"); do
  TRIDENT_RANDOM_SEED=$seed TRIDENT_RANDOM_EPISODES=$episodes "$build/tests/test_comm_random" >/tmp/trident_random_$seed.log 2>&1 ||
    { echo "seed $seed FAILED (log: /tmp/trident_random_$seed.log)"; exit 1; }
  grep -h "MESSAGE: legal calls" /tmp/trident_random_$seed.log | sed "s/^.*MESSAGE: /seed $seed: /"
done
echo "all $seeds seeds x $episodes episodes passed"
