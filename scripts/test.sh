#!/usr/bin/env bash
# Set up, build and run the whole test suite; ends with ctest's summary.
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

trident_configure -DTRIDENT_BUILD_TESTS=ON -DTRIDENT_BUILD_BENCHMARKS=ON -DTRIDENT_BUILD_EXAMPLES=ON "${conan_arg[@]}"
trident_build
echo "== running the tests"
cd "$TRIDENT_BUILD"
exec ctest --output-on-failure -j "$TRIDENT_JOBS" "$@"
