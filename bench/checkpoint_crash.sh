#!/usr/bin/env bash
# Crash safety at length (issue 15): 100 kills by default of a training that saves after every
# step, each followed by a restart and a bit-for-bit check of the newest good checkpoint
# (tests/checkpoint/crash_safety.sh; ctest runs 8 of them).
#
#   bench/checkpoint_crash.sh [trials] [elements] [seed]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TRIDENT_BUILD:-$root/build/main}"
cmake --build "$build" --target checkpoint_crash_tool > /dev/null
exec "$root/tests/checkpoint/crash_safety.sh" "$build/tests/checkpoint_crash_tool" "${1:-100}" "${2:-1048576}" "${3:-2026}"
