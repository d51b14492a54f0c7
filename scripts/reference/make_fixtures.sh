#!/usr/bin/env bash
# Regenerates tests/fixtures/{deepspeed_loss_scaler,lr_schedules,torch_optim,torch_layers,torch_powersgd}.txt
# from the real DeepSpeed and PyTorch (see tests/fixtures/README.md). Needs Python 3.11+ and
# PyPI; no GPU.
#
#   scripts/reference/make_fixtures.sh            # writes tests/fixtures/
#   scripts/reference/make_fixtures.sh --out DIR  # writes elsewhere (to compare)
#
# The virtual environment goes to build/tools/reference (git-ignored; override with
# TRIDENT_REFERENCE_VENV). PyPI's Linux torch wheel pulls the CUDA libraries (several GB)
# although only the CPU is used.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${TRIDENT_REFERENCE_VENV:-$root/build/tools/reference}"
python="${PYTHON:-python3}"

TORCH_VERSION=2.15.0
DEEPSPEED_VERSION=0.19.8
NUMPY_VERSION=2.4.6

if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
fi
"$venv/bin/python" -m pip install --quiet "torch==$TORCH_VERSION" "numpy==$NUMPY_VERSION"
# DeepSpeed builds no ops at install time (DS_BUILD_OPS=0) and must not look for CUDA.
DS_BUILD_OPS=0 DS_SKIP_CUDA_CHECK=1 "$venv/bin/python" -m pip install --quiet "deepspeed==$DEEPSPEED_VERSION"

# Deterministic CPU runs: one thread; torch's AVX2 kernels (they fuse multiply-adds, the
# DEFAULT ones do not: the optimizer traces depend on it); DeepSpeed on its CPU accelerator.
export ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES=
"$venv/bin/python" "$root/scripts/reference/make_fixtures.py" "$@"
# PyTorch's PowerSGD hook on two gloo processes (torch_powersgd.txt; --out DIR as above).
out_dir="$root/tests/fixtures"
for ((i = 1; i <= $#; ++i)); do [[ ${!i} == --out ]] && { j=$((i + 1)); out_dir=${!j}; }; done
"$venv/bin/python" "$root/scripts/reference/make_powersgd_fixture.py" "$out_dir/torch_powersgd.txt"
