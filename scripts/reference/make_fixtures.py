#!/usr/bin/env python3
"""Record reference traces from the real DeepSpeed and PyTorch into tests/fixtures/.

The C++ tests compare trident's loss scaler, learning-rate schedules, optimizers and host
reference layers (nn/) against these traces. Run it through scripts/reference/make_fixtures.sh,
which makes the virtual environment with the pinned versions; the file format is described in
tests/fixtures/README.md.

Writes (all plain text, one record header line followed by its data lines):
  deepspeed_loss_scaler.txt  deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler.update_scale
  lr_schedules.txt           deepspeed.runtime.lr_schedules and torch.optim.lr_scheduler, 300 steps
  torch_optim.txt            torch.optim SGD / Adam / AdamW, float32, 200 steps, 16 elements
  torch_layers.txt           torch.nn LayerNorm / RMSNorm, scaled_dot_product_attention(is_causal=
                             True), gelu(approximate='tanh'), CrossEntropyLoss: float32 forward
                             and backward on fixed small inputs

Everything is seeded (the layer inputs are made from integers) and single-threaded, and the
script checks itself: the same schedule gives the same lr in lr_schedules.txt and
torch_optim.txt, every number reads back to the value written, DeepSpeed's schedules equal the
closed forms documented in the README, the layer cases repeat bit for bit, and so on.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

# Quieter DeepSpeed start-up; it runs on the CPU accelerator (no GPU is needed or used).
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import deepspeed  # noqa: E402
from deepspeed.runtime import lr_schedules as ds_lr  # noqa: E402
from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer  # noqa: E402
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaleConfig  # noqa: E402
from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer  # noqa: E402
from deepspeed.runtime.precision_config import DeepSpeedFP16Config  # noqa: E402

SEED = 20240611
LR_STEPS = 300  # steps per schedule in lr_schedules.txt
OPT_STEPS = 200  # steps per optimizer trace in torch_optim.txt
OPT_SIZE = 16  # parameter elements in torch_optim.txt
MIN_SCALE_MESSAGE = "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."


# --------------------------------------------------------------------------------------------
# Number formatting: every value must read back to exactly the value recorded.


def f64(x: float) -> str:
    """A double as '%.17g' (reads back exactly with strtod / std::stod)."""
    s = "%.17g" % float(x)
    assert float(s) == float(x) or (math.isnan(x) and math.isnan(float(s))), (x, s)
    return s


def f32(x) -> str:
    """A float32 as '%.9g' (reads back exactly with strtof, or strtod then a cast to float)."""
    v = np.float32(x)
    s = "%.9g" % float(v)
    assert np.float32(float(s)) == v and np.float32(np.float64(s)) == v, (x, s)
    return s


def par(x) -> str:
    """A header parameter: ints as ints, floats as Python's shortest exact repr."""
    if isinstance(x, bool):
        return "1" if x else "0"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        s = repr(x)
        assert float(s) == x
        return s
    s = str(x)
    assert s and not any(c.isspace() for c in s), s
    return s


def header(keyword: str, *pairs, lines: int) -> str:
    """'<keyword> <key> <value> ... lines <L>': every header ends with the number of data lines."""
    items = [keyword]
    for key, value in pairs:
        items += [key, par(value)]
    items += ["lines", str(lines)]
    return " ".join(items)


def meta_line(fixture: str) -> str:
    return header(
        "meta",
        ("fixture", fixture),
        ("format", 1),
        ("deepspeed", deepspeed.__version__),
        ("torch", torch.__version__),
        ("numpy", np.__version__),
        ("python", platform.python_version()),
        ("aten_cpu_capability", torch.backends.cpu.get_cpu_capability()),
        ("seed", SEED),
        ("generator", "scripts/reference/make_fixtures.py"),
        lines=0,
    )


# --------------------------------------------------------------------------------------------
# 1) DeepSpeed's DynamicLossScaler


def overflow_patterns() -> dict[str, np.ndarray]:
    """Named overflow sequences (1 = this step's gradients overflowed). RandomState's stream is
    frozen by numpy, so these do not change with the numpy version."""
    rs = np.random.RandomState(SEED)
    pats: dict[str, np.ndarray] = {}
    pats["random_p0.001"] = (rs.random_sample(3000) < 0.001).astype(np.int8)
    pats["random_p0.05"] = (rs.random_sample(2000) < 0.05).astype(np.int8)
    pats["random_p0.3"] = (rs.random_sample(600) < 0.3).astype(np.int8)
    # clean stretches of 1..600 steps alternating with bursts of 1..8 overflows in a row
    burst = []
    while len(burst) < 3000:
        burst += [0] * int(rs.randint(1, 601))
        burst += [1] * int(rs.randint(1, 9))
    pats["bursts"] = np.array(burst[:3000], dtype=np.int8)
    # an overflow every 2nd, 3rd, ... 7th step (hysteresis edge cases), each for 100 steps,
    # with 40 clean steps between them
    periodic = []
    for period in range(2, 8):
        periodic += [1 if (i % period) == period - 1 else 0 for i in range(100)] + [0] * 40
    pats["periodic"] = np.array(periodic, dtype=np.int8)
    # 20 clean steps, then nothing but overflows: the scale falls to min_scale and stays there
    # (or raises there)
    pats["storm"] = np.array([0] * 20 + [1] * 80, dtype=np.int8)
    # a long clean run: with scale_window 1 or 4 the Python float doubles past 2^1023 to inf;
    # then a few overflows and clean steps
    pats["clean_to_inf"] = np.array([0] * 4200 + [1] * 3 + [0] * 10, dtype=np.int8)
    return pats


@dataclass
class ScalerSetup:
    init_scale: float
    scale_window: int
    min_scale: float
    delayed_shift: int
    consecutive_hysteresis: bool
    raise_error_at_min_scale: bool
    scale_factor: float = 2.0  # not a constructor argument since 0.17.1: always 2.0

    def make(self) -> DynamicLossScaler:
        s = DynamicLossScaler(
            init_scale=self.init_scale,
            scale_window=self.scale_window,
            min_scale=self.min_scale,
            delayed_shift=self.delayed_shift,
            consecutive_hysteresis=self.consecutive_hysteresis,
            raise_error_at_min_scale=self.raise_error_at_min_scale,
        )
        assert s.scale_factor == self.scale_factor
        return s


@dataclass
class ScalerTrace:
    name: str
    pattern: str
    setup: ScalerSetup
    length: int = 0  # steps in the overflow sequence
    steps: int = 0  # update_scale calls made, the raising one included
    raised_at: int = 0  # 1-based step whose update_scale raised (0: none)
    exception: str = "none"
    message: str = ""
    # (step, overflow, cur_scale, cur_hysteresis, raised) for every step that overflowed,
    # changed the state, raised, or is the last one
    lines: list = field(default_factory=list)
    dense_scale: list = field(default_factory=list)  # cur_scale after every step (for checks)


