#!/usr/bin/env python3
"""Groups an Nsight Compute CSV of kernel durations by kernel, to show where a step's GPU time goes.

ncu times each kernel alone (it serialises them), so the sum is the step's kernel time without
overlap or gaps; against the step's wall time (bench/gpt_cuda prints it) the difference is
what the GPU spent idle or waiting on the host. scripts/gpu_check.sh runs:

  ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \\
      --print-units base --log-file ncu.csv  bench/gpt_cuda 16 12 2 --bf16 --flash-bf16 --profile
  python3 bench/ncu_summary.py ncu.csv [--top 25]

Prints one line per kernel name (templates and namespaces dropped; --full keeps them): launches,
total milliseconds, mean microseconds and share of the summed kernel time, largest first.
"""
import argparse
import csv
import io
import re
import sys
from collections import defaultdict


def short_name(name: str) -> str:
    """`void trident::nn::cuda::detail::gelu_kernel<float, 4>(...)` -> `gelu_kernel`."""
    name = re.sub(r"\(.*$", "", name)  # the parameter list
    depth, out = 0, []
    for ch in name:  # template arguments, nested
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    name = "".join(out).strip()
    name = name.split()[-1] if name.split() else name  # a leading return type
    return name.split("::")[-1] or name


def read_rows(text: str):
    """The CSV part of ncu's log: from the header line that names "Metric Value" on."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if '"Metric Value"' in line or line.startswith('"ID"'):
            return list(csv.DictReader(io.StringIO("\n".join(lines[i:]))))
    raise SystemExit("ncu_summary: no CSV header (a line naming \"Metric Value\") in the input; "
                     "was ncu run with --csv and --metrics gpu__time_duration.sum?")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu's --csv output (its --log-file), or - for stdin")
    ap.add_argument("--top", type=int, default=30, help="lines to print (default 30)")
    ap.add_argument("--full", action="store_true", help="group by the full kernel name")
    a = ap.parse_args()
    text = sys.stdin.read() if a.csv == "-" else open(a.csv, encoding="utf-8", errors="replace").read()
    rows = read_rows(text)
    key = next((k for k in ("Kernel Name", "Function Name", "Demangled Name", "Name") if rows and k in rows[0]), None)
    if key is None:
        raise SystemExit(f"ncu_summary: no kernel-name column in {list(rows[0]) if rows else 'an empty table'}")
    total = defaultdict(float)
    count = defaultdict(int)
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(str(r["Metric Value"]).replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}.get(unit)
        if scale is None:
            raise SystemExit(f"ncu_summary: unknown unit {unit!r} for gpu__time_duration.sum")
        name = r[key] if a.full else short_name(r[key])
        total[name] += value * scale
        count[name] += 1
    if not total:
        raise SystemExit("ncu_summary: no gpu__time_duration.sum rows")
    whole = sum(total.values())
    print(f"{sum(count.values())} kernels, {whole:.3f} ms of kernel time (each kernel alone)")
    print(f"{'kernel':<64} {'launches':>8} {'ms':>9} {'mean us':>9} {'share':>6}")
    for name, ms in sorted(total.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{name[:64]:<64} {count[name]:>8} {ms:>9.3f} {1e3 * ms / count[name]:>9.1f} {100 * ms / whole:>5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
