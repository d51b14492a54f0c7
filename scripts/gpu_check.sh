#!/usr/bin/env bash
# scripts/gpu_check.sh — everything that needs a GPU, in one command (under 10 minutes on one
# H100): builds for the GPU it finds, runs every CUDA and NCCL test (NCCL with 2 and 4 ranks
# sharing the one GPU over NCCL's socket transport, see ../shared/GPU.md), runs the GPU
# benchmarks (fused AdamW against the device's copy bandwidth and against PyTorch, gradient
# statistics against CUB's DeviceReduce, the NCCL wrapper against raw NCCL), and prints one
# summary table. Logs go to $OUT/gpu_check when $OUT is set (the device tool brings that folder
# back), else to build/gpu/logs.
#
#   bash scripts/gpu_check.sh            # exits non-zero when any step failed
#   TRIDENT_GPU_CHECK_BUILD_ONLY=1 bash scripts/gpu_check.sh   # no GPU needed: configure + build
#   TRIDENT_GPU_CHECK_PREBUILT=1 bash scripts/gpu_check.sh      # run what a build-only run left in
#                                                               # $TRIDENT_GPU_BUILD (see below)
#   TRIDENT_GPU_CHECK_ONLY='gpt' bash scripts/gpu_check.sh      # only the steps whose names match
#                                                               # this extended regex (a re-run)
#
# To spend the GPU's time on running rather than compiling, build here with BUILD_ONLY, stage the
# binaries with scripts/gpu_stage.sh and run PREBUILT there (the command is in that script).
#
# Nothing is installed: the GPU machine has the toolchain, the libraries and PyTorch already.
# Every later feature with a CUDA path adds its tests (labels gpu/cuda/nccl are picked up by
# ctest) and, where it has one, its benchmark step below.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TRIDENT_GPU_BUILD:-$root/build/gpu}
logs=${OUT:+$OUT/gpu_check}
logs=${logs:-$build/logs}
mkdir -p "$logs"
jobs=${TRIDENT_JOBS:-$(nproc)}
export PATH="$PATH:/usr/local/cuda/bin"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_SOCKET_IFNAME=lo

summary=()   # "step|status|seconds|figure"
failed=0
step() {  # step NAME FIGURE_COMMAND -- COMMAND...: runs COMMAND, logs it, records a row
  local name=$1 figure_cmd=$2
  shift 3
  local log="$logs/${name//[^A-Za-z0-9_.-]/_}.log" start=$SECONDS status
  if [[ -n ${TRIDENT_GPU_CHECK_ONLY:-} && $name != build && $name != configure ]] && ! grep -qE "$TRIDENT_GPU_CHECK_ONLY" <<<"$name"; then
    return 0   # not asked for in this run (no row)
  fi
  echo "== $name: $*"
  timeout "${TRIDENT_GPU_STEP_TIMEOUT:-900}" "$@" >"$log" 2>&1   # a hang costs one step, not the lease
  status=$?
  local seconds=$((SECONDS - start)) verdict=pass figure=""
  if [[ $status -eq 77 ]]; then verdict=skip
  elif [[ $status -ne 0 ]]; then verdict="FAIL($status)"; failed=1; tail -30 "$log"
  fi
  [[ -n $figure_cmd ]] && figure=$(bash -c "$figure_cmd" <"$log" 2>/dev/null | tr '\n' ' ' | cut -c1-110)
  summary+=("$name|$verdict|$seconds|$figure")
}

# ---- the GPU and its architecture ----------------------------------------------------------------
arch=""
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv | tee "$logs/gpu.txt"
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
elif [[ ${TRIDENT_GPU_CHECK_BUILD_ONLY:-0} != 1 ]]; then
  echo "gpu_check: no GPU here (nvidia-smi finds none); set TRIDENT_GPU_CHECK_BUILD_ONLY=1 to only build" >&2
  exit 77
fi
arch=${arch:-90}

