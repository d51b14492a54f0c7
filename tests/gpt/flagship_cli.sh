#!/usr/bin/env bash
# gpt.cli: the flagship's command line as a hostile user meets it (a review on 2026-11-29 found
# each of these): every bad value is an error that names the option and what was expected, the
# exit status says so, nothing crashes or hangs, and a diverging run stops instead of reporting
# NaN to the end. Under MPI (when the build has it): an error reaches the terminal from the rank
# that met it, and ranks started with different options are refused before they train.
# usage: flagship_cli.sh FLAGSHIP WORK_DIR [MPIEXEC]
set -uo pipefail
flagship=$1 work=$2 mpiexec=${3:-}
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0
# expect STATUS TEXT -- command...: the command exits with STATUS within 120 s, and its output
# (stdout and stderr) contains TEXT (or each of TEXT's parts separated by '|').
expect() {
  local want=$1 text=$2
  shift 3
  local out status missing=0 part parts
  out=$(timeout 120 "$@" 2>&1)
  status=$?
  IFS='|' read -ra parts <<<"$text"
  for part in "${parts[@]}"; do [[ $out == *"$part"* ]] || missing=1; done
  if [[ $status -ne $want ]] || ((missing)); then
    echo "FAIL: $* -> exit $status (expected $want), output:"
    echo "$out" | tail -16 | sed 's/^/    /'
    echo "    (expected to contain: $text)"
    failures=$((failures + 1))
  else
    echo "ok:   $* -> exit $status, '$text'"
  fi
}

# Small shards in llm.c's format: 256 int32 header (magic 20240520, version 1, count), uint16 tokens.
python3 - <<'EOF' || exit 1
import random, struct
random.seed(7)
for name, n in (("tiny_train.bin", 20000), ("tiny_val.bin", 4000)):
    with open(name, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack("<%dH" % n, *(random.randrange(256) for _ in range(n))))
EOF
tiny=(--layers 2 --hidden 32 --heads 2 --seq 16 --micro-batch 2 --accumulation 1 --tensor 1 --pipeline 1 --data tiny
      --eval-every 0 --trace-step 0 --out "$work/out")

# Integers out of range: negative sizes once wrapped to huge ones, wide values were cut.
expect 1 "--layers -2 is out of range; expected an integer in [1, 16777216]" -- "$flagship" "${tiny[@]}" --layers -2
expect 1 "--tensor 4294967298 is out of range" -- "$flagship" "${tiny[@]}" --tensor 4294967298
expect 1 "--tensor 65536 is out of range; expected an integer in [1, 32768]" -- "$flagship" "${tiny[@]}" --tensor 65536 --pipeline 65536
expect 1 "--steps 99999999999999999999999 is out of range" -- "$flagship" "${tiny[@]}" --steps 99999999999999999999999
expect 1 "--micro-batch 4611686018427387904 is out of range" -- "$flagship" "${tiny[@]}" --micro-batch 4611686018427387904
expect 1 "--zero 4 is out of range; expected an integer in [0, 3]" -- "$flagship" "${tiny[@]}" --zero 4
expect 1 "--ranks 0 is out of range" -- "$flagship" "${tiny[@]}" --ranks 0
expect 1 "--steps expects an integer, got 'abc'" -- "$flagship" "${tiny[@]}" --steps abc
expect 0 "nothing to train: --steps 0" -- "$flagship" "${tiny[@]}" --steps 0
# A diverging run stops at the first non-finite loss, with a non-zero exit status.
expect 1 "the training loss is" -- "$flagship" "${tiny[@]}" --ranks 2 --steps 12 --warmup 1 --lr 1e30
# And a healthy one still trains (the checks above did not break it).
expect 0 "loss " -- "$flagship" "${tiny[@]}" --ranks 2 --tensor 2 --steps 3

# Output paths are checked before training, not after it; a config's scheduler is the one the
# banner names.
cat >"$work/bad_trace.json" <<JSON
{"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
 "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3, "warmup_num_steps": 2}},
 "trident": {"tensor_parallel": 1, "pipeline_parallel": 1, "steps": 2, "eval_every": 0,
             "model": {"vocab_size": 256, "seq_len": 16, "hidden": 32, "heads": 2, "layers": 2},
             "train_data": "$work/tiny_train.bin", "val_data": "$work/tiny_val.bin", "trace": "$work/none/trace.json"}}
JSON
expect 1 "cannot write the trace to '$work/none/trace.json'" -- "$flagship" --config "$work/bad_trace.json" --ranks 2 --out "$work/out"
sed 's|"trace": "[^"]*"|"loss_csv": "'"$work"'/l.csv"|' "$work/bad_trace.json" >"$work/good.json"
expect 0 "WarmupLR ($work/good.json)" -- "$flagship" --config "$work/good.json" --ranks 2 --out "$work/out"
expect 0 "warm-up 1 then cosine|--lr / --warmup replace the config's learning-rate schedule" -- \
  "$flagship" --config "$work/good.json" --ranks 2 --out "$work/out" --lr 1e-3 --warmup 1

# --resume says what it did: nothing to resume from, a newer checkpoint gone past (a truncated
# file) and why; and a resumed run keeps the global batch.
expect 0 "no checkpoint to resume from in '$work/ck'; training from step 1" -- \
  "$flagship" "${tiny[@]}" --ranks 2 --steps 4 --save "$work/ck" --save-every 2 --resume
newest=$(ls -d "$work"/ck/step_* 2>/dev/null | sort | tail -1)
file=$(ls "$newest"/*.safetensors 2>/dev/null | head -1)
if [[ -n $file ]]; then
  truncate -s -10 "$file"
else
  echo "FAIL: no checkpoint files under $work/ck to truncate"
  failures=$((failures + 1))
fi
expect 0 "--resume went past a checkpoint|resumed from the checkpoint of step 2" -- \
  "$flagship" "${tiny[@]}" --ranks 2 --steps 6 --save "$work/ck" --save-every 2 --resume
expect 1 "a resumed run keeps the global batch" -- \
  "$flagship" "${tiny[@]}" --ranks 2 --steps 8 --accumulation 2 --save "$work/ck" --save-every 2 --resume

if [[ -n $mpiexec ]]; then
  mpi=("$mpiexec" --oversubscribe -n 2)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 TRIDENT_MPI_TIMEOUT=60
  # The rank that met an error prints it before the job is ended with MPI_Abort.
  expect 1 "flagship: rank 0: |none_train.bin' does not exist" -- "${mpi[@]}" "$flagship" --backend mpi "${tiny[@]}" --data "$work/none" --steps 2
  # Ranks started with other options than rank 0's are named; nothing trains.
  expect 1 "ranks 1 were started with other options or another config than rank 0" -- \
    "$mpiexec" --oversubscribe -n 1 "$flagship" --backend mpi "${tiny[@]}" --steps 3 : -n 1 "$flagship" --backend mpi "${tiny[@]}" --steps 5
  expect 0 "loss " -- "${mpi[@]}" "$flagship" --backend mpi "${tiny[@]}" --steps 2
fi
if ((failures > 0)); then
  echo "gpt.cli: $failures case(s) failed (their files are kept in $work)"
  exit 1
fi
rm -rf "$work"
echo "gpt.cli: every case as expected"
