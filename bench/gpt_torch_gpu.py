"""The flagship GPT's training step on one GPU in PyTorch, against bench/gpt_cuda (trident) on the
same GPU in the same run (scripts/gpu_check.sh runs both):

    python3 bench/gpt_torch_gpu.py [--batch 16] [--layers 12] [--steps 5] [--modes fp32,tf32,bf16,compile-bf16]

The model is bench/gpt_torch.py's GPT (GPT-2 124M by default: 12 layers, 768 wide, 12 heads,
T = 1024, vocabulary 50304, tied head, GELU tanh, scaled_dot_product_attention), trained with
torch.optim.AdamW(fused=True) and clip_grad_norm_(1.0), on random tokens. Modes:
  fp32          eager, true FP32 matmuls (trident's default numerics)
  tf32          eager, TF32 matmuls (torch.backends.cuda.matmul.allow_tf32)
  bf16          eager with bf16 autocast (bench/gpt_cuda --bf16's counterpart without a compiler)
  compile-fp32  torch.compile, FP32
  compile-bf16  torch.compile with bf16 autocast: the issue's target (about 47 ms/step on an H100
                for Hugging Face's GPT-2)
Each mode: two warm-up steps (compilation included), then the mean wall time of `steps` steps,
each ending with loss.item() (as trident's step ends with the host reading the loss). FLOPs per
token are trident's count (gpt_config::flops_per_token: 6 per multiplying parameter + attention).
"""

import argparse
import os
import sys
import time
import types

import torch

try:
    import numpy  # noqa: F401  gpt_torch reads shards with it; the model itself does not need it
except ImportError:
    sys.modules["numpy"] = types.ModuleType("numpy")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_torch import GPT  # noqa: E402  the same model as the CPU race


def run(mode, batch, layers, steps):
    vocab, seq, hidden, heads = 50304, 1024, 768, 12
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    torch.backends.cudnn.allow_tf32 = mode == "tf32"
    torch.manual_seed(0)
    model = GPT(vocab, seq, hidden, heads, layers, 4 * hidden, "sdpa").cuda()
    with torch.no_grad():  # GPT-2's initialisation, as trident's (speed does not depend on it)
        for name, p in model.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                p.zero_()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if mode.startswith("compile") else model
    idx = torch.randint(0, vocab, (batch, seq), device="cuda")
    tgt = torch.randint(0, vocab, (batch, seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode.endswith("bf16")):
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    step()
    step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    ms = (time.perf_counter() - start) * 1e3 / steps
    n = sum(p.numel() for p in model.parameters()) - seq * hidden
    flops = 6.0 * n + 12.0 * layers * seq * hidden
    tokens = batch * seq
    print(f"torch {torch.__version__} gpt on the GPU: {layers} layers, B = {batch}, T = {seq}, {mode:13s}: {ms:8.2f} ms/step  "
          f"{tokens / ms * 1e3:9.0f} tokens/s  {flops * tokens / ms * 1e-9:6.1f} TFLOP/s  (loss {loss:.4f})", flush=True)
    del model, opt, step_model
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--modes", default="fp32,tf32,bf16,compile-bf16")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpt_torch_gpu: no CUDA device")
    print(f"device: {torch.cuda.get_device_name(0)}", flush=True)
    for mode in a.modes.split(","):
        run(mode, a.batch, a.layers, a.steps)


if __name__ == "__main__":
    main()