# ---- build for that GPU ------------------------------------------------------------------------
[[ ${TRIDENT_GPU_CHECK_PREBUILT:-0} == 1 ]] || step configure "" -- cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DTRIDENT_ENABLE_CUDA=ON -DTRIDENT_ENABLE_NCCL=ON \
  -DTRIDENT_BUILD_TESTS=ON -DTRIDENT_BUILD_BENCHMARKS=ON -DTRIDENT_BUILD_EXAMPLES=ON -DTRIDENT_TSAN_TESTS=OFF
# Only what the steps below run (the GPU-labelled tests, their helpers, the GPU benchmarks and the
# example): the host-only tests are CI's, and building them here would cost minutes of GPU time.
# TRIDENT_GPU_CHECK_ALL=1 builds every target.
gpu_targets() {
  ctest --test-dir "$build" -N -L 'gpu|cuda|nccl' | sed -n 's/^ *Test *#[0-9]*: *//p' | sed 's/^/test_/; s/\./_/g'
  echo nccl_bootstrap_worker bench_adamw_cuda offload_pcie zero_step_cuda bench_grad_stats_cuda bench_comm_overhead collectives zero_mlp \
    tensor_block_cuda gpt_cuda gpt_block_ops_cuda flagship
}
if [[ ${TRIDENT_GPU_CHECK_PREBUILT:-0} == 1 ]]; then
  summary+=("build|prebuilt|0|binaries carried in $build")
elif [[ ${TRIDENT_GPU_CHECK_ALL:-0} == 1 ]]; then
  step build "" -- cmake --build "$build" -j "$jobs"
else
  # shellcheck disable=SC2046  # one target per word
  step build "" -- cmake --build "$build" -j "$jobs" --target $(gpu_targets)
fi
if [[ ${TRIDENT_GPU_CHECK_BUILD_ONLY:-0} == 1 || $failed -ne 0 ]]; then
  printf '%-34s %-9s %6s  %s\n' step status seconds figure
  for row in "${summary[@]}"; do IFS='|' read -r a b c d <<<"$row"; printf '%-34s %-9s %6s  %s\n' "$a" "$b" "$c" "$d"; done
  exit $failed
fi

# ---- every CUDA / NCCL test ---------------------------------------------------------------------
# ctest's own verdict per test (a skip is exit 77), then the multi-rank tests again with 4 ranks.
step "ctest -L gpu,cuda,nccl" "grep -E 'tests passed|tests failed'" -- \
  ctest --test-dir "$build" -L 'gpu|cuda|nccl' --output-on-failure -j 4
for ranks in 4; do
  [[ -x $build/tests/test_comm_nccl_multirank ]] && step "comm.nccl_multirank -np $ranks" \
    "grep -E 'test cases' | tail -1" -- mpirun -np "$ranks" --oversubscribe -x NCCL_SOCKET_IFNAME "$build/tests/test_comm_nccl_multirank"
  [[ -x $build/tests/test_tensor_nccl ]] && step "tensor.nccl -np $ranks" \
    "grep -E 'test cases' | tail -1" -- mpirun -np "$ranks" --oversubscribe -x NCCL_SOCKET_IFNAME "$build/tests/test_tensor_nccl"
  [[ -x $build/tests/test_pipeline_nccl ]] && step "pipeline.nccl -np $ranks" \
    "grep -E 'test cases' | tail -1" -- mpirun -np "$ranks" --oversubscribe -x NCCL_SOCKET_IFNAME "$build/tests/test_pipeline_nccl"
  [[ -x $build/tests/test_zero_nccl ]] && step "zero.nccl -np $ranks" \
    "grep -E 'test cases' | tail -1" -- mpirun -np "$ranks" --oversubscribe -x NCCL_SOCKET_IFNAME "$build/tests/test_zero_nccl"
  [[ -x $build/tests/test_zero_misuse_nccl ]] && step "zero.misuse_nccl -np $ranks" \
    "grep -E 'test cases' | tail -1" -- mpirun -np "$ranks" --oversubscribe -x NCCL_SOCKET_IFNAME "$build/tests/test_zero_misuse_nccl"
  # issue 10: step_async captured into a CUDA graph (stages 0-3) and equal to step()
  [[ -x $build/tests/test_zero_graph_nccl ]] && step "zero.graph_nccl -np $ranks" \
    "grep -E 'test cases' | tail -1" -- mpirun -np "$ranks" --oversubscribe -x NCCL_SOCKET_IFNAME "$build/tests/test_zero_graph_nccl"
  # issue 16: the cast and 1-bit reducers on device buffers, against the host's reducers
  [[ -x $build/tests/test_compress_nccl ]] && step "compress.nccl -np $ranks" \
    "grep -E 'test cases' | tail -1" -- mpirun -np "$ranks" --oversubscribe -x NCCL_SOCKET_IFNAME "$build/tests/test_compress_nccl"
  [[ -x $build/tests/test_local_sgd_diloco_nccl ]] && step "local_sgd.diloco_nccl -np $ranks" \
    "grep -E 'test cases' | tail -1" -- mpirun -np "$ranks" --oversubscribe -x NCCL_SOCKET_IFNAME "$build/tests/test_local_sgd_diloco_nccl"
  # issue 14: a device optimizer's state offloaded to host memory and NVMe files, bitwise
  [[ -x $build/tests/test_offload_nccl ]] && step "offload.nccl -np $ranks" \
    "grep -E 'test cases' | tail -1" -- mpirun -np "$ranks" --oversubscribe -x NCCL_SOCKET_IFNAME "$build/tests/test_offload_nccl"
