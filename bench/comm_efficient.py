#!/usr/bin/env python3
"""Reads bench/comm_efficient.sh's runs (results.txt and <method>.csv in a directory) and prints
issue 16's lines: each method's validation loss at the end against plain data parallelism's at
the same samples (goal: no more than 2% worse; "-long" runs, which train twice as long, are left
out of that), the runs without error feedback beside theirs, bytes across the slow link per step
against data parallelism's, and the simulated time to a target loss (the training loss data
parallelism reaches at its end, plus 3%, smoothed over 10 steps); writes loss_vs_time.svg.
Exits 1 when a goal is missed."""
import csv
import math
import os
import re
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "build/comm-efficient"
results = {}
for line in open(os.path.join(out, "results.txt")):
    m = re.match(r"RESULT (.*)", line.strip())
    if m:
        kv = dict(x.split("=") for x in m.group(1).split())
        results[kv["method"]] = {k: float(v) for k, v in kv.items() if k != "method"}

curves = {}
for name in results:
    rows = list(csv.DictReader(open(os.path.join(out, name + ".csv"))))
    t = [float(r["seconds"]) for r in rows]
    loss = [float(r["loss"]) for r in rows]
    smooth = [sum(loss[max(0, i - 9):i + 1]) / len(loss[max(0, i - 9):i + 1]) for i in range(len(loss))]
    curves[name] = (t, smooth)

dp = results["dp"]
target = curves["dp"][1][-1] * 1.03


def time_to(name):
    t, s = curves[name]
    for x, y in zip(t, s):
        if y <= target:
            return x
    return math.inf


failures = []
print(f"{'method':<24}{'val loss':>9}{'vs dp':>8}{'bytes/step':>13}{'vs dp':>9}{'sim time':>10}{'to target':>11}")
dp_per_step = dp["across_bytes"] / dp["steps"]
for name, r in results.items():
    rel = (r["val_loss"] - dp["val_loss"]) / dp["val_loss"]
    per_step = r["across_bytes"] / r["steps"]
    ratio = dp_per_step / per_step if per_step else math.inf
    ttt = time_to(name)
    print(f"{name:<24}{r['val_loss']:>9.4f}{100 * rel:>+7.1f}%{per_step / 1e6:>10.2f} MB{ratio:>8.1f}x"
          f"{r['sim_seconds']:>9.0f}s{ttt:>10.0f}s")
    # The runs the goal is about; the others are shown beside them (a rank too low, 1-bit fed to
    # Adam as gradients, no error feedback, twice the samples).
    informational = name.endswith("-noef") or name.endswith("-long") or name in ("dp", "powersgd-r4", "onebit")
    compared = not informational
    if compared and rel > 0.02:
        failures.append(f"{name}: validation loss {100 * rel:+.1f}% from dp's (goal: no more than 2% worse)")
print(f"target: training loss {target:.4f} (dp's at its end + 3%), smoothed over 10 steps")
for base in ("powersgd-r16", "onebit-adam", "onebit"):
    if base in results and base + "-noef" in results:
        a, b = results[base]["val_loss"], results[base + "-noef"]["val_loss"]
        print(f"{base}: without error feedback {b:.4f} against {a:.4f} with it: {'worse' if b > a else 'NOT worse'}")
        if not b > a and base != "onebit":  # 1-bit gradients into Adam: shown, not a goal (docs/COMMUNICATION.md)
            failures.append(f"{base} without error feedback is not worse")
for fast in ("diloco-h50-long", "onebit-adam-long"):
    if fast in results and not time_to(fast) < time_to("dp"):
        failures.append(f"{fast} does not reach the target sooner than dp ({time_to(fast):.0f} s against {time_to('dp'):.0f} s)")
if "diloco-h100" in results:
    ratio = dp_per_step / (results["diloco-h100"]["across_bytes"] / results["diloco-h100"]["steps"])
    if ratio < 100:
        failures.append(f"diloco-h100 sends only {ratio:.0f}x fewer bytes per step than dp (goal: 100x)")

# Loss against simulated time, log scale in time.
w, h, left, bottom, top, right = 760, 440, 70, 50, 20, 170
tmin = min(min(t for t in c[0] if t > 0) for c in curves.values())
tmax = max(max(c[0]) for c in curves.values())
lmin = min(min(c[1]) for c in curves.values())
lmax = max(max(c[1][3:]) for c in curves.values())
def x(t): return left + (math.log10(max(t, tmin)) - math.log10(tmin)) / (math.log10(tmax) - math.log10(tmin)) * (w - left - right)
def y(l): return top + (lmax - l) / (lmax - lmin) * (h - top - bottom)
colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
       f'<rect width="{w}" height="{h}" fill="white"/>',
       f'<text x="10" y="14">Training loss (10-step mean) against simulated time: 2 clusters of 4 ranks, 100 ms, 1 MB/s per flow</text>']
for e in range(math.floor(math.log10(tmin)), math.ceil(math.log10(tmax)) + 1):
    t = 10 ** e
    if tmin <= t <= tmax:
        svg.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{h - bottom}" stroke="#ddd"/>')
        svg.append(f'<text x="{x(t):.1f}" y="{h - bottom + 16}" text-anchor="middle">{t:g} s</text>')
for k in range(6):
    l = lmin + (lmax - lmin) * k / 5
    svg.append(f'<text x="{left - 6}" y="{y(l) + 4:.1f}" text-anchor="end">{l:.2f}</text>')
svg.append(f'<line x1="{left}" y1="{y(target):.1f}" x2="{w - right}" y2="{y(target):.1f}" stroke="#999" stroke-dasharray="4 3"/>')
plotted = {k: v for k, v in curves.items() if not k.endswith("-noef") and k not in ("powersgd-r4", "diloco-h100")}
for i, (name, (t, s)) in enumerate(plotted.items()):
    c = colors[i % len(colors)]
    pts = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in zip(t, s) if a > 0)
    svg.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{pts}"/>')
    svg.append(f'<text x="{w - right + 8}" y="{top + 16 * i + 10}" fill="{c}">{name}</text>')
svg.append(f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">simulated seconds (log scale); dashed: the target loss</text>')
svg.append("</svg>")
open(os.path.join(out, "loss_vs_time.svg"), "w").write("\n".join(svg))
print(f"wrote {os.path.join(out, 'loss_vs_time.svg')}")
for f in failures:
    print("MISSED:", f)
sys.exit(1 if failures else 0)
