#!/usr/bin/env bash
# scripts/gpu_stage.sh — stages what a build-only gpu_check left in build/gpu (the GPU binaries
# and ctest's files, tens of MiB) into .gpu-stage/, so that the GPU machine runs them instead of
# compiling for minutes of its time. Build here first, for the GPU's architecture:
#
#   TRIDENT_GPU_CHECK_BUILD_ONLY=1 bash scripts/gpu_check.sh   # sm_90 unless CMAKE_CUDA_ARCHITECTURES says
#   bash scripts/gpu_stage.sh                                  # -> .gpu-stage (git-ignored)
#
# The device tool carries at most 64 MiB, which the binaries outgrew (67 MiB on 2026-11-29), so
# the stage also goes as one gzip'd tarball, .gpu-stage.tgz (about a third of that; git-ignored).
# On the GPU machine (the device tool: carry .gpu-stage.tgz), from the repository's root; ctest's
# files name this machine's absolute paths, which the links recreate there:
#
#   tar xzf .gpu-stage.tgz
#   here=/work/main; [[ $PWD == "$here" ]] || { mkdir -p "$(dirname $here)"; ln -sfn "$PWD" "$here"; }
#   [[ -e /usr/bin/mpiexec ]] || ln -s "$(command -v mpiexec)" /usr/bin/mpiexec    # as ctest's files say
#   export LD_LIBRARY_PATH=$PWD/.gpu-stage/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
#   mkdir -p build && ln -sfn "$PWD/.gpu-stage" build/gpu && cd "$here" && TRIDENT_GPU_CHECK_PREBUILT=1 bash scripts/gpu_check.sh
#
# The binaries need there what they need here (ldd lists it): NCCL, OpenMPI's libmpi.so.40,
# cuBLAS, liburing; the CUDA runtime is linked statically. Libraries missing there are copied
# into .gpu-stage/lib (run the tests with LD_LIBRARY_PATH pointing at it).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TRIDENT_GPU_BUILD:-$root/build/gpu}
stage=$root/.gpu-stage
[[ -f $build/CTestTestfile.cmake ]] || { echo "gpu_stage: no build in $build (run gpu_check.sh with TRIDENT_GPU_CHECK_BUILD_ONLY=1)" >&2; exit 1; }
[[ $build == "$root/build/gpu" ]] || { echo "gpu_stage: ctest's files must name $root/build/gpu" >&2; exit 1; }
rm -rf "$stage"
mkdir -p "$stage"
grep -qx '/.gpu-stage/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu-stage/' >>"$root/.git/info/exclude"
grep -qx '/.gpu-stage.tgz' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu-stage.tgz' >>"$root/.git/info/exclude"
(cd "$build" && find . -name CTestTestfile.cmake -print0 | xargs -0 cp --parents -t "$stage")
(cd "$build" && find tests bench examples -maxdepth 2 -type f -executable ! -name '*.so' ! -path '*/CMakeFiles/*' -print0 |
  xargs -0 cp --parents -t "$stage")
find "$stage" -type f -executable -exec strip --strip-debug {} +
# The flagship's KJV shards (scripts/prepare_data.py), for gpu_check's flagship step.
if compgen -G "$root/build/data/kjv_*.bin" >/dev/null; then
  mkdir -p "$stage/data" && cp "$root"/build/data/kjv_*.bin "$stage/data/"
fi
mkdir -p "$stage/lib"
# Not on the GPU machine (GPU.md), or under another name there: liburing, Debian's Google
# Benchmark, OpenMPI's C++ bindings. Ours go along (LD_LIBRARY_PATH=.gpu-stage/lib there).
for lib in liburing.so.2 libbenchmark.so.1debian libmpi_cxx.so.40; do
  path=$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')
  [[ -n $path ]] && cp -L "$path" "$stage/lib/"
done
tar -C "$root" -czf "$root/.gpu-stage.tgz" .gpu-stage
du -sh "$stage" "$root/.gpu-stage.tgz"
