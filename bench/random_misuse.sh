#!/usr/bin/env bash
# The randomized misuse tests with a long budget: many seeds, many episodes each. CI runs 40
# episodes of seed 1 of tests/comm/test_random.cpp and 12 of tests/zero/test_zero_random.cpp;
# this is for hunting rare failures (the ZeRO one runs EPISODES / 50 per seed: each trains five
# times).
#   bench/random_misuse.sh [BUILD_DIR] [SEEDS] [EPISODES]
set -euo pipefail
build=${1:-build/main} seeds=${2:-20} episodes=${3:-2000}
for seed in $(seq 1 "$seeds"); do
  TRIDENT_RANDOM_SEED=$seed TRIDENT_RANDOM_EPISODES=$episodes "$build/tests/test_comm_random" >/tmp/trident_random_$seed.log 2>&1 ||
    { echo "seed $seed FAILED (log: /tmp/trident_random_$seed.log)"; exit 1; }
  grep -h "MESSAGE: legal calls" /tmp/trident_random_$seed.log | sed "s/^.*MESSAGE: /seed $seed: /"
done
for seed in $(seq 1 "$seeds"); do
  TRIDENT_RANDOM_SEED=$seed TRIDENT_RANDOM_EPISODES=$((episodes / 50 + 1)) "$build/tests/test_zero_random" \
    >/tmp/trident_zero_random_$seed.log 2>&1 || { echo "zero seed $seed FAILED (log: /tmp/trident_zero_random_$seed.log)"; exit 1; }
done
echo "all $seeds seeds x $episodes episodes passed (zero: $((episodes / 50 + 1)) per seed)"
