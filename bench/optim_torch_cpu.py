"""torch's fused CPU optimizers on one flat fp32 tensor, timed like bench_optim, and the table that
bench/optim_vs_torch.sh prints from both.

    python3 bench/optim_torch_cpu.py run --threads 2 [--n 16777216] [--steps 20]   -> JSON on stdout
    python3 bench/optim_torch_cpu.py table ROUND_DIR...                             -> the table

`run` times AdamW(fused=True), Adam(fused=True) and SGD(momentum=0.9, fused=True) with the
hyperparameters of bench/bench_optim.cpp, after 3 warm-up steps, and reports the median step.
Bytes per parameter as bench_optim counts them: 28 for Adam/AdamW (read param, grad, exp_avg,
exp_avg_sq; write param, exp_avg, exp_avg_sq), 20 for SGD with momentum. torch has no fused step
that takes bf16 gradients into fp32 master weights and writes a bf16 working copy (the offload
engine's step, issue 14), so its adamw_bf16 row is what a torch trainer runs for it: the bf16
gradient converted into the fp32 .grad (copy_), the fused AdamW step, the bf16 working copy
written (copy_); the other bf16 rows have no torch figure. `table` reads, in each ROUND_DIR, ours.json (Google Benchmark's JSON)
and torch.json, and prints medians over the rounds.
"""
import argparse
import json
import os
import re
import statistics
import sys
import time

BYTES = {"adamw_fp32": 28, "adam_fp32": 28, "sgd_momentum_fp32": 20, "adamw_bf16": 28}


def run(args):
    import torch

    torch.set_num_threads(args.threads)
    out = {"torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(),
           "threads": torch.get_num_threads(), "rows": {}}
    makers = {
        "adamw_fp32": lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True),
        "adam_fp32": lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True),
        "sgd_momentum_fp32": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, fused=True),
    }
    for name, make in makers.items():
        p = torch.nn.Parameter(torch.full((args.n,), 0.5))
        p.grad = torch.full((args.n,), 0.01)
        opt = make([p])
        for _ in range(3):
            opt.step()
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - start)
        ms = statistics.median(times) * 1e3
        out["rows"][name] = {"ms": ms, "gbps": BYTES[name] * args.n / (ms * 1e-3) / 1e9}
        del opt, p
    # The offload engine's step in torch: bf16 gradient in, fp32 master and states, bf16 copy out.
    p = torch.nn.Parameter(torch.full((args.n,), 0.5))
    p.grad = torch.zeros(args.n)
    g16 = torch.full((args.n,), 0.01, dtype=torch.bfloat16)
    w16 = torch.zeros(args.n, dtype=torch.bfloat16)
    opt = torch.optim.AdamW([p], lr=1e-3, fused=True)

    def mixed_step():
        p.grad.copy_(g16)
        opt.step()
        with torch.no_grad():
            w16.copy_(p)

    for _ in range(3):
        mixed_step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        mixed_step()
        times.append(time.perf_counter() - start)
    ms = statistics.median(times) * 1e3
    out["rows"]["adamw_bf16"] = {"ms": ms, "gbps": BYTES["adamw_bf16"] * args.n / (ms * 1e-3) / 1e9}
    out["n"] = args.n
    json.dump(out, sys.stdout)
    print()


def ours(path):
    """{benchmark name: (ms, GB/s)} from bench_optim's JSON."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    rows = {}
    for b in data["benchmarks"]:
        if b.get("error_occurred"):
            continue
        name = re.sub(r"/(min_warmup_time:[^/]*|real_time)", "", b["name"])
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
        rows[name] = (b["real_time"] * scale, b["bytes_per_second"] / 1e9, b.get("isa"), b.get("threads_used"))
    return rows


def table(args):
    rounds = [(ours(os.path.join(d, "ours.json")), json.load(open(os.path.join(d, "torch.json"), encoding="utf-8")))
              for d in args.dirs]
    med = statistics.median

    def ours_row(name):
        values = [r[0][name] for r in rounds if name in r[0]]
        return (med(v[0] for v in values), med(v[1] for v in values)) if values else None

    def torch_row(name):
        values = [r[1]["rows"][name] for r in rounds if name in r[1]["rows"]]
        return (med(v["ms"] for v in values), med(v["gbps"] for v in values)) if values else None

    first_ours, first_torch = rounds[0]
    isa = {0: "portable", 1: "avx2", 2: "avx512"}.get(int(first_ours["adamw_fp32"][2] or 0), "?")
    print(f"ours: trident host step, path {isa}, {int(first_ours['adamw_fp32'][3] or 0)} threads (thread_pool); "
          f"torch {first_torch['torch']} fused, capability {first_torch['capability']}, "
          f"{first_torch['threads']} threads; median of {len(rounds)} alternating rounds")
    n = first_torch.get("n", 1 << 24)
    print(f"{f'step ({n / 2**20:.0f}M params)':<22}{'ours ms':>9}{'GB/s':>7}{'torch ms':>10}{'GB/s':>7}{'stream ms':>11}{'GB/s':>7}"
          f"{'ours/stream':>13}{'torch/ours':>12}")
    streams = {"adamw_fp32": "stream_adam_fp32", "adam_fp32": "stream_adam_fp32", "adamw_bf16": "stream_adam_bf16",
               "adam_bf16": "stream_adam_bf16", "sgd_momentum_fp32": "stream_sgd_fp32",
               "sgd_momentum_bf16": "stream_sgd_bf16"}
    def ratio(f):
        """Median over the rounds of a ratio taken within each round (robust to drifts between them)."""
        values = [v for v in (f(o, t) for o, t in rounds) if v is not None]
        return med(values) if values else None

    for name, stream in streams.items():
        o, t, s = ours_row(name), torch_row(name), ours_row(stream)
        if o is None:
            continue
        of_stream = ratio(lambda ro, rt: ro[stream][0] / ro[name][0] if name in ro and stream in ro else None)
        vs_torch = ratio(lambda ro, rt: rt["rows"][name]["ms"] / ro[name][0] if name in ro and name in rt["rows"] else None)
        line = f"{name:<22}{o[0]:>9.2f}{o[1]:>7.1f}"
        line += f"{t[0]:>10.2f}{t[1]:>7.1f}" if t else f"{'-':>10}{'-':>7}"
        line += f"{s[0]:>11.2f}{s[1]:>7.1f}{100 * of_stream:>12.0f}%" if s else f"{'-':>11}{'-':>7}{'-':>13}"
        line += f"{vs_torch:>11.2f}x" if t else f"{'-':>12}"
        print(line)
    for name in ("adamw_fp32_path/0", "adamw_fp32_path/1", "adamw_fp32_path/2", "adamw_scalar_loop"):
        o = ours_row(name)
        if o:
            print(f"{name:<22}{o[0]:>9.2f}{o[1]:>7.1f}")
    print("(ms and GB/s: medians over the rounds; ours/stream and torch/ours: medians of the ratios within each round.\n"
          " torch/ours > 1: ours is faster; ours/stream: share of the bandwidth of a kernel that moves the same bytes)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--threads", type=int, required=True)
    r.add_argument("--n", type=int, default=1 << 24)
    r.add_argument("--steps", type=int, default=20)
    t = sub.add_parser("table")
    t.add_argument("dirs", nargs="+")
    args = parser.parse_args()
    run(args) if args.command == "run" else table(args)


if __name__ == "__main__":
    main()
