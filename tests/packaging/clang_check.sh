#!/usr/bin/env bash
# packaging.clang: trident through Clang (with the system's libstdc++), which CI's GCC build never
# sees. Every host header compiles in one unit (-Werror), and the tests whose bits depend on the
# compiler's floating-point contraction (nn.host: GEMM, GELU, softmax and LayerNorm paths per ISA;
# optim.host_simd: the optimizers' vector paths) build at -O2 and pass.
# Found there once: sized operator delete (off by default before Clang 19) and Clang's FMA
# contraction ("on": within one expression), which broke the AVX-512 paths' bits.
# usage: clang_check.sh SOURCE_DIR WORK_DIR HEADERS_UNIT [CLANGXX]; exit 77 (skipped) without Clang 16 or newer.
set -euo pipefail
src=$1 work=$2 cxx=${4:-}
if [[ -z $cxx ]]; then
  for c in clang++-19 clang++-18 clang++-17 clang++-16 clang++; do
    if command -v "$c" >/dev/null; then cxx=$c; break; fi
  done
fi
if [[ -z $cxx ]] || ! command -v "$cxx" >/dev/null; then
  echo "packaging.clang: no clang++ found (scripts/test.sh installs clang-16 as root); skipped"
  exit 77
fi
major=$("$cxx" -dM -E -x c++ /dev/null | awk '$2 == "__clang_major__" {print $3}')
if ((major < 16)); then
  # Clang 14 cannot compile libstdc++ 12's <source_location> (no __builtin_source_location);
  # 16 is the oldest Clang this check has passed with.
  echo "packaging.clang: $cxx is Clang $major; this check wants Clang 16 or newer; skipped"
  exit 77
fi
echo "packaging.clang: $("$cxx" --version | head -1)"
rm -rf "$work" && mkdir -p "$work"
flags=(-std=c++20 -Wall -Wextra -Wpedantic -Werror -I"$src/include" -I"$src/tests")
# Every host header in one unit: the one trident_add_header_checks() generates (headers without
# a "trident-requires:" line).
unit=$3
echo "packaging.clang: $(grep -c '^#include' "$unit") includes in $unit"
"$cxx" "${flags[@]}" -fsyntax-only "$unit"
for t in nn/test_nn optim/test_host_simd; do
  exe=$work/$(basename "$t")
  "$cxx" "${flags[@]}" -O2 -DNDEBUG "$src/tests/$t.cpp" "$src/tests/support/doctest_main.cpp" -o "$exe" -pthread
  "$exe"
done
