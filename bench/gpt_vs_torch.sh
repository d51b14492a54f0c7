#!/usr/bin/env bash
# The flagship GPT against the same model written plainly in PyTorch (issue 13's "against
# PyTorch" acceptance), on the CPU in fp32:
#   1. losses: both start from trident's initial weights (bench/gpt_reference --dump-init) and
#      read the same synthetic shard; torch (one thread) and trident on several grids train 20
#      steps of tests/fixtures/gpt_torch_losses.txt's configuration, and every step's loss must
#      agree within 1e-4 (exit 1 otherwise);
#   2. speed: a larger model on the KJV text (scripts/prepare_data.py, when Debian's `bible` is
#      installed; a synthetic shard otherwise), tokens/s of trident on 1 and on THREADS thread
#      ranks (data-parallel) beside torch with 1 and THREADS threads, the same global batch.
#
#   bench/gpt_vs_torch.sh                    # both; THREADS = nproc by default
#   bench/gpt_vs_torch.sh --record-fixture   # first rewrites tests/fixtures/gpt_torch_losses.txt
#   SPEED=0 bench/gpt_vs_torch.sh            # the losses only
#   CBLAS=1 bench/gpt_vs_torch.sh            # also trident's GEMM on OpenBLAS (TRIDENT_HAS_CBLAS=1)
#
# The driver is built with g++ at the project's RelWithDebInfo flags into GPT_REFERENCE_BUILD
# (build/gpt-reference). torch comes from PyPI into the virtual environment of
# scripts/reference/make_fixtures.sh (build/tools/reference, or TRIDENT_REFERENCE_VENV), installed
# there if missing. Measure on a quiet machine: the load average is printed before every run.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TRIDENT_REFERENCE_VENV:-$root/build/tools/reference}"
python="${PYTHON:-python3}"
out="${GPT_REFERENCE_BUILD:-$root/build/gpt-reference}"
threads="${THREADS:-$(nproc)}"
speed_steps="${SPEED_STEPS:-12}"
TORCH_VERSION=2.15.0  # as scripts/reference/make_fixtures.sh
record=0
[[ "${1:-}" == "--record-fixture" ]] && record=1