done
# t = 3 divides the tensor-parallel test's heads, features, vocabulary and sequence (issue 11)
[[ -x $build/tests/test_tensor_nccl ]] && step "tensor.nccl -np 3" \
  "grep -E 'test cases' | tail -1" -- mpirun -np 3 --oversubscribe -x NCCL_SOCKET_IFNAME "$build/tests/test_tensor_nccl"
# issue 13: the flagship GPT on the GPU against the host's serial run; ctest ran it with 4 ranks
for ranks in 1 2; do
  [[ -x $build/tests/test_gpt_nccl ]] && step "gpt.nccl -np $ranks" \
    "grep -E 'test cases|largest relative' | tail -2" -- mpirun -np "$ranks" --oversubscribe -x NCCL_SOCKET_IFNAME "$build/tests/test_gpt_nccl"
done
# The flagship's command line on the GPU (the KJV shards: staged with the binaries, or made here)
kjv=$build/data/kjv
[[ -f ${kjv}_train.bin ]] || kjv=$root/build/data/kjv
rm -f "$logs/flagship/trace.json"  # the check below reads this run's trace, not an old one
[[ -x $build/examples/01_flagship/flagship && -f ${kjv}_train.bin ]] && step "example flagship --backend nccl" \
  "grep -E '^ *step|loss .* ->' | tail -2" -- mpirun -np 2 --oversubscribe -x NCCL_SOCKET_IFNAME \
  "$build/examples/01_flagship/flagship" --backend nccl --share-gpu --tensor 1 --pipeline 2 --zero 1 --steps 40 --eval-every 20 --data "$kjv" --out "$logs/flagship"
# Its trace of step 2: per rank a host track and a GPU track (the compute stream's phases),
# every GPU span after its rank's host "step 2" began (the GPU runs what the host enqueued).
[[ -x $build/examples/01_flagship/flagship && -f ${kjv}_train.bin ]] && step "example flagship trace" "cat" -- python3 -c '
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
gpu_tids = [t for t, n in names.items() if n.endswith(" GPU")]
ok = len(names) == 4 and len(gpu_tids) == 2
for t in gpu_tids:
    host = [k for k, n in names.items() if n == names[t][:-4]]
    steps = [e for e in events if host and e.get("tid") == host[0] and e.get("name") == "step 2"]
    spans = [e for e in events if e.get("tid") == t and e.get("cat") == "gpu"]
    late = bool(steps) and all(e["ts"] >= steps[0]["ts"] - 50 for e in spans)
    print(names[t] + ":", len(spans), "GPU spans, after the host step began:", late)
    ok = ok and bool(spans) and late
