#!/usr/bin/env bash
# The NVMe tier against the disk, in one run (issue 14's speed line): fio's sequential read,
# write and 50/50 read-write with O_DIRECT through io_uring in 4 MiB blocks on the same file
# system, then bench/offload_io.cpp: the tier's read and read+write passes over a 64M-parameter
# ZeRO-1 bf16 AdamW state (768 MB), the in-memory step and the offloaded step. Each best of 3.
# Installs fio with apt-get when missing (as root). Figures go to bench/RESULTS.md by hand.
#
#   bench/offload.sh [dir] [parameters]      # defaults: build/offload-bench, 64M
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/build/offload-bench}"
parameters="${2:-67108864}"
build="${TRIDENT_BUILD:-$root/build/main}"
if ! command -v fio > /dev/null; then
  if [[ $(id -u) -eq 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio > /dev/null
  else
    echo "needs fio: apt-get install fio" >&2
    exit 1
  fi
fi
cmake --build "$build" --target offload_io > /dev/null
mkdir -p "$dir"
size_mb=$(( parameters * 12 / 1000000 ))
echo "== $(date -u '+%Y-%m-%d %H:%M') $(uname -n), $(nproc) cores; $(df -h "$dir" | tail -1 | awk '{print $1" ("$2")"}')"
echo "== fio: ${size_mb} MB, O_DIRECT, io_uring, 4 MiB blocks, queue depth 4; best of 3"
best() { sort -g | tail -1; }
declare -A fio_best
for mode in read write rw; do
  for rep in 1 2 3; do
    fio --name="$mode" --directory="$dir" --rw="$mode" --bs=4M --size="${size_mb}M" --ioengine=io_uring --iodepth=4 \
        --direct=1 --output-format=terse --terse-version=3 > "$dir/fio_$mode.txt"
    # terse v3: read bandwidth (KiB/s) is field 7, write bandwidth field 48
    awk -F';' '{printf "%.3f\n", ($7 + $48) * 1024 / 1e9}' "$dir/fio_$mode.txt"
  done > "$dir/fio_$mode.all"
  fio_best[$mode]=$(best < "$dir/fio_$mode.all")
  rm -f "$dir"/"$mode".0.0
done
printf "  fio read %s GB/s, write %s GB/s, read+write together %s GB/s\n" "${fio_best[read]}" "${fio_best[write]}" "${fio_best[rw]}"
echo "== trident: offload_io $dir $parameters (best of 3 runs, each the median of 5 steps)"
for rep in 1 2 3; do "$build/bench/offload_io" "$dir" "$parameters" 5 3; done | tee "$dir/ours.txt" | grep -v RESULT
read_best=$(grep RESULT "$dir/ours.txt" | sed 's/.*read_gbps=\([0-9.]*\).*/\1/' | best)
rw_best=$(grep RESULT "$dir/ours.txt" | sed 's/.*rw_gbps=\([0-9.]*\).*/\1/' | best)
ratios=$(grep RESULT "$dir/ours.txt" | sed 's/.*step_ratio=\([0-9.]*\).*/\1/' | sort -g | tr '\n' ' ')
ratio_median=$(echo "$ratios" | tr ' ' '\n' | grep . | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}')
awk -v r="$read_best" -v rw="$rw_best" -v fr="${fio_best[read]}" -v frw="${fio_best[rw]}" -v q="$ratio_median" -v all="$ratios" 'BEGIN {
  printf "== the tier reads at %.2f GB/s = %.0f%% of fio read; reads + writes at %.2f GB/s = %.0f%% of fio read+write\n", r, 100 * r / fr, rw, 100 * rw / frw
  printf "== offloaded step = %.2f x max(host update, disk I/O) (median of the runs: %s)\n", q, all }'
