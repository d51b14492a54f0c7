#!/usr/bin/env bash
# Communication-efficient training across a slow link (issue 16), in one run: the flagship GPT on
# 8 thread ranks in two clusters of 4 joined by one simulated link (100 ms, 1 MB/s per flow: the
# model's 3.3 MB of fp32 gradients take seconds to cross), 200 steps of the same samples with each
# method (bench/comm_efficient.cpp); DiLoCo and 1-bit Adam also for 400 steps, for the time to a
# target loss. Then bench/comm_efficient.py: validation losses against plain data parallelism
# (no more than 2% worse?), the runs without error feedback beside theirs, bytes across the
# link, simulated time to the target, and loss against simulated time as an SVG.
#
#   bench/comm_efficient.sh [out dir = build/comm-efficient] [steps = 200]     (about 35 minutes on 2 cores)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/build/comm-efficient}"
steps="${2:-200}"
build="${TRIDENT_BUILD:-$root/build/main}"
cmake --build "$build" --target comm_efficient > /dev/null
[[ -f $root/build/data/kjv_train.bin ]] || python3 "$root/scripts/prepare_data.py" --out "$root/build/data"
mkdir -p "$out"
echo "== $(date -u '+%Y-%m-%d %H:%M') $(uname -n), $(nproc) cores; $steps steps per method"
run() { "$build/bench/comm_efficient" --data "$root/build/data" --out "$out" "$@" | tee -a "$out/results.txt"; }
: > "$out/results.txt"
run --steps "$steps" --method dp
run --steps "$steps" --method hierarchical
run --steps "$steps" --method bf16
run --steps "$steps" --method powersgd --rank 16 --warmup 20
run --steps "$steps" --method powersgd --rank 16 --warmup 20 --no-error-feedback
run --steps "$steps" --method powersgd --rank 4 --warmup 20
run --steps "$steps" --method onebit --warmup 50
run --steps "$steps" --method onebit --warmup 50 --no-error-feedback
run --steps "$steps" --method onebit-adam --warmup 50
run --steps "$steps" --method onebit-adam --warmup 50 --no-error-feedback
run --steps "$steps" --method diloco --inner 10 --outer-lr 1 --outer-momentum 0
run --steps "$steps" --method diloco --inner 50
run --steps "$steps" --method diloco --inner 100
run --steps $((2 * steps)) --method diloco --inner 50 --tag long
run --steps $((2 * steps)) --method onebit-adam --warmup 100 --tag long
python3 "$root/bench/comm_efficient.py" "$out"
