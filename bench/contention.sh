#!/usr/bin/env bash
# Wall time of a program alone and beside 1..K busy loops (CPU hogs), to see how the thread
# backend's waits behave when ranks outnumber the free cores (as in CI, where ctest -j runs
# other tests and compilers beside it).
#
#   bench/contention.sh [-k max-hogs] PROGRAM [ARGS...]
#   bench/contention.sh -k 2 build/dev/tests/test_zero_local
set -euo pipefail
max=1
if [[ ${1:-} == -k ]]; then max=$2; shift 2; fi
[[ $# -ge 1 ]] || { echo "usage: $0 [-k max-hogs] PROGRAM [ARGS...]" >&2; exit 2; }
hogs=()
stop_hogs() { if ((${#hogs[@]})); then kill "${hogs[@]}" 2>/dev/null || true; wait 2>/dev/null || true; fi; hogs=(); }
trap stop_hogs EXIT
for ((k = 0; k <= max; ++k)); do
  stop_hogs
  for ((i = 0; i < k; ++i)); do (while :; do :; done) & hogs+=($!); done
  start=$(date +%s.%N)
  "$@" >/dev/null
  end=$(date +%s.%N)
  printf '%d busy loop(s) on %d cores: %6.2f s  %s\n' "$k" "$(nproc)" "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" "$*"
done
