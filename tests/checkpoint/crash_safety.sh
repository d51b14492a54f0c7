#!/usr/bin/env bash
# Crash safety of checkpoints: kill -9 a training that saves after every step, at random
# moments (usually mid-save), restart it from what it left, and check after each kill that the
# newest checkpoint that verifies equals training from scratch to its step, bit for bit.
#
#   tests/checkpoint/crash_safety.sh <crash_tool> <trials> [elements] [seed]
#
# ctest runs a few trials; bench/checkpoint_crash.sh runs 100. Fails on the first trial whose
# checkpoint loads wrongly or does not load although one completed before.
set -euo pipefail
tool=$1
trials=$2
elements=${3:-1048576}
RANDOM=${4:-12345}
work=$(mktemp -d "${TMPDIR:-/tmp}/trident_crash.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/ckpt"
completed=0   # saves reported complete so far (a later check must find one)
killed_mid=0
for ((t = 1; t <= trials; ++t)); do
  "$tool" save "$root" "$elements" > "$work/save.out" 2> "$work/save.err" &
  pid=$!
  # Between 0.05 and 1.5 s: past the start, and across several saves.
  sleep "$(printf '0.%03d' $((50 + RANDOM % 950)))"
  [[ $((RANDOM % 3)) -eq 0 ]] && sleep 0.5
  kill -9 "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  if grep -q "saved" "$work/save.out"; then completed=1; fi
  ls -a "$root" 2> /dev/null | grep -q '^\.tmp\.' && killed_mid=$((killed_mid + 1))
  set +e
  out=$("$tool" check "$root" "$elements" 2>&1)
  rc=$?
  set -e
  if [[ $rc -eq 3 && $completed -eq 0 ]]; then
    echo "trial $t: no checkpoint yet (killed before the first save completed)"
    continue
  fi
  if [[ $rc -ne 0 ]]; then
    echo "trial $t FAILED (check exit $rc):"
    echo "$out"
    echo "-- save's stderr:"
    cat "$work/save.err"
    exit 1
  fi
  echo "trial $t: $(head -1 <<< "$out")"
done
echo "crash safety: $trials trials, $killed_mid killed with a save in progress, every newest good checkpoint loaded bit for bit"
