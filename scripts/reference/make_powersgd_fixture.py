"""Records tests/fixtures/torch_powersgd.txt from PyTorch's own PowerSGD DDP hook
(torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook with PowerSGDState),
run on two CPU processes over gloo, for tests/compress/test_powersgd_torch.cpp
(`compress.torch_powersgd`), which feeds trident's compress::powersgd the same gradients on two
thread ranks and compares what each step's reduction returns.

    scripts/reference/make_fixtures.sh      # runs this too (the same virtual environment)

The hook is called on a bucket object of our own (duck-typed: buffer(), index(), gradients(),
is_last(), as DDP's GradBucket offers them): one bucket of six tensors whose shapes make some
compressed and some not, two of the same shape apart (PyTorch groups same-shaped tensors when
it lays out its factors), 1-D and 3-D ones among them. Each rank's gradients are seeded normal
numbers; six steps, the first two plain all-reduces (start_powerSGD_iter = 2).

The only thing not PyTorch's is the random start of Q: PyTorch draws it from its generator
seeded by numpy's RandomState, which trident does not reproduce; trident draws it from a
counter-based generator (compress/powersgd.hpp). torch.randn is therefore replaced, inside the
hook only, by trident's draw for the same tensor (ported below), so that both start from the same
Q and everything after it is PyTorch's arithmetic. Orthogonalisation: PyTorch's Gram-Schmidt for
rank <= 2, torch.linalg.qr above (its column signs may differ from trident's Householder; they
cancel in P Q^T).

Format (tests/fixtures/README.md; numbers are float32 values, the shortest text that reads back):
    gradients world 2 steps <S> tensors <name:rows x cols,...> lines <2 S>
    then per step: rank 0's bucket, rank 1's bucket (the same for every case)
    powersgd name <case> rank <r> start_iter <k> error_feedback <0|1> warm_start <0|1>
             min_compression_rate <x> seed <s> lines <S>
    then per step: the reduced bucket (the same on both ranks)
"""

import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

WORLD = 2
STEPS = 6
START_ITER = 2
TENSORS = [("a", (16, 12)), ("b", (12,)), ("c", (8, 4, 3)), ("d", (5, 3)), ("e", (16, 12)), ("f", (10, 20))]
CASES = [  # name, rank, error feedback, warm start
    ("rank2", 2, True, True),
    ("rank3_qr", 3, True, True),
    ("rank1_cold", 1, True, False),
    ("rank2_no_feedback", 2, False, True),
]
MASK = (1 << 64) - 1


def splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def trident_normal(key: int) -> float:
    """compress::detail::normal: Box-Muller on two 53-bit uniforms, rounded to float32."""
    u1 = ((splitmix64((2 * key) & MASK) >> 11) + 1.0) * 2.0**-53
    u2 = (splitmix64((2 * key + 1) & MASK) >> 11) * 2.0**-53
    return float(np.float32(math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)))


def trident_start(seed: int, bucket: int, tensor: int, draw: int, count: int) -> list:
    """The first Q of tensor `tensor` (its index in the bucket) as compress::powersgd draws it."""
    key = splitmix64(splitmix64(splitmix64(seed ^ ((bucket << 32) & MASK)) ^ tensor) ^ draw)
    key = (key << 24) & MASK
    return [trident_normal((key + e) & MASK) for e in range(count)]


def matrix_shape(shape):
    rows = shape[0]
    return rows, int(np.prod(shape)) // rows


class Bucket:
    """What powerSGD_hook reads of DDP's GradBucket."""

    def __init__(self, flat):
        self._buffer = flat
        self._grads, at = [], 0
        for _, shape in TENSORS:
            n = int(np.prod(shape))
            self._grads.append(flat[at : at + n].view(shape))
            at += n

    def buffer(self):
        return self._buffer

    def index(self):
        return 0

    def gradients(self):
        return self._grads

    def is_last(self):
        return True


def gradients(rank: int, step: int) -> np.ndarray:
    n = sum(int(np.prod(s)) for _, s in TENSORS)
    return np.random.RandomState(1000 * rank + step).standard_normal(n).astype(np.float32)


