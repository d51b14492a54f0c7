#!/usr/bin/env bash
# Checkpoint I/O against the disk, in one run (issue 15's speed line): fio's sequential write
# (buffered, fsync at the end) and read (cache invalidated first) on the same file system, then
# bench/checkpoint_io.cpp's save, load and asynchronous-save stall. Installs fio with apt-get when
# missing (as root). Figures go to bench/RESULTS.md by hand, with this command and the date.
#
#   bench/checkpoint_io.sh [dir] [parameters] [ranks]      # defaults: build/ckpt-bench, 64M, 2
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/build/ckpt-bench}"
parameters="${2:-67108864}"
ranks="${3:-2}"
build="${TRIDENT_BUILD:-$root/build/main}"
if ! command -v fio > /dev/null; then
  if [[ $(id -u) -eq 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio > /dev/null
  else
    echo "needs fio: apt-get install fio" >&2
    exit 1
  fi
fi
cmake --build "$build" --target checkpoint_io > /dev/null
mkdir -p "$dir"
size_mb=$(( parameters * 12 / 1000000 ))  # as much as one checkpoint holds
echo "== $(date -u +%Y-%m-%d) $(uname -n), $(nproc) cores; $(df -h "$dir" | tail -1 | awk '{print $1" ("$2")"}')"
echo "== fio: sequential write and read of ${size_mb} MB in 4 MiB blocks, $ranks jobs (one per rank); best of 3, as trident's"
best_write=0
best_read=0
for rep in 1 2 3; do
  fio --name=write --directory="$dir" --rw=write --bs=4M --size="$((size_mb / ranks))M" --ioengine=psync --end_fsync=1 \
      --numjobs="$ranks" --group_reporting --output-format=terse --terse-version=3 > "$dir/fio_write.txt"
  fio --name=write --directory="$dir" --rw=read --bs=4M --size="$((size_mb / ranks))M" --ioengine=psync --invalidate=1 \
      --numjobs="$ranks" --group_reporting --output-format=terse --terse-version=3 > "$dir/fio_read.txt"
  # terse v3: field 7 = read bandwidth (KiB/s), field 48 = write bandwidth (KiB/s)
  w=$(awk -F';' '{print $48}' "$dir/fio_write.txt")
  r=$(awk -F';' '{print $7}' "$dir/fio_read.txt")
  (( w > best_write )) && best_write=$w
  (( r > best_read )) && best_read=$r
  rm -f "$dir"/write.*
done
awk -v w="$best_write" -v r="$best_read" 'BEGIN {printf "  fio write                 %7.2f GB/s\n  fio read                  %7.2f GB/s\n", w * 1024 / 1e9, r * 1024 / 1e9}'
rm -f "$dir"/write.*
echo "== trident"
"$build/bench/checkpoint_io" "$dir/trident" "$parameters" "$ranks" 3