if ! "$venv/bin/python" -c "import torch, numpy" 2>/dev/null; then
  [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet "torch==$TORCH_VERSION" numpy
fi
torch_py() {
  # AVX2 kernels as the other fixtures (tests/fixtures/README.md); warnings (CUDA) are noise here.
  ATEN_CPU_CAPABILITY=avx2 "$venv/bin/python" -W ignore "$root/bench/gpt_torch.py" "$@"
}

mkdir -p "$out"
build_driver() {  # $1: binary, then extra flags
  local bin="$1"
  shift
  if [[ ! -x "$bin" ]] || [[ -n "$(find "$root/bench/gpt_reference.cpp" "$root/examples/01_flagship" "$root/include" -newer "$bin" -print -quit)" ]]; then
    echo "== building $bin"
    nice -n 19 g++ -std=c++20 -O2 -g -DNDEBUG -Wall -Wextra -Wpedantic -Werror -I"$root/include" -I"$root/examples" \
      "$root/bench/gpt_reference.cpp" -pthread "$@" -o "$bin"
  fi
}
driver="$out/gpt_reference"
build_driver "$driver"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== $0 $*"
echo "== $(date)   $(uname -n)   $(lscpu | sed -n 's/^Model name: *//p')   $(nproc) cores ($(lscpu | sed -n 's/^Thread(s) per core: *//p') threads per core)"
echo "== $(g++ --version | head -1); torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')"

# Max |a - b| over the losses of two runs' "step" lines (column 4), and that both have N steps.
max_diff() {
  awk -v steps="$3" 'FNR == 1 { f++ } $1 == "step" { v[f, $2] = $4; n[f]++ }
    END { if (n[1] != steps || n[2] != steps) { print "steps", n[1], n[2]; exit 1 }
          m = 0; for (s = 1; s <= steps; s++) { d = v[1, s] - v[2, s]; if (d < 0) d = -d; if (d > m) m = d }
          printf "%.3g\n", m }' "$1" "$2"
}

# ---- 1. losses: the fixture's configuration ------------------------------------------------------
model=(--vocab 32 --seq 8 --hidden 16 --heads 4 --layers 4 --ffn 32)
optim=(--micro-batch 2 --steps 20 --lr 0.01 --warmup 5 --beta1 0.9 --beta2 0.95 --eps 1e-8 --weight-decay 0.1 --max-grad-norm 0.5)
seed=1234 shard_tokens=20000 shard_seed=7 accumulation=4
"$driver" "${model[@]}" --seed $seed --write-shard "$work/small.bin" --shard-tokens $shard_tokens --shard-seed $shard_seed \
  --dump-init "$work/small.safetensors" >/dev/null
fields="seed $seed shard synthetic shard_tokens $shard_tokens shard_vocab 32 shard_seed $shard_seed"
fixture="$root/tests/fixtures/gpt_torch_losses.txt"
if ((record)); then
  torch_py "${model[@]}" "${optim[@]}" --accumulation $accumulation --threads 1 --init "$work/small.safetensors" \
    --data "$work/small.bin" --fixture "$fixture" --fixture-fields "$fields" >"$work/torch_small.txt"
  echo "== recorded $fixture"
else
  torch_py "${model[@]}" "${optim[@]}" --accumulation $accumulation --threads 1 --init "$work/small.safetensors" \
    --data "$work/small.bin" >"$work/torch_small.txt"
fi
if [[ -f "$fixture" ]]; then
  # The fixture as step lines, to compare this machine's torch with the recorded one.
  awk 'NR > 2 { print "step", $1, "loss", $2 }' "$fixture" >"$work/fixture.txt"
  echo "torch now against the recorded fixture: max |loss diff| $(max_diff "$work/torch_small.txt" "$work/fixture.txt" 20)"
fi
failed=0
echo "losses over 20 steps, trident against torch (1 thread), max |diff| (tolerance 1e-4):"
# (d, t, p) ZeRO-stage: d data-parallel ranks run accumulation / d micro-batches each.
for grid in "1 1 1 0" "2 1 1 1" "1 2 2 2" "2 2 2 3"; do
  read -r d t p z <<<"$grid"
  "$driver" "${model[@]}" "${optim[@]}" --seed $seed --accumulation $((accumulation / d)) --ranks $((d * t * p)) --tensor "$t" \
    --pipeline "$p" --zero "$z" --data "$work/small.bin" >"$work/trident_$d$t$p.txt"
  diff=$(max_diff "$work/trident_$d$t$p.txt" "$work/torch_small.txt" 20)
  ok=$(awk -v x="$diff" 'BEGIN { print (x + 0 <= 1e-4) ? "ok" : "FAILED" }')
  [[ "$ok" == ok ]] || failed=1
  printf '  (d, t, p) = (%s, %s, %s) ZeRO-%s   %s   %s\n' "$d" "$t" "$p" "$z" "$diff" "$ok"
done
if ((failed)); then
  echo "trident's losses are not within 1e-4 of torch's; the runs:"
  paste "$work/trident_111.txt" "$work/torch_small.txt"
  exit 1
fi
[[ "${SPEED:-1}" == 0 ]] && exit 0

# ---- 2. speed -----------------------------------------------------------------------------------
if [[ -n "${SPEED_DATA:-}" ]]; then
  data="$SPEED_DATA"
elif command -v bible >/dev/null; then
  "$python" "$root/scripts/prepare_data.py" --out "$work" >/dev/null
  data="$work/kjv_train.bin"
else
  "$driver" --vocab 256 --write-shard "$work/speed.bin" --shard-tokens 2000000 --shard-seed 7 >/dev/null
  data="$work/speed.bin"
fi
model=(--vocab 256 --seq 128 --hidden 128 --heads 4 --layers 4 --ffn 512)
optim=(--micro-batch 8 --steps "$speed_steps" --lr 1e-3 --warmup 4 --max-grad-norm 1.0 --timing-warmup 2)
"$driver" "${model[@]}" --seed $seed --dump-init "$work/speed.safetensors" >/dev/null
if [[ "${CBLAS:-0}" == 1 ]]; then
  build_driver "$out/gpt_reference_openblas" -DTRIDENT_HAS_CBLAS=1 -lopenblas
fi
# The global batch: THREADS micro-batches of 8 x 128 tokens per step, read in the same order by
# every run (torch as THREADS data-parallel ranks of one micro-batch each).
echo "speed: $(basename "$data"), ${model[*]}, $threads x 8 x 128 tokens per step, $speed_steps steps (the first 2 not timed)"
rate() { sed -n 's/^tokens_per_second \([0-9.]*\).*/\1/p' "$1"; }
for n in 1 "$threads"; do
  echo "  load average before trident, $n thread ranks: $(cut -d' ' -f1-3 /proc/loadavg)"
  OPENBLAS_NUM_THREADS=1 "$driver" "${model[@]}" "${optim[@]}" --seed $seed --ranks "$n" --accumulation $((threads / n)) \
    --data "$data" >"$work/speed_trident_$n.txt"
  if [[ "${CBLAS:-0}" == 1 ]]; then
    OPENBLAS_NUM_THREADS=1 "$out/gpt_reference_openblas" "${model[@]}" "${optim[@]}" --seed $seed --ranks "$n" \
      --accumulation $((threads / n)) --data "$data" >"$work/speed_blas_$n.txt"
  fi
  echo "  load average before torch, $n threads: $(cut -d' ' -f1-3 /proc/loadavg)"
  OMP_NUM_THREADS=$n torch_py "${model[@]}" "${optim[@]}" --threads "$n" --data-ranks "$threads" --accumulation 1 \
    --init "$work/speed.safetensors" --data "$data" >"$work/speed_torch_$n.txt"
done
printf '  %-34s %14s %14s\n' "threads (trident: thread ranks)" "trident tok/s" "torch tok/s"
for n in 1 "$threads"; do
  printf '  %-34s %14s %14s' "$n" "$(rate "$work/speed_trident_$n.txt")" "$(rate "$work/speed_torch_$n.txt")"
  [[ "${CBLAS:-0}" == 1 ]] && printf '   (trident on OpenBLAS: %s)' "$(rate "$work/speed_blas_$n.txt")"
  printf '   losses max |diff| %s\n' "$(max_diff "$work/speed_trident_$n.txt" "$work/speed_torch_$n.txt" "$speed_steps")"
done
