#!/usr/bin/env bash
# trident's host optimizer steps beside torch's fused CPU optimizers and a streaming kernel that
# moves the same bytes, with the same thread count, alternating ours and torch's, in one table
# (issue 10's goal: AdamW faster than torch and >= 90% of the stream's bandwidth).
#
#   bench/optim_vs_torch.sh                  # 5 rounds; TRIDENT_BUILD=build/main by default
#   ROUNDS=5 MIN_TIME=2 bench/optim_vs_torch.sh
#   N=67108864 bench/optim_vs_torch.sh        # 64M parameters (the offload engine's figure, issue 14)
#
# torch comes from PyPI into the virtual environment of scripts/reference/make_fixtures.sh
# (build/tools/reference, or TRIDENT_REFERENCE_VENV), installed there if missing: the same pinned
# version; PyPI's Linux wheel pulls the CUDA libraries (about 5 GB installed) although only the
# CPU is used. Measure on a quiet machine: the load average is printed with every round.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/common.sh"
venv="${TRIDENT_REFERENCE_VENV:-$root/build/tools/reference}"
python="${PYTHON:-python3}"
rounds="${ROUNDS:-5}"
min_time="${MIN_TIME:-0.5}"
n="${N:-16777216}"
TORCH_VERSION=2.15.0  # as scripts/reference/make_fixtures.sh

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet "torch==$TORCH_VERSION"
fi

trident_configure -DTRIDENT_BUILD_BENCHMARKS=ON >/dev/null
trident_build --target bench_optim >/dev/null
bench="$TRIDENT_BUILD/bench/bench_optim"

# Our step uses hardware_concurrency threads of the program's pool (above 2^18 elements, at
# least 2^16 each); torch gets as many.
threads=$(nproc)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== $(date)   $(uname -n)   $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')   $threads threads"
for ((r = 1; r <= rounds; ++r)); do
  mkdir -p "$work/$r"
  echo "round $r: load average before ours: $(cut -d' ' -f1-3 /proc/loadavg)"
  TRIDENT_BENCH_OPTIM_N=$n "$bench" --benchmark_min_time="$min_time" --benchmark_format=json --benchmark_out="$work/$r/ours.json" \
    --benchmark_out_format=json >/dev/null
  echo "round $r: load average before torch: $(cut -d' ' -f1-3 /proc/loadavg)"
  OMP_NUM_THREADS=$threads "$venv/bin/python" -W ignore "$root/bench/optim_torch_cpu.py" run --threads "$threads" --n "$n" \
    >"$work/$r/torch.json" 2>/dev/null
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$python" "$root/bench/optim_torch_cpu.py" table "$work"/*/