sys.exit(0 if ok else 1)' "$logs/flagship/trace.json"
# In bf16 the default --attention auto picks the bf16 flash tiles (head_dim 128 / 4 = 32): the
# banner names them, and the loss falls.
[[ -x $build/examples/01_flagship/flagship && -f ${kjv}_train.bin ]] && step "example flagship --backend nccl bf16 auto" \
  "grep -E 'bf16 tiles|loss .* ->' | tail -2" -- bash -c 'out=$(mpirun -np 2 --oversubscribe -x NCCL_SOCKET_IFNAME "$0" --backend nccl \
  --share-gpu --tensor 1 --pipeline 2 --zero 1 --precision bf16 --steps 40 --eval-every 0 --data "$1" --out "$2" 2>&1); rc=$?;
  echo "$out"; [[ $rc -eq 0 ]] && grep -q "bf16 tiles" <<<"$out"' "$build/examples/01_flagship/flagship" "$kjv" "$logs/flagship_bf16"
# --gemm bf16: the banner names the math, and the loss falls.
[[ -x $build/examples/01_flagship/flagship && -f ${kjv}_train.bin ]] && step "example flagship --backend nccl bf16 --gemm bf16" \
  "grep -E 'GEMMs bf16|loss .* ->' | tail -2" -- bash -c 'out=$(mpirun -np 2 --oversubscribe -x NCCL_SOCKET_IFNAME "$0" --backend nccl \
  --share-gpu --tensor 2 --pipeline 1 --zero 2 --precision bf16 --gemm bf16 --steps 40 --eval-every 0 --data "$1" --out "$2" 2>&1);
  rc=$?; echo "$out"; [[ $rc -eq 0 ]] && grep -q "GEMMs bf16" <<<"$out"' "$build/examples/01_flagship/flagship" "$kjv" "$logs/flagship_gemm_bf16"
[[ -x $build/examples/02_zero/zero_mlp ]] && step "example zero_mlp --backend nccl" "tail -2" -- \
  mpirun -np 2 --oversubscribe -x NCCL_SOCKET_IFNAME "$build/examples/02_zero/zero_mlp" --backend nccl --share-gpu

# ---- benchmarks: ours against the device's ceilings and against PyTorch, in the same run ------
[[ -x $build/bench/bench_adamw_cuda ]] && step "bench fused AdamW vs copy" "grep -iE 'adamw|copy' | tail -3" -- \
  "$build/bench/bench_adamw_cuda"
[[ -x $build/bench/offload_pcie ]] && step "bench offload: step vs max(update, PCIe)" "grep -E 'x max'" -- \
  "$build/bench/offload_pcie"
[[ -x $build/bench/zero_step_cuda ]] && step "bench ZeRO step() vs step_async()" "grep -E 'step_async / step'" -- \
  "$build/bench/zero_step_cuda"
[[ -x $build/bench/bench_grad_stats_cuda ]] && step "bench grad stats: trident vs CUB" "grep -E 'trident / cub'" -- \
  "$build/bench/bench_grad_stats_cuda"
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  step "bench torch AdamW(fused)" "tail -1" -- python3 "$root/bench/adamw_torch.py"
else
  summary+=("bench torch AdamW(fused)|skip|0|no PyTorch with CUDA here")
fi
# issue 11: the tensor-parallel block's step on the GPU, t = 1 and t = 2 (two ranks sharing it)
for ranks in 1 2; do
  [[ -x $build/bench/tensor_block_cuda ]] && step "bench tensor block t = $ranks" "grep -E 'ms/step'" -- \
    mpirun -np "$ranks" --oversubscribe -x NCCL_SOCKET_IFNAME "$build/bench/tensor_block_cuda"
done
# issue 13: GPT-2 124M's training step on one GPU, trident (fp32; TF32 GEMMs; bf16) against
# PyTorch (eager fp32, TF32 and bf16 autocast, torch.compile with bf16 autocast) on the same GPU
[[ -x $build/bench/gpt_cuda ]] && step "bench gpt 124M trident fp32" "grep -E 'trident gpt on the GPU'" -- \
  mpirun -np 1 -x NCCL_SOCKET_IFNAME "$build/bench/gpt_cuda"
[[ -x $build/bench/gpt_cuda ]] && step "bench gpt 124M trident tf32" "grep -E 'trident gpt on the GPU'" -- \
  mpirun -np 1 -x NCCL_SOCKET_IFNAME "$build/bench/gpt_cuda" 16 12 5 --tf32
