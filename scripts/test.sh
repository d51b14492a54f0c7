#!/usr/bin/env bash
# Set up, build and run the whole test suite (and the host tests under ASan + UBSan); ends with
# ctest's summary of the main suite.
# Also installs Conan 2 into a private venv (build/tools/conan) so the Conan packaging test runs.
# Extra arguments go to ctest, e.g. scripts/test.sh -L packaging
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
trident_install_packages
# Slurm, for the comm.srun test (MPI under srun on a throwaway one-node Slurm): as root only, and
# optional: without it that test reports itself skipped.
if [[ $(id -u) -eq 0 ]] && ! command -v slurmd >/dev/null; then
  if ! (trident_packages=(slurmctld slurmd slurm-client munge libpmix2) && trident_install_packages); then
    echo "warning: could not install Slurm; the comm.srun test will report itself skipped" >&2
  fi
fi

# Clang 16, for packaging.clang (the headers and the bit-exact ISA tests through Clang): as root
# only, and optional: without it that test reports itself skipped.
if [[ $(id -u) -eq 0 ]] && ! command -v clang++-16 >/dev/null; then
  if ! (trident_packages=(clang-16) && trident_install_packages); then
    echo "warning: could not install clang-16; the packaging.clang test will report itself skipped" >&2
  fi
fi

conan_venv=$TRIDENT_ROOT/build/tools/conan
if [[ ! -x $conan_venv/bin/conan ]]; then
  echo "== installing Conan 2 into $conan_venv"
  if ! { python3 -m venv "$conan_venv" && "$conan_venv/bin/pip" install -q "conan>=2,<3"; }; then
    echo "warning: could not install Conan; the packaging.conan test will report itself skipped" >&2
    rm -rf "$conan_venv"
  fi
fi
conan_arg=()
[[ -x $conan_venv/bin/conan ]] && conan_arg=("-DTRIDENT_CONAN_EXECUTABLE=$conan_venv/bin/conan")

# The tests' own units at -O1 (tests/CMakeLists.txt: a third less compile time than -O2);
# examples and benchmarks keep RelWithDebInfo's -O2.
trident_configure -DTRIDENT_BUILD_TESTS=ON -DTRIDENT_BUILD_BENCHMARKS=ON -DTRIDENT_BUILD_EXAMPLES=ON \
  -DTRIDENT_TEST_CXX_FLAGS=-O1 "${conan_arg[@]}"
trident_build

# The host tests again under AddressSanitizer + UndefinedBehaviorSanitizer, in a build of their
# own (host only, -O0 -g1: stack traces keep their file and line). -O0 rather than the -O1 that
# AddressSanitizer's documentation suggests: with both sanitizers, -O1 took twice -O0's compile
# time (test_zero.cpp: 105 s against 48 s) and this build 704 s against 309 s, while its tests
# took 174 s instead of 96 s: 5 minutes less in all. First, so that the closing lines are the
# main suite's. TRIDENT_SANITIZE=0 skips it. (ThreadSanitizer
# runs in the main build: comm.local_tsan.)
if [[ ${TRIDENT_SANITIZE:-1} != 0 ]]; then
  asan_build=$TRIDENT_ROOT/build/asan-ci
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer: configuring in $asan_build"
  cmake -S "$TRIDENT_ROOT" -B "$asan_build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRIDENT_ENABLE_CUDA=OFF \
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O0 -g1 -DNDEBUG" \
        -DTRIDENT_BUILD_TESTS=ON -DTRIDENT_BUILD_BENCHMARKS=OFF -DTRIDENT_BUILD_EXAMPLES=OFF \
        "-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
  cmake --build "$asan_build" -j "$TRIDENT_JOBS"
  echo "== running the host tests under ASan + UBSan (packaging tests excluded: they build other trees)"
  (cd "$asan_build" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j "$TRIDENT_JOBS" -LE packaging "$@")
fi

echo "== running the tests"
cd "$TRIDENT_BUILD"
exec ctest --output-on-failure -j "$TRIDENT_JOBS" "$@"