def run_scaler(name: str, pattern: str, overflows: np.ndarray, setup: ScalerSetup) -> ScalerTrace:
    s = setup.make()
    t = ScalerTrace(name, pattern, setup, length=len(overflows))
    prev = (s.cur_scale, s.cur_hysteresis)
    for k, ov in enumerate(overflows.tolist(), start=1):
        before = (s.cur_scale, s.cur_hysteresis, s.cur_iter, s.last_overflow_iter)
        try:
            s.update_scale(bool(ov))
        except Exception as e:  # DeepSpeed raises a bare Exception at the minimum scale
            after = (s.cur_scale, s.cur_hysteresis, s.cur_iter, s.last_overflow_iter)
            assert after == before, "DeepSpeed changed its state before raising"
            t.steps, t.raised_at = k, k
            t.exception, t.message = type(e).__name__, str(e)
            t.lines.append((k, ov, s.cur_scale, s.cur_hysteresis, 1))
            t.dense_scale.append(s.cur_scale)
            return t
        t.steps = k
        t.dense_scale.append(s.cur_scale)
        state = (s.cur_scale, s.cur_hysteresis)
        if ov or state != prev or k == len(overflows):
            t.lines.append((k, ov, s.cur_scale, s.cur_hysteresis, 0))
        prev = state
    return t


def fp16_optimizer_scales(update_scale_fn, overflows: np.ndarray, setup: ScalerSetup, steps: int) -> list:
    """The other DeepSpeed rule: FP16_Optimizer / FP16_UnfusedOptimizer._update_scale (the
    non-ZeRO fp16 path), driven through its real code with a stand-in `self`."""
    args = DeepSpeedFP16Config(
        enabled=True,
        initial_scale_power=int(math.log2(setup.init_scale)),
        loss_scale_window=setup.scale_window,
        hysteresis=setup.delayed_shift,
        consecutive_hysteresis=setup.consecutive_hysteresis,
        min_loss_scale=int(setup.min_scale),
    ).dynamic_loss_scale_args()
    cfg = LossScaleConfig(torch.float16, True, 1.0, args)
    me = SimpleNamespace(loss_scale_config=cfg, verbose=False)
    out = []
    for ov in overflows[:steps].tolist():
        update_scale_fn(me, bool(ov))
        out.append(cfg.cur_scale)
    return out


def make_loss_scaler_traces() -> list[ScalerTrace]:
    pats = overflow_patterns()
    traces: list[ScalerTrace] = []

    def add(name, pattern, setup, steps=None):
        traces.append(run_scaler(name, pattern, pats[pattern][:steps], setup))

    # The full grid, init_scale 2^16 (DeepSpeed's fp16 initial_scale_power default), min 1,
    # without the error at the minimum so that every trace runs to its end (or to the
    # OverflowError once the scale is inf). With a small scale_window the scale changes on
    # nearly every step (a line each), so to keep the file small those traces take only the
    # first 300 (window 1) or 1000 (window 4) steps of the pattern.
    grid = [(w, h, c) for w in (1, 4, 1000) for h in (1, 2) for c in (False, True)]
    for pattern in ("random_p0.001", "random_p0.05", "random_p0.3", "bursts", "periodic"):
        for w, h, c in grid:
            add(f"grid_w{w}_h{h}_c{int(c)}_{pattern}", pattern, ScalerSetup(2.0**16, w, 1, h, c, False),
                steps={1: 300, 4: 1000}.get(w))
    # The long clean run: hysteresis plays no part before the scale is inf, so one setting
    # per window (delayed_shift 1 ends the same way, checked here but not written).
    for w in (1, 4, 1000):
        add(f"grid_w{w}_h2_c0_clean_to_inf", "clean_to_inf", ScalerSetup(2.0**16, w, 1, 2, False, False))
    h1 = run_scaler("", "clean_to_inf", pats["clean_to_inf"], ScalerSetup(2.0**16, 1, 1, 1, False, False))
    assert h1.exception == "OverflowError" and h1.dense_scale == traces[-3].dense_scale

    # Reaching the minimum from 2^4: a storm of overflows with and without
    # raise_error_at_min_scale, and random overflows with it (the grid has them without).
    for w, h, c in grid:
        for r in (False, True):
            add(f"min_w{w}_h{h}_c{int(c)}_r{int(r)}_storm", "storm", ScalerSetup(2**4, w, 1, h, c, r))
        add(f"min_w{w}_h{h}_c{int(c)}_r1_random_p0.3", "random_p0.3", ScalerSetup(2**4, w, 1, h, c, True))

    # A min_scale that no halving of the scale reaches exactly (max() clamps onto it).
    for pattern in ("storm", "bursts"):
        for r in (False, True):
            add(f"min3_w4_h2_c0_r{int(r)}_{pattern}", pattern, ScalerSetup(2.0**16, 4, 3, 2, False, r), steps=1000)

    # What the engine builds from an fp16 config that sets nothing: DeepSpeedFP16Config's
    # defaults (DynamicLossScaler's own constructor has no defaults since 0.17.1, except
    # raise_error_at_min_scale=True).
    d = DeepSpeedFP16Config(enabled=True).dynamic_loss_scale_args()
    config_defaults = ScalerSetup(d["init_scale"], d["scale_window"], d["min_scale"], d["delayed_shift"],
                                  d["consecutive_hysteresis"], True)
    assert (config_defaults.init_scale, config_defaults.scale_window, config_defaults.min_scale,
            config_defaults.delayed_shift, config_defaults.consecutive_hysteresis) == (2**16, 1000, 1, 2, False), d
    # The constructor defaults before 0.17.1 (init_scale 2**32, scale_window 1000, min_scale 1,
    # delayed_shift 1, consecutive_hysteresis False), run through today's update_scale.
    legacy = ScalerSetup(2**32, 1000, 1, 1, False, True)
    for pattern in ("random_p0.001", "random_p0.05", "bursts", "storm", "clean_to_inf"):
        add(f"config_defaults_{pattern}", pattern, config_defaults)
        add(f"legacy_ctor_defaults_{pattern}", pattern, legacy)

    # Self-checks.
    names = [t.name for t in traces]
    assert len(names) == len(set(names))
    for t in traces:
        if t.exception == "Exception":
            assert t.message == MIN_SCALE_MESSAGE, t.message
            assert t.setup.raise_error_at_min_scale and t.lines[-1][2] == t.setup.min_scale
        elif t.exception == "OverflowError":
            # int(inf) in the log message of an overflow once the scale has reached inf
            assert math.isinf(t.lines[-1][2]), t.name
        else:
            assert t.exception == "none" and t.steps == t.length
        # The non-ZeRO fp16 optimizers have no hysteresis and never raise at the minimum;
        # they agree step for step with DynamicLossScaler when delayed_shift is 1 (as long
        # as DynamicLossScaler did not raise).
        if t.setup.delayed_shift == 1 and not t.setup.raise_error_at_min_scale:
            n = t.steps - (1 if t.raised_at else 0)
            for fn in (FP16_Optimizer._update_scale, FP16_UnfusedOptimizer._update_scale):
                assert fp16_optimizer_scales(fn, pats[t.pattern], t.setup, n) == t.dense_scale[:n], t.name
    return traces


