"""The flagship GPT (examples/01_flagship) written plainly in PyTorch: the reference that issue 13's
"against PyTorch" acceptance compares trident with (bench/gpt_vs_torch.sh runs both).

    python bench/gpt_torch.py --init INIT.safetensors --data SHARD [model, batch and optimizer options]
    python bench/gpt_torch.py ... --fixture tests/fixtures/gpt_torch_losses.txt   # records the fixture

It starts from the weights trident initialised (bench/gpt_reference --dump-init: safetensors,
read here with numpy alone), reads the same shard in the same order (llm.c's format and
data::shard_loader's slicing), and trains with torch.optim.AdamW(foreach=False) and
torch.nn.utils.clip_grad_norm_, printing one line per step in gpt_reference's format and then
tokens/s over the steps after --timing-warmup.

The model is GPT-2's with trident's conventions: pre-LayerNorm blocks (eps 1e-5), a fused QKV
linear whose output features are ordered (head, q/k/v, head_dim) (trident/nn/attention.hpp),
causal softmax attention scaled by 1/sqrt(head_dim), a GELU (tanh) MLP, a final LayerNorm, and a
head tied to the token embedding without bias; the loss is the mean cross-entropy over a
micro-batch's tokens, each micro-batch weighted 1/(micro-batches of the step). Weight decay
applies to every parameter (one parameter group).
"""

import argparse
import json
import math
import os
import platform
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SHARD_MAGIC, SHARD_VERSION, HEADER_INTS = 20240520, 1, 256  # llm.c's GPT-2 shards: uint16 tokens


