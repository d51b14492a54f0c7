"""torch.optim.AdamW(fused=True) on one flat fp32 tensor, timed like bench_adamw_cuda (CUDA events,
3 warm-up steps, 50 timed), to compare on the same GPU in the same run.

    python3 bench/adamw_torch.py [parameters]
"""
import sys

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 64 << 20
p = torch.nn.Parameter(torch.arange(n, device="cuda", dtype=torch.float32).remainder_(1000).mul_(1e-3).sub_(0.5))
p.grad = p.detach().clone()
opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
for _ in range(3):
    opt.step()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(50):
    opt.step()
end.record()
torch.cuda.synchronize()
ms = start.elapsed_time(end) / 50
print(f"torch {torch.__version__} AdamW(fused=True): {ms:.3f} ms  {28 * n / (ms * 1e-3) / 1e9:.0f} GB/s")