def write_loss_scaler(path: Path, traces: list[ScalerTrace]) -> None:
    out = [meta_line("deepspeed_loss_scaler")]
    for t in traces:
        s = t.setup
        out.append(
            header(
                "trace",
                ("name", t.name),
                ("impl", "DynamicLossScaler"),
                ("pattern", t.pattern),
                ("init_scale", float(s.init_scale)),
                ("scale_factor", s.scale_factor),
                ("scale_window", s.scale_window),
                ("min_scale", float(s.min_scale)),
                ("delayed_shift", s.delayed_shift),
                ("consecutive_hysteresis", s.consecutive_hysteresis),
                ("raise_error_at_min_scale", s.raise_error_at_min_scale),
                ("steps", t.steps),
                ("raised_at", t.raised_at),
                ("exception", t.exception),
                lines=len(t.lines),
            ))
        for step, ov, scale, hyst, raised in t.lines:
            out.append(f"{step} {ov} {f64(scale)} {hyst} {raised}")
    path.write_text("\n".join(out) + "\n")


# --------------------------------------------------------------------------------------------
# 2) Learning-rate schedules


@dataclass
class Schedule:
    name: str
    kind: str  # see README
    base_lr: float  # the optimizer's lr when the scheduler is made
    params: dict

    def make(self, opt: torch.optim.Optimizer):
        p = self.params
        sched = torch.optim.lr_scheduler
        if self.kind == "ds_warmup":
            return ds_lr.WarmupLR(opt, warmup_min_lr=p["warmup_min_lr"], warmup_max_lr=p["warmup_max_lr"],
                                  warmup_num_steps=p["warmup_num_steps"], warmup_type=p["warmup_type"])
        if self.kind == "ds_warmup_decay":
            return ds_lr.WarmupDecayLR(opt, total_num_steps=p["total_num_steps"], warmup_min_lr=p["warmup_min_lr"],
                                       warmup_max_lr=p["warmup_max_lr"], warmup_num_steps=p["warmup_num_steps"],
                                       warmup_type=p["warmup_type"])
        if self.kind == "ds_warmup_cosine":
            return ds_lr.WarmupCosineLR(opt, total_num_steps=p["total_num_steps"],
                                        warmup_min_ratio=p["warmup_min_ratio"], warmup_num_steps=p["warmup_num_steps"],
                                        cos_min_ratio=p["cos_min_ratio"], warmup_type=p["warmup_type"])
        if self.kind == "torch_linear":
            return sched.LinearLR(opt, start_factor=p["start_factor"], end_factor=p["end_factor"],
                                  total_iters=p["total_iters"])
        if self.kind == "torch_constant":
            return sched.ConstantLR(opt, factor=p["factor"], total_iters=p["total_iters"])
        if self.kind == "torch_linear_then_cosine":
            warm = sched.LinearLR(opt, start_factor=p["start_factor"], end_factor=p["end_factor"],
                                  total_iters=p["total_iters"])
            cos = sched.CosineAnnealingLR(opt, T_max=p["T_max"], eta_min=p["eta_min"])
            return sched.SequentialLR(opt, [warm, cos], milestones=[p["milestone"]])
        if self.kind == "torch_linear_then_linear":
            warm = sched.LinearLR(opt, start_factor=p["start_factor"], end_factor=p["end_factor"],
                                  total_iters=p["total_iters"])
            decay = sched.LinearLR(opt, start_factor=p["decay_start_factor"], end_factor=p["decay_end_factor"],
                                   total_iters=p["decay_total_iters"])
            return sched.SequentialLR(opt, [warm, decay], milestones=[p["milestone"]])
        raise ValueError(self.kind)