def worker(rank: int, port: int, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    out = {}
    real_randn = torch.randn
    for name, r, feedback, warm in CASES:
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=START_ITER,
                                   min_compression_rate=2, use_error_feedback=feedback, warm_start=warm,
                                   orthogonalization_epsilon=0, random_seed=0)
        results = []
        for step in range(1, STEPS + 1):
            # trident's starts for the compressed tensors, in the order PyTorch asks for them
            # (grouped by shape, groups in order of first appearance); `draw` as trident keys it.
            groups = {}
            for index, (_, shape) in enumerate(TENSORS):
                rows, cols = matrix_shape(shape)
                rank_here = min(rows, cols, r)
                if (rows + cols) * rank_here * 2 < rows * cols:
                    groups.setdefault((rows, cols), []).append((index, cols, rank_here))
            draw = 0 if warm else step
            pending = [trident_start(0, 0, index, draw, cols * rk) for group in groups.values() for index, cols, rk in group]

            def randn(*shape, **kwargs):
                values = pending.pop(0)
                return torch.tensor(values, dtype=kwargs.get("dtype", torch.float32)).view(*shape)

            flat = torch.from_numpy(gradients(rank, step).copy())
            torch.randn = randn
            try:
                reduced = psgd.powerSGD_hook(state, Bucket(flat)).wait()
            finally:
                torch.randn = real_randn
            # The hook drew its starts exactly when trident does: at the first compressed step (after
            # START_ITER plain ones),
            # and at every compressed step without warm starts.
            drawn = step > START_ITER and (step == START_ITER + 1 or not warm)
            if (len(pending) == 0) != drawn:
                sys.exit(f"make_powersgd_fixture: case {name}, step {step}: the hook {'did not draw' if drawn else 'drew'} a start")
            results.append(reduced.clone().numpy())
        out[name] = results
    queue.put((rank, out))
    dist.destroy_process_group()


def f32(x) -> str:
    """The shortest text that reads back to the same float32."""
    return str(np.float32(x))


def main():
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "tests/fixtures/torch_powersgd.txt"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory():
        port = 29500 + os.getpid() % 1000
        procs = [ctx.Process(target=worker, args=(rank, port, queue)) for rank in range(WORLD)]
        for p in procs:
            p.start()
        results = dict(queue.get() for _ in range(WORLD))
        for p in procs:
            p.join()
            if p.exitcode != 0:
                sys.exit(f"make_powersgd_fixture: a worker failed ({p.exitcode})")
    spec = ",".join(f"{name}:{matrix_shape(shape)[0]}x{matrix_shape(shape)[1]}" for name, shape in TENSORS)
    lines = [f"meta torch {torch.__version__} numpy {np.__version__} python {sys.version.split()[0]} lines 0"]
    lines.append(f"gradients world {WORLD} steps {STEPS} tensors {spec} lines {WORLD * STEPS}")
    for s in range(STEPS):
        for rank in range(WORLD):
            lines.append(" ".join(f32(x) for x in gradients(rank, s + 1)))
    for name, r, feedback, warm in CASES:
        a, b = results[0][name], results[1][name]
        for s in range(STEPS):  # every rank ends a step with the same bucket
            if not np.array_equal(a[s], b[s]):
                sys.exit(f"make_powersgd_fixture: case {name}, step {s + 1}: the ranks' results differ")
        lines.append(f"powersgd name {name} rank {r} start_iter {START_ITER} error_feedback {int(feedback)} warm_start {int(warm)} "
                     f"min_compression_rate 2 seed 0 lines {STEPS}")
        for s in range(STEPS):
            lines.append(" ".join(f32(x) for x in a[s]))
        # The fixture is worth its bytes only if compression changed something after the start.
        if np.allclose(a[-1], (gradients(0, STEPS) + gradients(1, STEPS)) / 2):
            sys.exit(f"make_powersgd_fixture: case {name} reduced exactly; expected compression")
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}: {len(CASES)} cases x {STEPS} steps")


if __name__ == "__main__":
    main()
