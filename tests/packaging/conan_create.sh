#!/usr/bin/env bash
# conan create of the recipe in the source tree, offline, in a private CONAN_HOME, for the plain
# package and for with_mpi=True with MPI declared as coming from the system.
# Usage: conan_create.sh <conan executable or empty> <source dir> <work dir>
# Exits 77 (ctest: skipped) when conan is not installed.
set -euo pipefail
conan=${1:-}
source_dir=$2
work=$3
if [[ -z "$conan" || ! -x "$(command -v "$conan" || true)" ]]; then
  echo "SKIPPED: conan is not installed (the README's test command installs it with pip; or: pip install conan)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work/src"
# Conan builds test_package inside the recipe's folder: work on a copy, never in the checkout.
cp -r "$source_dir"/{conanfile.py,CMakeLists.txt,LICENSE,include,cmake,test_package} "$work/src/"
export CONAN_HOME="$work/conan_home"
"$conan" profile detect --force >/dev/null
# No network: nothing may come from a remote.
"$conan" remote remove "*" >/dev/null 2>&1 || true
cat >"$work/system_mpi" <<PROFILE
include(default)
[platform_requires]
openmpi/4.1.4
[conf]
tools.cmake.cmaketoolchain:generator=Ninja
PROFILE
common=(-s compiler.cppstd=20 -c tools.cmake.cmaketoolchain:generator=Ninja --build=missing)
echo "== conan create (header-only core)"
"$conan" create "$work/src" "${common[@]}"
echo "== conan create -o with_mpi=True, MPI from the system"
"$conan" create "$work/src" -pr:h "$work/system_mpi" -o "trident/*:with_mpi=True" "${common[@]}"