def schedules() -> list[Schedule]:
    S = []

    def ds_warmup(name, lr, mn, mx, w, typ):
        S.append(Schedule(name, "ds_warmup", lr, dict(warmup_min_lr=mn, warmup_max_lr=mx, warmup_num_steps=w,
                                                       warmup_type=typ)))

    def ds_decay(name, lr, total, mn, mx, w, typ):
        S.append(Schedule(name, "ds_warmup_decay", lr, dict(total_num_steps=total, warmup_min_lr=mn,
                                                             warmup_max_lr=mx, warmup_num_steps=w, warmup_type=typ)))

    def ds_cosine(name, lr, total, min_ratio, w, cos_min, typ):
        S.append(Schedule(name, "ds_warmup_cosine", lr, dict(total_num_steps=total, warmup_min_ratio=min_ratio,
                                                              warmup_num_steps=w, cos_min_ratio=cos_min,
                                                              warmup_type=typ)))

    def torch_linear_cosine(name, lr, start, w, t_max, eta_min):
        S.append(Schedule(name, "torch_linear_then_cosine", lr, dict(start_factor=start, end_factor=1.0,
                                                                      total_iters=w, T_max=t_max, eta_min=eta_min,
                                                                      milestone=w)))

    def torch_linear_linear(name, lr, start, w, d, end):
        S.append(Schedule(name, "torch_linear_then_linear", lr, dict(start_factor=start, end_factor=1.0,
                                                                      total_iters=w, decay_start_factor=1.0,
                                                                      decay_end_factor=end, decay_total_iters=d,
                                                                      milestone=w)))

    # DeepSpeed WarmupLR (default warmup_type is 'log')
    ds_warmup("ds_warmup_log_w10", 1e-3, 0.0, 1e-3, 10, "log")
    ds_warmup("ds_warmup_log_w50_min1e-4", 1e-3, 1e-4, 1e-3, 50, "log")
    ds_warmup("ds_warmup_linear_w10", 1e-3, 0.0, 1e-3, 10, "linear")
    ds_warmup("ds_warmup_linear_w50_min1e-4", 1e-3, 1e-4, 1e-3, 50, "linear")
    ds_warmup("ds_warmup_linear_w1", 1e-3, 0.0, 1e-3, 1, "linear")  # DeepSpeed uses max(2, w)
    ds_warmup("ds_warmup_linear_w10_lr1e-2", 1e-2, 0.0, 1e-2, 10, "linear")
    # DeepSpeed WarmupDecayLR
    ds_decay("ds_warmup_decay_linear_w10_t200", 1e-3, 200, 0.0, 1e-3, 10, "linear")
    ds_decay("ds_warmup_decay_log_w50_t200_min1e-4", 1e-3, 200, 1e-4, 1e-3, 50, "log")
    ds_decay("ds_warmup_decay_linear_w10_t200_lr1e-2", 1e-2, 200, 0.0, 1e-2, 10, "linear")
    # DeepSpeed WarmupCosineLR (a ratio of the optimizer's lr; default cos_min_ratio 1e-4)
    ds_cosine("ds_warmup_cosine_linear_w10_t200", 1e-3, 200, 0.0, 10, 1e-4, "linear")
    ds_cosine("ds_warmup_cosine_log_w50_t200_min0.1_cos0.05", 1e-3, 200, 0.1, 50, 0.05, "log")
    ds_cosine("ds_warmup_cosine_linear_w10_t200_lr1e-2", 1e-2, 200, 0.0, 10, 1e-4, "linear")
    # PyTorch LinearLR warm-up alone (and with its defaults: start_factor 1/3, total_iters 5)
    S.append(Schedule("torch_linear_default", "torch_linear", 1e-3,
                      dict(start_factor=1.0 / 3, end_factor=1.0, total_iters=5)))
    S.append(Schedule("torch_linear_s0.01_w10", "torch_linear", 1e-3,
                      dict(start_factor=0.01, end_factor=1.0, total_iters=10)))
    # PyTorch SequentialLR(LinearLR warm-up, CosineAnnealingLR); CosineAnnealingLR is periodic,
    # so the last one (T_max 100) rises again after step 120
    torch_linear_cosine("torch_linear_cosine_w10_t190", 1e-3, 0.01, 10, 190, 0.0)
    torch_linear_cosine("torch_linear_cosine_w10_t190_lr1e-2", 1e-2, 0.01, 10, 190, 0.0)
    torch_linear_cosine("torch_linear_cosine_w20_t100_eta1e-5", 1e-3, 0.1, 20, 100, 1e-5)
    # PyTorch SequentialLR(LinearLR warm-up, LinearLR decay)
    torch_linear_linear("torch_linear_linear_w10_d190", 1e-3, 0.01, 10, 190, 0.0)
    torch_linear_linear("torch_linear_linear_w10_d100_end0.1", 1e-3, 0.01, 10, 100, 0.1)
    # PyTorch ConstantLR (defaults: factor 1/3 for total_iters 5) and factor 1 (= no scheduler)
    for name, factor, iters in (("torch_constantlr_default", 1.0 / 3, 5), ("torch_constantlr_f0.5_n50", 0.5, 50),
                                ("torch_constantlr_f1", 1.0, 5)):
        S.append(Schedule(name, "torch_constant", 1e-3, dict(factor=factor, total_iters=iters)))
    return S


def drive_lr(schedule: Schedule | None, opt: torch.optim.Optimizer, steps: int) -> list[float]:
    """A training loop: optimizer.step(); scheduler.step(). Returns the lr each optimizer step
    used (param_groups[0]['lr'] when optimizer step k = 1..steps runs)."""
    sched = schedule.make(opt) if schedule is not None else None
    used = []
    for k in range(1, steps + 1):
        lr = opt.param_groups[0]["lr"]
        assert isinstance(lr, float), type(lr)
        used.append(lr)
        opt.step()
        if sched is not None:
            sched.step()
    return used


def lr_trace(schedule: Schedule, steps: int = LR_STEPS) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=schedule.base_lr)  # no gradient: step() leaves p alone
    return drive_lr(schedule, opt, steps)


def expected_lr(s: Schedule, k: int) -> float:
    """The closed forms documented in the README; DeepSpeed's must match bit for bit, PyTorch's
    (computed recursively by torch) to a few ulps."""
    p = s.params
    if s.kind.startswith("ds_"):
        i = k - 2  # optimizer step k uses DeepSpeed's iteration k - 2
        w = max(2, p["warmup_num_steps"])
        if i < 0:  # the value the scheduler's constructor set
            return 0.0 if s.kind == "ds_warmup_cosine" else p["warmup_min_lr"]

        def warm(i):
            if p["warmup_type"] == "log":
                return (1.0 / math.log(w)) * math.log(i + 1)
            return i / w

        if s.kind in ("ds_warmup", "ds_warmup_decay"):
            if i < w:
                gamma = warm(i)
            elif s.kind == "ds_warmup":
                gamma = 1.0
            else:
                t = p["total_num_steps"]
                gamma = max(0.0, float(t - i) / float(max(1.0, t - w)))
            return p["warmup_min_lr"] + (p["warmup_max_lr"] - p["warmup_min_lr"]) * gamma
        if i < w:
            ratio = p["warmup_min_ratio"] + warm(i) * (1.0 - p["warmup_min_ratio"])
        else:
            progress = min(1.0, (i - w + 1) / max(1, p["total_num_steps"] - w))
            ratio = max(0.0, p["cos_min_ratio"] + (1.0 - p["cos_min_ratio"]) * (1 + math.cos(math.pi * progress)) / 2)
        return s.base_lr * ratio
    e = k - 1  # optimizer step k uses PyTorch's epoch k - 1
    lr = s.base_lr

    def linear(start, end, total, e):
        return start + (end - start) * min(e, total) / total

    if s.kind == "torch_linear":
        return lr * linear(p["start_factor"], p["end_factor"], p["total_iters"], e)
    if s.kind == "torch_constant":
        return lr * (p["factor"] if e < p["total_iters"] else 1.0)
    m = p["milestone"]
    if e < m:
        return lr * linear(p["start_factor"], p["end_factor"], p["total_iters"], e)
    e -= m
    if s.kind == "torch_linear_then_cosine":
        return p["eta_min"] + (lr - p["eta_min"]) * (1 + math.cos(math.pi * e / p["T_max"])) / 2
    return lr * linear(p["decay_start_factor"], p["decay_end_factor"], p["decay_total_iters"], e)


def make_lr_traces() -> dict[str, tuple[Schedule, list[float]]]:
    out = {}
    worst = {}
    for s in schedules():
        assert s.name not in out
        lrs = lr_trace(s)
        assert lr_trace(s) == lrs  # deterministic
        for k, lr in enumerate(lrs, start=1):
            want = expected_lr(s, k)
            if s.kind.startswith("ds_"):
                assert lr == want, (s.name, k, lr, want)
            else:
                err = abs(lr - want) / max(abs(want), 1e-300)
                assert err < 1e-12 or abs(lr - want) < 1e-18, (s.name, k, lr, want)
                worst[s.name] = max(worst.get(s.name, 0.0), err)
        out[s.name] = (s, lrs)
    for name, err in worst.items():
        print(f"  {name}: PyTorch's recursive lr vs the closed form, max relative difference {err:.3g}")
    return out


