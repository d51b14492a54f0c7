#!/usr/bin/env bash
# Set up, build and run the flagship example on in-process thread ranks (no GPU, no launcher).
# Extra arguments go to the example: scripts/example.sh [ranks] [parameters]
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
trident_install_packages
trident_configure -DTRIDENT_BUILD_TESTS=OFF -DTRIDENT_BUILD_BENCHMARKS=OFF -DTRIDENT_BUILD_EXAMPLES=ON
trident_build --target flagship
echo "== running the flagship example"
exec "$TRIDENT_BUILD/examples/01_flagship/flagship" "$@"