[[ -x $build/bench/gpt_cuda ]] && step "bench gpt 124M trident bf16" "grep -E 'trident gpt on the GPU'" -- \
  mpirun -np 1 -x NCCL_SOCKET_IFNAME "$build/bench/gpt_cuda" 16 12 5 --bf16
[[ -x $build/bench/gpt_cuda ]] && step "bench gpt 124M trident bf16 flash" "grep -E 'trident gpt on the GPU'" -- \
  mpirun -np 1 -x NCCL_SOCKET_IFNAME "$build/bench/gpt_cuda" 16 12 5 --bf16 --flash
[[ -x $build/bench/gpt_cuda ]] && step "bench gpt 124M trident bf16 flash_bf16" "grep -E 'trident gpt on the GPU'" -- \
  mpirun -np 1 -x NCCL_SOCKET_IFNAME "$build/bench/gpt_cuda" 16 12 5 --bf16 --flash-bf16
# ... and with bf16 GEMMs (operands rounded to bf16: gemm_math::bf16, the flagship's --gemm bf16)
[[ -x $build/bench/gpt_cuda ]] && step "bench gpt 124M trident bf16 flash_bf16 gemm bf16" "grep -E 'trident gpt on the GPU'" -- \
  mpirun -np 1 -x NCCL_SOCKET_IFNAME "$build/bench/gpt_cuda" 16 12 5 --bf16 --flash-bf16 --gemm-bf16
# ... and where one step's GPU time goes, kernel by kernel: ncu times each kernel of one step
# alone (gpt_cuda --profile brackets it; the clocks left as they are, caches not flushed), and
# bench/ncu_summary.py groups them. The sum against the step's wall time above is the GPU's idle
# time. Where ncu cannot read the counters (gVisor machines) the step fails alone.
if command -v ncu >/dev/null && [[ -x $build/bench/gpt_cuda ]]; then
  step "profile gpt 124M kernels (ncu)" "sed -n '1p;3,7p'" -- bash -c '
    mpirun -np 1 -x NCCL_SOCKET_IFNAME ncu --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum \
        --csv --print-units base --log-file "$1/gpt_kernels.csv" \
        "$2" 16 12 1 --bf16 --flash-bf16 --profile >"$1/gpt_kernels_run.log" 2>&1 &&
      python3 "$3/bench/ncu_summary.py" "$1/gpt_kernels.csv" --top 40' _ "$logs" "$build/bench/gpt_cuda" "$root"
fi
# ... and one of its blocks' operations, each timed alone
# (the unfused attention's backward against the flash attention's forward and backward)
[[ -x $build/bench/gpt_block_ops_cuda ]] && step "bench gpt block ops" "grep -E 'attention (bf16 )?(forward|backward)|fc1 forward|LayerNorm' | tail -11" -- \
  "$build/bench/gpt_block_ops_cuda"
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  step "bench gpt 124M torch" "grep -E 'ms/step' | sed 's/.*B = 16, T = 1024, //'" -- python3 "$root/bench/gpt_torch_gpu.py"
fi
[[ -x $build/bench/bench_comm_overhead ]] && step "bench NCCL wrapper vs raw (host)" \
  "grep -E '_median' | awk '{print \$1, \$2, \$3}' | head -6" -- \
  "$build/bench/bench_comm_overhead" --benchmark_filter=nccl --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
[[ -x $build/bench/collectives ]] && step "bench NCCL all_reduce 1 rank" "grep -E '^ *[0-9]' | tail -4" -- \
  mpirun -np 1 "$build/bench/collectives" --backend nccl -b 1M -e 256M -f 4 -n 100 -R 15

# ---- one table ----------------------------------------------------------------------------------
echo
echo "gpu_check $(date -u +%Y-%m-%dT%H:%MZ) on $(head -2 "$logs/gpu.txt" 2>/dev/null | tail -1)  (logs: $logs)"
printf '%-34s %-9s %6s  %s\n' step status seconds figure
for row in "${summary[@]}"; do
  IFS='|' read -r a b c d <<<"$row"
  printf '%-34s %-9s %6s  %s\n' "$a" "$b" "$c" "$d"
done | tee "$logs/summary.txt"
exit $failed