def write_lr(path: Path, traces: dict[str, tuple[Schedule, list[float]]]) -> None:
    out = [meta_line("lr_schedules")]
    for name, (s, lrs) in traces.items():
        out.append(header("schedule", ("name", name), ("kind", s.kind), ("base_lr", s.base_lr),
                          *s.params.items(), ("steps", len(lrs)), lines=len(lrs)))
        out += [f64(lr) for lr in lrs]
    path.write_text("\n".join(out) + "\n")


# --------------------------------------------------------------------------------------------
# 3) torch.optim float32 traces


@dataclass
class OptConfig:
    name: str
    optimizer: str  # sgd | adam | adamw
    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    beta1: float = 0.0
    beta2: float = 0.0
    eps: float = 0.0
    amsgrad: bool = False

    def make(self, params, **path):
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, dampening=self.dampening,
                                   nesterov=self.nesterov, weight_decay=self.weight_decay, **path)
        cls = torch.optim.Adam if self.optimizer == "adam" else torch.optim.AdamW
        return cls(params, lr=self.lr, betas=(self.beta1, self.beta2), eps=self.eps, weight_decay=self.weight_decay,
                   amsgrad=self.amsgrad, **path)


def optimizer_configs() -> list[OptConfig]:
    sgd = dict(optimizer="sgd", lr=1e-2)
    adam = dict(optimizer="adam", lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8)  # torch's defaults
    adamw = dict(adam, optimizer="adamw", weight_decay=1e-2)  # AdamW's default weight_decay is 0.01
    return [
        OptConfig("sgd", **sgd),
        OptConfig("sgd_momentum", **sgd, momentum=0.9),
        OptConfig("sgd_nesterov", **sgd, momentum=0.9, nesterov=True),
        OptConfig("sgd_momentum_dampening_wd", **sgd, momentum=0.9, dampening=0.1, weight_decay=0.01),
        OptConfig("adam", **adam),
        OptConfig("adam_wd", **adam, weight_decay=0.01),
        OptConfig("adam_amsgrad", **adam, amsgrad=True),
        OptConfig("adamw", **adamw),
        OptConfig("adamw_amsgrad", **dict(adamw, amsgrad=True)),
        OptConfig("adamw_wd0.1", **dict(adamw, weight_decay=0.1)),
        OptConfig("adamw_betas0.8_0.95", **dict(adamw, beta1=0.8, beta2=0.95)),
        OptConfig("adamw_eps1e-6", **dict(adamw, eps=1e-6)),
    ]


# optimizer config -> the schedules it also runs under (names of lr_schedules.txt blocks)
SCHEDULED = {
    "adam": ["ds_warmup_linear_w10", "ds_warmup_decay_linear_w10_t200", "ds_warmup_cosine_linear_w10_t200",
             "torch_linear_cosine_w10_t190"],
    "adamw": ["ds_warmup_linear_w10", "ds_warmup_decay_linear_w10_t200", "ds_warmup_cosine_linear_w10_t200",
              "torch_linear_cosine_w10_t190"],
    "sgd_momentum": ["ds_warmup_linear_w10_lr1e-2", "ds_warmup_decay_linear_w10_t200_lr1e-2",
                     "ds_warmup_cosine_linear_w10_t200_lr1e-2", "torch_linear_cosine_w10_t190_lr1e-2"],
}


def optim_inputs() -> tuple[np.ndarray, np.ndarray]:
    rs = np.random.RandomState(SEED + 1)
    init = rs.standard_normal(OPT_SIZE).astype(np.float32)
    grads = (rs.standard_normal((OPT_STEPS, OPT_SIZE)) * 10.0 ** rs.uniform(-3, 1, (OPT_STEPS, OPT_SIZE)))
    grads = grads.astype(np.float32)
    grads[::17, 5] = 0.0  # some exact zeros
    grads[50:60, :] *= np.float32(1e-4)  # and a stretch of tiny gradients
    # exactly what the file will hold
    init = np.array([np.float32(f32(x)) for x in init], dtype=np.float32)
    grads = np.array([[np.float32(f32(x)) for x in row] for row in grads], dtype=np.float32)
    return init, grads


def optimizer_trace(cfg: OptConfig, schedule: Schedule | None, init, grads, **path):
    p = torch.nn.Parameter(torch.from_numpy(init.copy()))
    opt = cfg.make([p], **path)
    sched = schedule.make(opt) if schedule is not None else None
    if schedule is not None:
        assert schedule.base_lr == cfg.lr, (cfg.name, schedule.name)
    lrs, rows = [], []
    for k in range(len(grads)):
        lr = opt.param_groups[0]["lr"]
        assert isinstance(lr, float)
        lrs.append(lr)
        p.grad = torch.from_numpy(grads[k].copy())
        opt.step()
        if sched is not None:
            sched.step()
        assert p.dtype == torch.float32
        rows.append(p.detach().numpy().copy())
    return lrs, np.array(rows)


def make_optim_traces(lr_traces):
    init, grads = optim_inputs()
    traces = []
    notes = []
    for cfg in optimizer_configs():
        for sched_name in [None] + SCHEDULED.get(cfg.name, []):
            schedule = lr_traces[sched_name][0] if sched_name else None
            name = cfg.name + (f"_{sched_name}" if sched_name else "")
            lrs, rows = optimizer_trace(cfg, schedule, init, grads, foreach=False)
            again = optimizer_trace(cfg, schedule, init, grads, foreach=False)
            assert again[0] == lrs and np.array_equal(again[1], rows)  # deterministic
            want = lr_traces[sched_name][1][:OPT_STEPS] if sched_name else [cfg.lr] * OPT_STEPS
            assert lrs == want, name  # the same lr as the schedule's block in lr_schedules.txt
            assert np.all(np.isfinite(rows))
            traces.append((name, cfg, sched_name or "constant", lrs, rows))
            # torch's default path (foreach=None, fused=None), and for the report foreach/fused
            d_lrs, d_rows = optimizer_trace(cfg, schedule, init, grads)
            if not (d_lrs == lrs and np.array_equal(d_rows, rows)):
                traces.append((name + "_default", cfg, sched_name or "constant", d_lrs, d_rows))
            notes.append((name, "default", max_rel(d_rows, rows)))
            for path in (dict(foreach=True), dict(fused=True)):
                try:
                    _, o_rows = optimizer_trace(cfg, schedule, init, grads, **path)
                    notes.append((name, next(iter(path)), max_rel(o_rows, rows)))
                except (RuntimeError, TypeError) as e:
                    notes.append((name, next(iter(path)), f"unavailable: {e}"))
    return init, grads, traces, notes


