#!/usr/bin/env bash
# Set up, build and run the flagship: a GPT trained on 4 thread ranks ((data, tensor, pipeline) =
# (1, 2, 2), ZeRO-1) on the King James Bible, which scripts/prepare_data.py takes from Debian's
# bible-kjv packages and tokenizes once into build/data. About four minutes on two cores (the build,
# then a minute of training).
# Extra arguments go to the trainer (see: scripts/example.sh --help).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
trident_install_packages
trident_configure -DTRIDENT_BUILD_TESTS=OFF -DTRIDENT_BUILD_BENCHMARKS=OFF -DTRIDENT_BUILD_EXAMPLES=ON
trident_build --target flagship
cd "$TRIDENT_ROOT"
if [[ ! -f build/data/kjv_train.bin || ! -f build/data/kjv_val.bin ]]; then
  echo "== preparing the training data"
  python3 scripts/prepare_data.py --out build/data
fi
echo "== training"
exec "$TRIDENT_BUILD/examples/01_flagship/flagship" "$@"
