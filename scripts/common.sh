# Shared set-up for scripts/example.sh and scripts/test.sh; sourced, not run.
# Installs what a fresh Debian 12 machine lacks (as root), or prints the exact apt-get line.
set -euo pipefail

TRIDENT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TRIDENT_BUILD=${TRIDENT_BUILD:-$TRIDENT_ROOT/build/main}
TRIDENT_JOBS=${TRIDENT_JOBS:-$(nproc)}

# Debian packages the build, the tests, the benchmarks and the examples use.
trident_packages=(cmake ninja-build g++ git pkg-config python3 python3-venv
                  doctest-dev libfmt-dev libbenchmark-dev libopenmpi-dev openmpi-bin libopenblas-dev nlohmann-json3-dev
                  libxxhash-dev liburing-dev)

trident_install_packages() {
  local missing=() p
  for p in "${trident_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  if [[ $(id -u) -eq 0 ]]; then
    echo "== installing Debian packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "trident needs these Debian packages; as root, run:" >&2
    echo "  apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
}

# CUDA lives outside PATH on a stock toolkit install; nvcc found => CUDA parts are compiled.
trident_find_cuda() {
  if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
}

trident_configure() {
  trident_find_cuda
  echo "== configuring in $TRIDENT_BUILD"
  # Without a GPU the CUDA tests only compile (they skip at run time), so one architecture is
  # enough to check that: sm_90, the lent GPU machines' (H100, H200). It saves a fifth of every
  # CUDA translation unit's time (73.7 s -> 60.7 s on test_zero_checkpoint_nccl.cu). With a GPU,
  # or TRIDENT_CUDA_ARCHITECTURES set, the project's default (80;90) or that.
  # For the same reason their host code is not optimised there (-O0; the device code still is):
  # g++ on nvcc's host side is two thirds of a CUDA unit's time (39 of 58 s on
  # train_cuda_bf16.cu), and -O0 cut that unit from 65 s to 44 s. Binaries that run on a GPU
  # come from a build on a machine with one, or from scripts/gpu_check.sh's own Release build.
  local arch=() cuda_flags="-O2 -Xcompiler=-g1 -DNDEBUG"
  if [[ -n ${TRIDENT_CUDA_ARCHITECTURES:-} ]]; then
    arch=("-DCMAKE_CUDA_ARCHITECTURES=$TRIDENT_CUDA_ARCHITECTURES")
  elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    arch=("-DCMAKE_CUDA_ARCHITECTURES=90")
    cuda_flags="-O0 -Xcompiler=-g1 -DNDEBUG"
  fi
  # -g1 (line tables: backtraces and profiles keep file and line) instead of -g's full debug
  # information: a quarter less compile time on the template-heavy translation units, C++ and
  # CUDA alike (nvcc's -g is the host compiler's; 89 s -> 68 s on test_zero_checkpoint_nccl.cu).
  cmake -S "$TRIDENT_ROOT" -B "$TRIDENT_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_CUDA_FLAGS_RELWITHDEBINFO=$cuda_flags" \
        "${arch[@]}" "$@"
}

trident_build() {
  echo "== building with $TRIDENT_JOBS jobs"
  cmake --build "$TRIDENT_BUILD" -j "$TRIDENT_JOBS" "$@"
}