def max_rel(a: np.ndarray, b: np.ndarray):
    """(elements differing, max |a-b| / |b|, max difference in float32 ulps)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    diff = a != b
    rel = np.abs(a64 - b64) / np.maximum(np.abs(b64), 1e-30)
    ulps = np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))
    return int(diff.sum()), float(rel.max()), int(ulps.max())


def write_optim(path: Path, init, grads, traces) -> None:
    out = [meta_line("torch_optim")]
    out.append(header("init", ("size", OPT_SIZE), lines=1))
    out.append(" ".join(f32(x) for x in init))
    out.append(header("grads", ("steps", OPT_STEPS), ("size", OPT_SIZE), lines=OPT_STEPS))
    out += [" ".join(f32(x) for x in row) for row in grads]
    for name, c, sched_name, lrs, rows in traces:
        out.append(
            header(
                "trace",
                ("name", name),
                ("optimizer", c.optimizer),
                ("lr", c.lr),
                ("momentum", c.momentum),
                ("dampening", c.dampening),
                ("nesterov", c.nesterov),
                ("weight_decay", c.weight_decay),
                ("beta1", c.beta1),
                ("beta2", c.beta2),
                ("eps", c.eps),
                ("amsgrad", c.amsgrad),
                ("schedule", sched_name),
                ("steps", len(lrs)),
                lines=len(lrs),
            ))
        for lr, row in zip(lrs, rows):
            out.append(f64(lr) + " " + " ".join(f32(x) for x in row))
    path.write_text("\n".join(out) + "\n")


# --------------------------------------------------------------------------------------------
# 4) torch.nn layers: float32 forward and backward on fixed small inputs (torch_layers.txt)

PATTERN_MOD = 2039  # a prime


def pattern(shape, mul: int, add: int, shift: int = 9, offset: float = 0.0) -> np.ndarray:
    """Fixed inputs from integers: ((mul * i^2 + add * i + 1) % 2039 - 1019) / 2^shift + offset,
    i the flat index (a quadratic, so that neighbours are not a ramp). Every value is exact in
    float32 (a numerator below 2^10 over a power of two, plus a small power of two), so the inputs
    depend on no random stream and any language can make them; the file holds them anyway."""
    shape = tuple(shape)
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    n = (mul * i * i + add * i + 1) % PATTERN_MOD - PATTERN_MOD // 2
    v = n.astype(np.float64) / float(2**shift) + offset
    out = v.astype(np.float32).reshape(shape)
    assert np.array_equal(out.astype(np.float64), v.reshape(shape)), "pattern values must be exact in float32"
    return out


@dataclass
class LayerCase:
    name: str
    op: str  # layer_norm | rms_norm | causal_attention | gelu | cross_entropy
    params: list  # (key, value) for the case header
    inputs: list  # (tensor name, array)
    outputs: list  # (tensor name, array)


def as_np(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    assert t.dtype in (torch.float32, torch.float64, torch.int64) and t.device.type == "cpu"
    return t.contiguous().numpy().copy()


def tensor(a: np.ndarray, dtype=torch.float32, grad: bool = False) -> torch.Tensor:
    t = torch.from_numpy(a.copy()).to(dtype)
    return t.requires_grad_() if grad else t


# Each case runs in float32, the recording; make_layer_cases runs it again in float64 to measure
# how far torch's own float32 results are from exact (for the report and the README).


def layer_norm_case(name, rows, hidden, eps, bias, offset=0.0, dtype=torch.float32) -> LayerCase:
    x = pattern((rows, hidden), 37, 11, offset=offset)
    weight = pattern((hidden,), 53, 5, shift=11, offset=1.0)  # around 1
    b = pattern((hidden,), 71, 3, shift=11)
    dy = pattern((rows, hidden), 29, 7)
    m = torch.nn.LayerNorm(hidden, eps=eps, bias=bias, dtype=dtype)
    with torch.no_grad():
        m.weight.copy_(tensor(weight, dtype))
        if bias:
            m.bias.copy_(tensor(b, dtype))
    xt = tensor(x, dtype, grad=True)
    y = m(xt)
    y.backward(tensor(dy, dtype))
    # The statistics nn.LayerNorm saves for backward: it calls aten.native_layer_norm, which
    # also returns them (checked: the same output bits).
    y2, mean, rstd = torch.ops.aten.native_layer_norm(xt.detach(), [hidden], m.weight.detach(),
                                                      m.bias.detach() if bias else None, eps)
    assert torch.equal(y2, y.detach())
    ins = [("x", x), ("weight", weight)] + ([("bias", b)] if bias else []) + [("dy", dy)]
    outs = [("y", as_np(y)), ("mean", as_np(mean).reshape(rows)), ("rstd", as_np(rstd).reshape(rows)),
            ("dx", as_np(xt.grad)), ("dweight", as_np(m.weight.grad))]
    if bias:
        outs.append(("dbias", as_np(m.bias.grad)))
    params = [("rows", rows), ("hidden", hidden), ("eps", eps), ("bias", bias)]
    return LayerCase(name, "layer_norm", params, ins, outs)


def rms_norm_case(name, rows, hidden, eps, dtype=torch.float32) -> LayerCase:
    x = pattern((rows, hidden), 43, 19)
    weight = pattern((hidden,), 59, 23, shift=11, offset=1.0)
    dy = pattern((rows, hidden), 31, 2)
    m = torch.nn.RMSNorm(hidden, eps=eps, dtype=dtype)
    with torch.no_grad():
        m.weight.copy_(tensor(weight, dtype))
    xt = tensor(x, dtype, grad=True)
    y = m(xt)
    y.backward(tensor(dy, dtype))
    return LayerCase(name, "rms_norm", [("rows", rows), ("hidden", hidden), ("eps", eps)],
                     [("x", x), ("weight", weight), ("dy", dy)],
                     [("y", as_np(y)), ("dx", as_np(xt.grad)), ("dweight", as_np(m.weight.grad))])


def attention_forward_backward(qkv: np.ndarray, dout: np.ndarray, dtype=torch.float32, backend=None):
    """scaled_dot_product_attention(q, k, v, is_causal=True) with trident's layouts: qkv
    [seq, batch, heads, 3, head_dim] in, out [seq, batch, heads, head_dim] out, dqkv as qkv."""
    t = tensor(qkv, dtype, grad=True)
    q, k, v = (t[:, :, :, j, :].permute(1, 2, 0, 3) for j in range(3))  # [batch, heads, seq, head_dim]
    if backend is None:
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        with torch.nn.attention.sdpa_kernel(backend):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = o.permute(2, 0, 1, 3)  # [seq, batch, heads, head_dim]
    out.backward(tensor(dout, dtype))
    return out.detach().contiguous(), t.grad, o.grad_fn.name()


def attention_case(name, seq, batch, heads, head_dim, shift=9, dtype=torch.float32) -> LayerCase:
    qkv = pattern((seq, batch, heads, 3, head_dim), 61, 17, shift=shift)
    dout = pattern((seq, batch, heads, head_dim), 41, 13)
    out, dqkv, _ = attention_forward_backward(qkv, dout, dtype)
    return LayerCase(name, "causal_attention",
                     [("seq", seq), ("batch", batch), ("heads", heads), ("head_dim", head_dim)],
                     [("qkv", qkv), ("dout", dout)], [("out", as_np(out)), ("dqkv", as_np(dqkv))])


def gelu_case(name, rows, cols, dtype=torch.float32) -> LayerCase:
    x = pattern((rows, cols), 67, 29, shift=7)  # [-8, 8]
    dy = pattern((rows, cols), 47, 31)
    xt = tensor(x, dtype, grad=True)
    y = torch.nn.functional.gelu(xt, approximate="tanh")
    y.backward(tensor(dy, dtype))
    return LayerCase(name, "gelu", [("approximate", "tanh"), ("size", x.size)], [("x", x), ("dy", dy)],
                     [("y", as_np(y)), ("dx", as_np(xt.grad))])


def cross_entropy_case(name, batch, classes, dloss, dtype=torch.float32) -> LayerCase:
    logits = pattern((batch, classes), 73, 37, shift=7)  # [-8, 8]
    target = np.array([(r * 7 + 3) % classes for r in range(batch)], dtype=np.int64)
    lt = tensor(logits, dtype, grad=True)
    loss = torch.nn.CrossEntropyLoss()(lt, torch.from_numpy(target))
    loss.backward(torch.tensor(dloss, dtype=dtype))
    return LayerCase(name, "cross_entropy", [("batch", batch), ("classes", classes), ("dloss", dloss)],
                     [("logits", logits), ("target", target)],
                     [("loss", as_np(loss).reshape(1)), ("dlogits", as_np(lt.grad))])


def layer_cases(dtype=torch.float32) -> list[LayerCase]:
    d = dict(dtype=dtype)
    return [
        layer_norm_case("layer_norm_r3_h8", 3, 8, 1e-5, True, **d),
        layer_norm_case("layer_norm_r4_h64_offset8", 4, 64, 1e-5, True, offset=8.0, **d),  # mean >> std
        layer_norm_case("layer_norm_r3_h8_nobias_eps1e-3", 3, 8, 1e-3, False, **d),
        rms_norm_case("rms_norm_r3_h8", 3, 8, 1e-6, **d),
        rms_norm_case("rms_norm_r4_h64_eps1e-5", 4, 64, 1e-5, **d),
        attention_case("attention_s5_b2_h3_d4", 5, 2, 3, 4, **d),
        attention_case("attention_s7_b1_h2_d8_sharp", 7, 1, 2, 8, shift=7, **d),  # |qkv| <= 8: peaked softmax
        attention_case("attention_s32_b2_h2_d16", 32, 2, 2, 16, **d),
        gelu_case("gelu_r4_c64", 4, 64, **d),
        cross_entropy_case("cross_entropy_b4_c10", 4, 10, 1.0, **d),
        cross_entropy_case("cross_entropy_b3_c50_dloss0.5", 3, 50, 0.5, **d),
    ]


def normwise(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b| (0 when both are 0)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    top = float(np.abs(a64 - b64).max()) if a.size else 0.0
    return top / max(float(np.abs(b64).max()), 1e-300) if top else 0.0


def make_layer_cases():
    cases = layer_cases()
    again = layer_cases()
    for c, d in zip(cases, again):  # deterministic
        assert [n for n, _ in c.outputs] == [n for n, _ in d.outputs]
        assert all(np.array_equal(x, y) for (_, x), (_, y) in zip(c.outputs, d.outputs)), c.name
        assert all(np.all(np.isfinite(a)) for _, a in c.outputs), c.name
    # For the report and the README: how far torch's float32 results are from its own float64
    # ones (normwise, per output), and, for attention, from its other CPU backend.
    notes = []
    for c, c64 in zip(cases, layer_cases(torch.float64)):
        notes.append((c.name, "float32 vs float64", " ".join(
            f"{n}:{normwise(a, b):.2g}" for (n, a), (_, b) in zip(c.outputs, c64.outputs))))
    from torch.nn.attention import SDPBackend
    for c in cases:
        if c.op != "causal_attention":
            continue
        qkv, dout = dict(c.inputs)["qkv"], dict(c.inputs)["dout"]
        want = dict(c.outputs)
        _, _, kernel = attention_forward_backward(qkv, dout)
        om, gm, _ = attention_forward_backward(qkv, dout, backend=SDPBackend.MATH)
        notes.append((c.name, f"MATH backend vs {kernel.removesuffix('Backward0')}",
                      f"out:{normwise(om.numpy(), want['out']):.2g} "
                      f"dqkv:{normwise(gm.numpy(), want['dqkv']):.2g}"))
    return cases, notes


def shape_text(a: np.ndarray) -> str:
    return ",".join(str(d) for d in a.shape)


def write_layers(path: Path, cases: list[LayerCase]) -> None:
    out = [meta_line("torch_layers")]
    for c in cases:
        out.append(header("case", ("name", c.name), ("op", c.op), *c.params,
                          ("inputs", len(c.inputs)), ("outputs", len(c.outputs)), lines=0))
        for role, tensors in (("in", c.inputs), ("out", c.outputs)):
            for tname, a in tensors:
                assert a.ndim >= 1 and a.dtype in (np.float32, np.int64), (c.name, tname, a.dtype)
                fmt = str if a.dtype == np.int64 else f32
                rows = a.reshape(-1, a.shape[-1])
                out.append(header("tensor", ("case", c.name), ("name", tname), ("role", role),
                                  ("dtype", "int64" if a.dtype == np.int64 else "float32"),
                                  ("shape", shape_text(a)), lines=len(rows)))
                out += [" ".join(fmt(x) for x in row.tolist()) for row in rows]
    path.write_text("\n".join(out) + "\n")


# --------------------------------------------------------------------------------------------
# Reading the files back (the same way the C++ tests will: header tokens, then data tokens)


def read_records(path: Path):
    lines = path.read_text().split("\n")
    assert lines[-1] == ""
    i, records = 0, []
    while i < len(lines) - 1:
        tok = lines[i].split()
        assert len(tok) % 2 == 1 and tok[-2] == "lines", tok[:3]
        hdr = dict(zip(tok[1::2], tok[2::2]))
        n = int(hdr["lines"])
        records.append((tok[0], hdr, [l.split() for l in lines[i + 1:i + 1 + n]]))
        i += 1 + n
    return records


def check_files(out_dir: Path, scaler_traces, lr_traces, optim_traces) -> None:
    recs = read_records(out_dir / "deepspeed_loss_scaler.txt")
    assert recs[0][0] == "meta" and len(recs) == 1 + len(scaler_traces)
    for (_, hdr, rows), t in zip(recs[1:], scaler_traces):
        assert hdr["name"] == t.name and int(hdr["steps"]) == t.steps
        dense = [None] * t.steps  # replay the sparse lines into the per-step scale
        last, cur = 0, float(hdr["init_scale"])
        for step, ov, scale, hyst, raised in rows:
            for k in range(last + 1, int(step)):
                dense[k - 1] = cur
            cur = float(scale)
            dense[int(step) - 1] = cur
            last = int(step)
        assert dense == [float(x) for x in t.dense_scale], t.name
    recs = read_records(out_dir / "lr_schedules.txt")
    lr_by_name = {hdr["name"]: [float(r[0]) for r in rows] for kind, hdr, rows in recs if kind == "schedule"}
    assert lr_by_name == {k: v[1] for k, v in lr_traces.items()}
    recs = read_records(out_dir / "torch_optim.txt")
    init, grads, traces = optim_traces
    assert [np.float32(x) for x in recs[1][2][0]] == list(init)
    for (kind, hdr, rows), (name, _, sched_name, lrs, params) in zip(recs[3:], traces):
        assert kind == "trace" and hdr["name"] == name and hdr["schedule"] == sched_name
        file_lrs = [float(r[0]) for r in rows]
        assert file_lrs == lrs
        if sched_name != "constant":  # the lr of the named schedule, step for step
            assert file_lrs == lr_by_name[sched_name][:len(file_lrs)], name
        assert np.array_equal(np.array([[np.float32(x) for x in r[1:]] for r in rows]), params)


def check_layers(path: Path, cases: list[LayerCase]) -> None:
    recs = read_records(path)
    assert recs[0][0] == "meta"
    i = 1
    for c in cases:
        kind, hdr, rows = recs[i]
        assert kind == "case" and hdr["name"] == c.name and hdr["op"] == c.op, (kind, hdr)
        assert int(hdr["inputs"]) == len(c.inputs) and int(hdr["outputs"]) == len(c.outputs)
        i += 1
        for role, tensors in (("in", c.inputs), ("out", c.outputs)):
            for tname, a in tensors:
                kind, hdr, rows = recs[i]
                i += 1
                assert kind == "tensor" and hdr["case"] == c.name and hdr["name"] == tname and hdr["role"] == role
                assert hdr["shape"] == shape_text(a)
                if a.dtype == np.int64:
                    back = np.array([[int(x) for x in r] for r in rows], dtype=np.int64)
                else:
                    back = np.array([[np.float32(x) for x in r] for r in rows], dtype=np.float32)
                assert np.array_equal(back.reshape(a.shape), a), (c.name, tname)
    assert i == len(recs)


# --------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "tests" / "fixtures")
    ap.add_argument("--any-cpu", action="store_true", help="record even without torch's AVX2/AVX512 kernels")
    args = ap.parse_args()

    # torch's CPU kernels fuse multiply-adds (FMA) in their AVX2/AVX512 builds and not in the
    # DEFAULT one, which changes the last bits of the optimizer traces; make_fixtures.sh pins
    # ATEN_CPU_CAPABILITY=avx2 (AVX512 gives the same bits).
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512") and not args.any_cpu:
        sys.exit(f"torch runs its {capability} CPU kernels here; the fixtures are recorded with AVX2 "
                 "(set ATEN_CPU_CAPABILITY=avx2 on an x86-64 CPU that has it, or pass --any-cpu)")
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    warnings.filterwarnings("ignore")  # SequentialLR's epoch deprecation, DeepSpeed's start-up
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    deepspeed.utils.logger.setLevel(logging.ERROR)

    # DynamicLossScaler.update_scale asks deepspeed.comm for the rank, so it needs a process
    # group: one process, gloo, rendezvous through a temporary file (no network).
    with tempfile.TemporaryDirectory() as tmp:
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, init_method=f"file://{tmp}/rdzv",
                                   rank=0, world_size=1, verbose=False)
        deepspeed.utils.logger.setLevel(logging.ERROR)
        print(f"deepspeed {deepspeed.__version__}, torch {torch.__version__}, numpy {np.__version__}")

        print("loss scaler traces ...")
        scaler_traces = make_loss_scaler_traces()
        print("lr schedules ...")
        lr_traces = make_lr_traces()
        print("optimizer traces ...")
        init, grads, optim_traces, notes = make_optim_traces(lr_traces)
        print("torch.nn layers ...")
        layers, layer_notes = make_layer_cases()

    args.out.mkdir(parents=True, exist_ok=True)
    write_loss_scaler(args.out / "deepspeed_loss_scaler.txt", scaler_traces)
    write_lr(args.out / "lr_schedules.txt", lr_traces)
    write_optim(args.out / "torch_optim.txt", init, grads, optim_traces)
    check_files(args.out, scaler_traces, lr_traces, (init, grads, optim_traces))
    write_layers(args.out / "torch_layers.txt", layers)
    check_layers(args.out / "torch_layers.txt", layers)

    raised = [t for t in scaler_traces if t.raised_at]
    print(f"{len(scaler_traces)} loss-scaler traces ({len(raised)} raise: "
          f"{sorted(set(t.exception for t in raised))}), {len(lr_traces)} schedules, "
          f"{len(optim_traces)} optimizer traces")
    print("other torch.optim paths against foreach=False (elements differing, max rel, max ulps):")
    for name, path, what in notes:
        if path != "default" or what[0]:
            print(f"  {name:60s} {path:8s} {what}")
    if all(what[0] == 0 for _, path, what in notes if path == "default"):
        print("  torch's default path is foreach=False (bit-identical) for every trace")
    print(f"{len(layers)} torch.nn layer cases; torch's float32 results against its float64 ones "
          "(max |a - b| / max |b| per output):")
    for name, what, value in layer_notes:
        print(f"  {name:32s} {what:45s} {value}")
    for f in ("deepspeed_loss_scaler.txt", "lr_schedules.txt", "torch_optim.txt", "torch_layers.txt"):
        print(f"  {f}: {(args.out / f).stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