def read_safetensors(path):
    """{name: float32 array} from a safetensors file, with numpy only."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n :]
    out = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            sys.exit(f"{path}: tensor {name} has dtype {t['dtype']}; expected F32")
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(t["shape"])
    return out


def read_shard(path):
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
        sys.exit(f"{path}: magic {header[0]}, version {header[1]}; expected {SHARD_MAGIC}, {SHARD_VERSION} (llm.c's GPT-2 shard)")
    tokens = np.memmap(path, dtype="<u2", mode="r", offset=HEADER_INTS * 4)
    if len(tokens) != header[2]:
        sys.exit(f"{path}: {len(tokens)} tokens after the header, which announces {header[2]}")
    return tokens


class Loader:
    """data::shard_loader: rank r of d reads B x T tokens (+1 target) at (k d + r) B T of global
    batch k; a shard serves (tokens - 1) // (d B T) global batches, then the next one starts."""

    def __init__(self, shards, batch, seq, rank, ranks):
        self.shards, self.b, self.t, self.rank, self.ranks = shards, batch, seq, rank, ranks
        self.shard, self.k = 0, 0

    def next(self):
        n = self.b * self.t
        tokens = self.shards[self.shard]
        first = (self.k * self.ranks + self.rank) * n
        chunk = torch.from_numpy(np.asarray(tokens[first : first + n + 1], dtype=np.int64))
        self.k += 1
        if self.k >= (len(tokens) - 1) // (self.ranks * n):
            self.shard, self.k = (self.shard + 1) % len(self.shards), 0
        return chunk[:-1].view(self.b, self.t), chunk[1:].view(self.b, self.t)


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.ln1 = nn.LayerNorm(hidden, eps=1e-5)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-5)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def attend(self, x):
        b, t, h = x.shape
        # trident's QKV order: each head's query, key and value side by side.
        qkv = self.qkv(x).view(b, t, self.heads, 3, h // self.heads)
        q, k, v = (qkv[:, :, :, j, :].transpose(1, 2) for j in range(3))  # [b, heads, t, head_dim]
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            y = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, h))

    def forward(self, x):
        x = x + self.attend(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, seq, hidden, heads, layers, ffn, attention):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.h = nn.ModuleList(Block(hidden, heads, ffn, attention) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # the head is the token embedding (tied)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def load_trident(self, weights):
        """Copies trident's tensors ("wte", "h{l}.attn.qkv.weight") into ours ("wte.weight", "h.{l}.qkv.weight")."""
        ours = dict(self.named_parameters())
        seen = set()
        for name, value in weights.items():
            mine = {"wte": "wte.weight", "wpe": "wpe.weight"}.get(name, name)
            if name.startswith("h") and name[1].isdigit():
                layer, rest = name[1:].split(".", 1)
                mine = f"h.{layer}." + rest.replace("attn.", "").replace("mlp.", "")
            if mine not in ours:
                sys.exit(f"initial weights: tensor {name} has no place in the model (expected GPT-2 names as gpt_reference writes)")
            if tuple(ours[mine].shape) != value.shape:
                sys.exit(f"initial weights: {name} has shape {value.shape}; the model expects {tuple(ours[mine].shape)}")
            with torch.no_grad():
                ours[mine].copy_(torch.from_numpy(value.copy()))
            seen.add(mine)
        missing = sorted(set(ours) - seen)
        if missing:
            sys.exit(f"initial weights: no values for {', '.join(missing)}; expected every parameter of the model")


def lr_at(step, lr, warmup):
    """The lr of optimizer step k (1-based): gpt_reference's rule."""
    return lr * min(1.0, step / warmup) if warmup > 0 else lr


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--init", required=True, help="trident's initial weights (gpt_reference --dump-init)")
    p.add_argument("--data", required=True, nargs="+", help="token shards (llm.c's GPT-2 format)")
    for name, default in [("vocab", 256), ("seq", 64), ("hidden", 64), ("heads", 4), ("layers", 4), ("ffn", 0),
                          ("micro-batch", 4), ("accumulation", 1), ("data-ranks", 1), ("steps", 20), ("warmup", 0),
                          ("threads", 1), ("timing-warmup", 2)]:
        p.add_argument("--" + name, type=int, default=default)
    for name, default in [("lr", 1e-3), ("beta1", 0.9), ("beta2", 0.95), ("eps", 1e-8), ("weight-decay", 0.1),
                          ("max-grad-norm", 1.0)]:
        p.add_argument("--" + name, type=float, default=default)
    p.add_argument("--attention", choices=["sdpa", "math"], default="sdpa",
                   help="scaled_dot_product_attention, or softmax(q k^T / sqrt(d)) v written out")
    p.add_argument("--fixture", help="also write the per-step losses in tests/fixtures' format to this file")
    p.add_argument("--fixture-fields", default="",
                   help="'key value ...' added to the fixture's header: what this script cannot know, e.g. the seed of "
                        "the weights and the shard's rule, so that a test can rebuild them")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    ffn = a.ffn or 4 * a.hidden
    model = GPT(a.vocab, a.seq, a.hidden, a.heads, a.layers, ffn, a.attention)
    model.load_trident(read_safetensors(a.init))
    params = list(model.parameters())  # the tied head is the embedding: counted once
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, weight_decay=a.weight_decay, foreach=False)
    shards = [read_shard(path) for path in a.data]
    # d data-parallel ranks of `accumulation` micro-batches each: the same tokens, one process.
    loaders = [Loader(shards, a.micro_batch, a.seq, r, a.data_ranks) for r in range(a.data_ranks)]
    micro = a.data_ranks * a.accumulation
    print(f"torch {torch.__version__} gpt: vocab {a.vocab} seq {a.seq} hidden {a.hidden} heads {a.heads} layers {a.layers} "
          f"ffn {ffn}; {torch.get_num_threads()} threads; {micro} micro-batches of {a.micro_batch} x {a.seq} tokens per step; "
          f"attention {a.attention}", flush=True)

    rows, seconds, tokens = [], 0.0, 0
    for step in range(1, a.steps + 1):
        start = time.perf_counter()
        batches = [loaders[r].next() for _ in range(a.accumulation) for r in range(a.data_ranks)]
        opt.zero_grad(set_to_none=True)
        losses = []
        for x, y in batches:
            loss = model(x, y)
            (loss / micro).backward()
            losses.append(loss.item())
        if a.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, a.max_grad_norm).item()
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(q.grad) for q in params])).item()
        lr = lr_at(step, a.lr, a.warmup)
        opt.param_groups[0]["lr"] = lr
        opt.step()
        elapsed = time.perf_counter() - start
        mean = sum(losses) / micro
        rows.append((step, mean, norm))
        print(f"step {step} loss {mean:.9g} grad_norm {norm:.9g} lr {lr!r} seconds {elapsed:.6f}", flush=True)
        if step > a.timing_warmup:
            seconds += elapsed
            tokens += micro * a.micro_batch * a.seq
    if seconds > 0:
        print(f"tokens_per_second {tokens / seconds:.1f} over steps {a.timing_warmup + 1}..{a.steps} ({a.threads} threads)")

    if a.fixture:
        meta = (f"meta torch {torch.__version__} numpy {np.__version__} python {platform.python_version()} "
                f"aten_cpu_capability {os.environ.get('ATEN_CPU_CAPABILITY', 'default')} threads {a.threads} "
                f"attention {a.attention} lines 0")
        config = " ".join(f"{k} {v!r}" for k, v in [
            ("vocab", a.vocab), ("seq", a.seq), ("hidden", a.hidden), ("heads", a.heads), ("layers", a.layers), ("ffn", ffn),
            ("micro_batch", a.micro_batch), ("accumulation", micro), ("steps", a.steps), ("lr", a.lr), ("warmup", a.warmup),
            ("beta1", a.beta1), ("beta2", a.beta2), ("eps", a.eps), ("weight_decay", a.weight_decay),
            ("max_grad_norm", a.max_grad_norm)])
        extra = a.fixture_fields.split()
        if len(extra) % 2:
            sys.exit(f"--fixture-fields '{a.fixture_fields}': expected key value pairs")
        with open(a.fixture, "w") as f:
            f.write(meta + "\n")
            f.write(f"losses name gpt_small {config} {' '.join(extra)} lines {len(rows)}\n")
            for step, mean, norm in rows:
                f.write(f"{step} {mean!r} {norm!r}\n")
        print(f"wrote {a.fixture}")


if __name__ == "__main__":
    main()
