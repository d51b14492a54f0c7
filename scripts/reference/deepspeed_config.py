#!/usr/bin/env python3
"""Record how the real DeepSpeed reads a configuration into tests/fixtures/deepspeed_config.txt.

The flagship trainer reads DeepSpeed's JSON configuration itself (examples/01_flagship/
ds_config.hpp); its test (tests/gpt/test_ds_config.cpp) checks it against this file. Nothing here
re-derives DeepSpeed's rules: every outcome is what DeepSpeed 0.19.8 itself did.

  * cases: each config goes through `deepspeed.runtime.config.DeepSpeedConfig(cfg, mpu)` the way
    Megatron-style training hands DeepSpeed its data-parallel size (an `mpu` whose
    get_data_parallel_world_size() is world / (tensor * pipeline); `dist.get_rank` answers 0 so
    that DeepSpeed takes the mpu path without torch.distributed). When that succeeds and the
    config names an Adam/AdamW optimizer, the engine's own `_configure_basic_optimizer` builds
    it (on a stand-in engine object; FusedAdam's real constructor runs, only its CUDA kernel
    loader is stubbed), and a scheduler is built as `DeepSpeedEngine._scheduler_from_config`
    does. The line records DeepSpeed's error, or what it resolved: the batch triple, the fp16 /
    bf16 / ZeRO settings, the optimizer's param group and the scheduler's state.
  * keys: the top-level keys DeepSpeedConfig looks up (recorded by handing it a dict that logs
    every lookup, over all the cases), the fields and aliases of the pydantic models (fp16, bf16,
    zero_optimization and its offload sections), the keyword arguments the Adam backends take
    and the parameters of the warm-up schedulers, the keys DeepSpeed has removed and now
    rejects, and its optimizer and scheduler names.

Run it with the reference virtual environment (see tests/fixtures/README.md):

    build/tools/reference/bin/python scripts/reference/deepspeed_config.py [--out FILE]

It reads the documentation configs in tests/fixtures/deepspeed_config/ and the flagship's sample
configs in examples/01_flagship/configs/, and takes a few seconds.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import logging
import os
import platform
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

# DeepSpeed runs on its CPU accelerator: no GPU is needed or used.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as ds_comm  # noqa: E402
import deepspeed.ops.adam.fused_adam as ds_fused_adam  # noqa: E402
from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam  # noqa: E402
from deepspeed.runtime import config as ds_config  # noqa: E402
from deepspeed.runtime import lr_schedules  # noqa: E402
from deepspeed.runtime.config_utils import DeepSpeedConfigModel  # noqa: E402
from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402
from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config  # noqa: E402
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DOCS_DIR = ROOT / "tests" / "fixtures" / "deepspeed_config"
EXAMPLE_CONFIGS = ROOT / "examples" / "01_flagship" / "configs"
FORMAT = 1

# DeepSpeedConfig asks torch.distributed for the rank first; without a process group it falls
# back to world size 1 and ignores the mpu. Answering 0 is all it takes to use the mpu's size.
ds_comm.get_rank = lambda *args, **kwargs: 0
logging.getLogger("DeepSpeed").setLevel(logging.ERROR)


class DataParallelMpu:
    """What Megatron-LM's mpu tells DeepSpeed: the data-parallel size."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


class LookupLog(dict):
    """A dict that records every key looked up in it (get, [], in, keys() membership)."""

    def __init__(self, *args, log: set, **kwargs):
        super().__init__(*args, **kwargs)
        self.log = log

    def get(self, key, default=None):
        self.log.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.log.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.log.add(key)
        return super().__contains__(key)

    def keys(self):
        outer = self

        class Keys:
            def __contains__(self, key):
                outer.log.add(key)
                return dict.__contains__(outer, key)

            def __iter__(self):
                return iter(dict.keys(outer))

            def __len__(self):
                return dict.__len__(outer)

        return Keys()


# --------------------------------------------------------------------------------------------
# The cases. world = ranks; the data-parallel size DeepSpeed sees is world / (t * p), t and p
# from the config's "trident" section (DeepSpeed itself ignores that section).

TBS, MICRO, GAS = "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"


def batch(tbs=None, micro=None, gas=None, **rest) -> dict:
    cfg = {}
    for key, value in ((TBS, tbs), (MICRO, micro), (GAS, gas)):
        if value is not None:
            cfg[key] = value
    cfg.update(rest)
    return cfg


def adam(kind="Adam", **params) -> dict:
    return {"type": kind, "params": params} if params else {"type": kind}


def cases() -> list[tuple[str, int, dict]]:
    out: list[tuple[str, int, dict]] = []

    def add(name, world, cfg):
        out.append((name, world, cfg))

    # Batch sizes: one, two or three of them given.
    for w in (1, 2, 3, 4, 8):
        add(f"tbs_only_8_w{w}", w, batch(8))
    add("tbs_only_6_w4", 4, batch(6))
    add("tbs_only_2_w4", 4, batch(2))
    add("tbs_only_0_w1", 1, batch(0))
    add("micro_only_4_w1", 1, batch(micro=4))
    add("micro_only_4_w3", 3, batch(micro=4))
    add("micro_only_0_w2", 2, batch(micro=0))
    add("gas_only_4_w2", 2, batch(gas=4))
    add("none_w1", 1, {})
    add("tbs_micro_32_4_w4", 4, batch(32, 4))
    add("tbs_micro_32_4_w3", 3, batch(32, 4))
    add("tbs_micro_30_4_w2", 2, batch(30, 4))
    add("tbs_micro_24_4_w3", 3, batch(24, 4))
    add("tbs_micro_8_16_w1", 1, batch(8, 16))
    add("tbs_gas_32_2_w4", 4, batch(32, gas=2))
    add("tbs_gas_32_3_w4", 4, batch(32, gas=3))
    add("tbs_gas_16_4_w8", 8, batch(16, gas=4))
    add("tbs_gas_48_3_w4", 4, batch(48, gas=3))
    add("micro_gas_4_2_w3", 3, batch(micro=4, gas=2))
    add("micro_gas_1_1_w8", 8, batch(micro=1, gas=1))
    add("all_32_4_2_w4", 4, batch(32, 4, 2))
    add("all_32_4_2_w2", 2, batch(32, 4, 2))
    add("all_32_4_0_w4", 4, batch(32, 4, 0))
    add("all_0_0_0_w1", 1, batch(0, 0, 0))
    add("negative_tbs_micro_w1", 1, batch(-8, -2))
    add("negative_micro_gas_w2", 2, batch(micro=-1, gas=-2))
    add("negative_gas_w1", 1, batch(8, 4, -2))
    add("float_tbs_8.0_micro_2_w2", 2, batch(8.0, 2))
    add("float_tbs_5e1_w2", 2, batch(5e1))
    add("float_tbs_8.5_w1", 1, batch(8.5))
    add("float_micro_2.5_gas_2_w1", 1, batch(micro=2.5, gas=2))
    add("string_tbs_w1", 1, batch("8"))
    add("auto_all_w1", 1, batch("auto", "auto", "auto"))
    add("null_tbs_micro_4_w2", 2, batch(None, 4, **{TBS: None}))
    add("bool_micro_w4", 4, batch(micro=True))
    add("huge_tbs_w1", 1, batch(2**31))
    # The data-parallel size comes from the trident section (tensor and pipeline parallelism).
    add("tp2_tbs_micro_16_2_w8", 8, batch(16, 2, trident={"tensor_parallel": 2}))
    add("tp2_pp2_micro_gas_4_2_w8", 8, batch(micro=4, gas=2, trident={"tensor_parallel": 2, "pipeline_parallel": 2}))
    add("pp4_tbs_8_w8", 8, batch(8, trident={"pipeline_parallel": 4}))
    add("pp2_tbs_micro_12_4_w4", 4, batch(12, 4, trident={"pipeline_parallel": 2}))

    # Precision.
    add("fp16_defaults", 1, batch(8, fp16={"enabled": True}))
    add("fp16_static_scale", 1, batch(8, fp16={"enabled": True, "loss_scale": 128, "hysteresis": 4}))
    add("fp16_all_fields", 1, batch(8, fp16={"enabled": True, "loss_scale": 0, "initial_scale_power": 12,
                                             "loss_scale_window": 500, "hysteresis": 1,
                                             "consecutive_hysteresis": True, "min_loss_scale": 2}))
    add("fp16_disabled_fields", 1, batch(8, fp16={"enabled": False, "loss_scale_window": 0}))
    add("fp16_and_bf16", 1, batch(8, fp16={"enabled": True}, bf16={"enabled": True}))
    add("fp16_off_bf16_on", 1, batch(8, fp16={"enabled": False}, bf16={"enabled": True}))
    add("bf16", 2, batch(8, bf16={"enabled": True}))
    add("bfloat16_old_name", 2, batch(8, bfloat16={"enabled": True}))
    add("fp16_auto", 1, batch(8, fp16={"enabled": "auto"}))
    add("fp16_negative_loss_scale", 1, batch(8, fp16={"enabled": True, "loss_scale": -1}))
    add("fp16_window_0", 1, batch(8, fp16={"enabled": True, "loss_scale_window": 0}))
    add("fp16_min_scale_fraction", 1, batch(8, fp16={"enabled": True, "min_loss_scale": 0.5}))
    add("fp16_misspelt_key", 1, batch(8, fp16={"enabled": True, "initial_scale_pow": 8}))
    add("bf16_misspelt_key", 1, batch(8, bf16={"enable": True}))
    add("fp16_string_window", 1, batch(8, fp16={"enabled": True, "loss_scale_window": "1000"}))

    # ZeRO.
    add("zero_stage_3_defaults", 2, batch(8, zero_optimization={"stage": 3}))
    add("zero_stage_2_defaults", 2, batch(8, zero_optimization={"stage": 2}))
    add("zero_stage_5", 1, batch(8, zero_optimization={"stage": 5}))
    add("zero_stage_negative", 1, batch(8, zero_optimization={"stage": -1}))
    add("zero_stage_string", 1, batch(8, zero_optimization={"stage": "2"}))
    add("zero_bucket_5e8", 2, batch(8, zero_optimization={"stage": 1, "reduce_bucket_size": 5e8,
                                                          "allgather_bucket_size": 2e8}))
    add("zero_bucket_0", 1, batch(8, zero_optimization={"stage": 2, "reduce_bucket_size": 0}))
    add("zero_bucket_negative", 1, batch(8, zero_optimization={"stage": 2, "allgather_bucket_size": -1}))
    add("zero_bucket_fraction", 1, batch(8, zero_optimization={"stage": 2, "reduce_bucket_size": 5.5}))
    add("zero_bucket_string", 1, batch(8, zero_optimization={"stage": 2, "reduce_bucket_size": "5e8"}))
    add("zero_misspelt_key", 1, batch(8, zero_optimization={"stage": 2, "reduce_bucket_sise": 5e8}))
    add("zero_removed_key", 1, batch(8, zero_optimization={"stage": 3, "mics_shard_size": 8}))
    add("zero_true", 1, batch(8, zero_optimization=True))
    add("zero_false", 1, batch(8, zero_optimization=False))
    add("zero3_names_not_aliases", 2, batch(8, zero_optimization={
        "stage": 3, "prefetch_bucket_size": 1e6, "param_persistence_threshold": 1000,
        "max_live_parameters": 1e8, "max_reuse_distance": 1e7}))
    add("zero3_aliases", 2, batch(8, zero_optimization={
        "stage": 3, "stage3_prefetch_bucket_size": 1e6, "stage3_param_persistence_threshold": 1000,
        "stage3_max_live_parameters": 1e8, "stage3_max_reuse_distance": 1e7, "overlap_comm": False,
        "contiguous_gradients": False, "reduce_scatter": False}))
    add("zero3_name_and_alias", 1, batch(8, zero_optimization={"stage": 3, "prefetch_bucket_size": 1e6,
                                                               "stage3_prefetch_bucket_size": 2e6}))
    add("zero_offload_misspelt", 1, batch(8, zero_optimization={"stage": 3, "offload_param": {"devic": "cpu"}}))

    # Top level.
    add("misspelt_top_level", 1, batch(micro=2, trian_batch_size=2))
    add("removed_top_level", 1, batch(8, amp={"enabled": True}))
    add("gradient_clipping", 1, batch(8, gradient_clipping=1.0))
    add("gradient_clipping_negative", 1, batch(8, gradient_clipping=-1.0))
    add("ignored_keys", 2, batch(8, steps_per_print=10, wall_clock_breakdown=False, prescale_gradients=False))

    # Optimizer (built by the engine's code) and scheduler (built as the engine does).
    add("adam_defaults", 1, batch(8, optimizer=adam()))
    add("adam_lowercase", 1, batch(8, optimizer=adam("adam", lr=2e-4)))
    add("adamw_uppercase", 1, batch(8, optimizer=adam("ADAMW", lr=3e-4, betas=[0.9, 0.95], eps=1e-6,
                                                        weight_decay=0.1)))
    add("adam_l2", 1, batch(8, optimizer=adam("Adam", weight_decay=0.01, adam_w_mode=False)))
    add("adamw_adam_w_mode_false", 1, batch(8, optimizer=adam("AdamW", weight_decay=0.01, adam_w_mode=False)))
    add("adam_torch_adam", 1, batch(8, optimizer=adam("Adam", lr=1e-4, torch_adam=True)))
    add("adam_torch_adam_l2", 1, batch(8, optimizer=adam("Adam", torch_adam=True, adam_w_mode=False)))
    add("adam_amsgrad", 1, batch(8, optimizer=adam("Adam", amsgrad=True)))
    add("adam_max_grad_norm", 1, batch(8, optimizer=adam("Adam", max_grad_norm=1.0)))
    add("adam_unknown_param", 1, batch(8, optimizer=adam("Adam", lr=1e-3, beta1=0.9)))
    add("adam_bias_correction_off", 1, batch(8, optimizer=adam("Adam", bias_correction=False)))
    add("warmup_lr", 1, batch(8, optimizer=adam(lr=1e-3), scheduler={
        "type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000}}))
    add("warmup_lr_defaults", 1, batch(8, optimizer=adam(lr=3e-4), scheduler={"type": "WarmupLR", "params": {}}))
    add("warmup_lr_no_params", 1, batch(8, optimizer=adam(lr=3e-4), scheduler={"type": "WarmupLR"}))
    add("warmup_lr_linear_1_step", 1, batch(8, optimizer=adam(lr=3e-4), scheduler={
        "type": "WarmupLR", "params": {"warmup_num_steps": 1, "warmup_type": "linear", "warmup_min_lr": 1e-5}}))
    add("warmup_decay_lr", 1, batch(8, optimizer=adam(lr=3e-4), scheduler={
        "type": "WarmupDecayLR", "params": {"total_num_steps": 10000, "warmup_num_steps": 100}}))
    add("warmup_decay_lr_no_total", 1, batch(8, optimizer=adam(lr=3e-4), scheduler={
        "type": "WarmupDecayLR", "params": {"warmup_num_steps": 100}}))
    add("warmup_cosine_lr", 1, batch(8, optimizer=adam(lr=6e-4), scheduler={
        "type": "WarmupCosineLR", "params": {"total_num_steps": 1000, "warmup_num_steps": 10,
                                             "cos_min_ratio": 0.1, "warmup_min_ratio": 0.01,
                                             "warmup_type": "linear"}}))
    add("warmup_cosine_lr_defaults", 1, batch(8, optimizer=adam(lr=6e-4), scheduler={
        "type": "WarmupCosineLR", "params": {"total_num_steps": 5000}}))
    add("warmup_steps_0", 1, batch(8, scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 0}}))
    add("warmup_steps_float", 1, batch(8, scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 100.0}}))
    add("warmup_type_unknown", 1, batch(8, scheduler={"type": "WarmupLR", "params": {"warmup_type": "cosine"}}))
    add("scheduler_misspelt_type", 1, batch(8, scheduler={"type": "WarmUpLR", "params": {}}))
    add("scheduler_unknown_param", 1, batch(8, scheduler={"type": "WarmupLR", "params": {"warmup_steps": 10}}))
    add("scheduler_last_batch_iteration", 1, batch(8, scheduler={"type": "WarmupLR",
                                                                 "params": {"last_batch_iteration": 5}}))
    return out


def file_cases() -> list[tuple[str, int, dict, str]]:
    """The configs copied verbatim from DeepSpeed's documentation (tests/fixtures/README.md names
    them) and the flagship's sample config; `file` is their path from the repository root."""
    out = []
    for path in sorted(DOCS_DIR.glob("*.json")):
        cfg = json.loads(path.read_text())
        for w in (1, 2, 4):
            out.append((f"docs_{path.stem}_w{w}", w, cfg, str(path.relative_to(ROOT))))
    # The ZeRO-Infinity snippet of the ZeRO tutorial is a fragment with no batch size; merged
    # into a config that has one, as the tutorial means it to be (the record's JSON is the merge).
    fragment = json.loads((DOCS_DIR / "zero3_infinity.json").read_text())
    out.append(("docs_zero3_infinity_plus_micro_2_w4", 4, {**fragment, MICRO: 2}, None))
    for path in sorted(EXAMPLE_CONFIGS.glob("*.json")):
        cfg = json.loads(path.read_text())
        # World sizes that its tensor x pipeline layout divides (trident checks that; DeepSpeed
        # sees only the data-parallel size the mpu gives it).
        tp = cfg.get("trident", {}).get("tensor_parallel", 1) * cfg.get("trident", {}).get("pipeline_parallel", 1)
        for w in (tp, 2 * tp, 4 * tp):
            out.append((f"example_{path.stem}_w{w}", w, cfg, str(path.relative_to(ROOT))))
    return out


# --------------------------------------------------------------------------------------------
# Running DeepSpeed.


class NoKernels:
    """Stands in for FusedAdamBuilder: FusedAdam's constructor runs, its CUDA kernels are not loaded."""

    def load(self):
        return SimpleNamespace(multi_tensor_adam=None)


ds_fused_adam.FusedAdamBuilder = NoKernels


class StandInEngine:
    """The parts of DeepSpeedEngine that _configure_basic_optimizer reads, over a real config."""

    def __init__(self, config):
        self._config = config

    def optimizer_name(self):
        return self._config.optimizer_name

    def optimizer_params(self):
        return self._config.optimizer_params

    def zero_use_cpu_optimizer(self):
        return False  # no offload: the GPU path (FusedAdam), or torch's with torch_adam

    get_optimizer_configuration = DeepSpeedEngine.get_optimizer_configuration
    _configure_basic_optimizer = DeepSpeedEngine._configure_basic_optimizer


def one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return " | ".join(part.strip() for part in text.splitlines() if part.strip())


def dp_of(world: int, cfg: dict) -> int:
    tri = cfg.get("trident", {}) if isinstance(cfg, dict) else {}
    t, p = tri.get("tensor_parallel", 1), tri.get("pipeline_parallel", 1)
    assert world % (t * p) == 0, (world, t, p)
    return world // (t * p)


def integral(x):
    """A resolved number as DeepSpeed holds it, written as an integer when it is one."""
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return x


def num(x) -> str:
    x = integral(x)
    if isinstance(x, int):
        return str(x)
    s = repr(float(x))
    assert float(s) == x and " " not in s
    return s


def run_case(world: int, cfg: dict, lookups: set) -> dict:
    dp = dp_of(world, cfg)
    record = {"world": world, "dp": dp}
    try:
        c = ds_config.DeepSpeedConfig(LookupLog(copy.deepcopy(cfg), log=lookups), mpu=DataParallelMpu(dp))
    except Exception as e:  # noqa: BLE001 -- any failure is DeepSpeed rejecting the config
        return {**record, "outcome": "error", "where": "config", "message": one_line(e)}
    z, f, b = c.zero_config, c.float16_config, c.bfloat16_config
    resolved = {
        "tbs": c.train_batch_size, "micro": c.train_micro_batch_size_per_gpu, "gas": c.gradient_accumulation_steps,
        "fp16": f.enabled, "bf16": b.enabled, "loss_scale": f.loss_scale,
        "initial_scale_power": f.initial_scale_power, "loss_scale_window": f.loss_scale_window,
        "hysteresis": f.hysteresis, "consecutive_hysteresis": f.consecutive_hysteresis,
        "min_loss_scale": f.min_loss_scale, "gradient_clipping": c.gradient_clipping,
        "zero_stage": int(z.stage), "reduce_bucket_size": z.reduce_bucket_size,
        "allgather_bucket_size": z.allgather_bucket_size, "overlap_comm": z.overlap_comm,
        "contiguous_gradients": z.contiguous_gradients, "reduce_scatter": z.reduce_scatter,
        "prefetch_bucket_size": z.prefetch_bucket_size, "param_persistence_threshold": z.param_persistence_threshold,
        "max_live_parameters": z.max_live_parameters, "max_reuse_distance": z.max_reuse_distance,
    }
    optimizer = None
    if c.optimizer_name is not None:
        assert c.optimizer_name in ("adam", "adamw"), "the cases name only Adam and AdamW"
        weights = [torch.nn.Parameter(torch.zeros(4))]
        try:
            optimizer = StandInEngine(c)._configure_basic_optimizer(weights)
        except Exception as e:  # noqa: BLE001
            return {**record, "outcome": "error", "where": "optimizer", "message": one_line(e)}
        group = optimizer.param_groups[0]
        if isinstance(optimizer, FusedAdam):
            kind, w_mode = "fused_adam", bool(optimizer.adam_w_mode)
        else:
            assert type(optimizer) in (torch.optim.Adam, torch.optim.AdamW), type(optimizer)
            kind = type(optimizer).__name__.lower()
            w_mode = isinstance(optimizer, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay", False))
        resolved.update({"opt": kind, "adam_w_mode": w_mode, "lr": group["lr"], "beta1": group["betas"][0],
                         "beta2": group["betas"][1], "eps": group["eps"], "weight_decay": group["weight_decay"]})
    if c.scheduler_name is not None:
        # The engine builds the scheduler on the optimizer it made (or the client's): the lr it
        # starts from is that optimizer's; trident's default optimizer has lr 1e-3, like FusedAdam.
        if optimizer is None:
            optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=1e-3)
        base_lr = optimizer.param_groups[0]["lr"]
        try:
            # DeepSpeedEngine._scheduler_from_config, minus the engine.
            name = c.scheduler_name
            if hasattr(lr_schedules, name):
                scheduler_class = getattr(lr_schedules, name)
            else:
                assert hasattr(torch.optim.lr_scheduler, name), f"DeepSpeed does not recognize LR scheduler {name}"
                scheduler_class = getattr(torch.optim.lr_scheduler, name)
            s = scheduler_class(optimizer, **c.scheduler_params)
        except Exception as e:  # noqa: BLE001
            return {**record, "outcome": "error", "where": "scheduler", "message": one_line(e)}
        assert type(s).__name__ in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR"), type(s)
        resolved.update({"sched": type(s).__name__, "warmup_num_steps": s.warmup_num_steps,
                         "warmup_type": s.warmup_type, "last_batch_iteration": s.last_batch_iteration})
        if isinstance(s, lr_schedules.WarmupLR):
            resolved.update({"warmup_min_lr": s.min_lrs[0], "warmup_max_lr": s.max_lrs[0]})
        if isinstance(s, (lr_schedules.WarmupDecayLR, lr_schedules.WarmupCosineLR)):
            resolved["total_num_steps"] = s.total_num_steps
        if isinstance(s, lr_schedules.WarmupCosineLR):
            resolved.update({"warmup_min_ratio": s.warmup_min_ratio, "cos_min_ratio": s.cos_min_ratio,
                             "base_lr": base_lr})
    return {**record, "outcome": "ok", **resolved}


def case_lines(name: str, rec: dict, cfg: dict, source: str | None) -> list[str]:
    """A case record: the header, the config as one line of JSON and, when rejected, DeepSpeed's message."""
    text = json.dumps(cfg, separators=(",", ":"))
    assert "\n" not in text and not any(ch.isspace() for ch in name), (name, text)
    parts = ["case", "name", name, "world", str(rec["world"]), "dp", str(rec["dp"]), "outcome", rec["outcome"]]
    if source:
        parts += ["file", source]
    if rec["outcome"] == "ok":
        for key, value in rec.items():
            if key not in ("world", "dp", "outcome"):
                parts += [key, value if isinstance(value, str) else num(value)]
        assert all(" " not in p for p in parts)
        return [" ".join(parts + ["lines", "1"]), text]
    parts += ["where", rec["where"]]
    return [" ".join(parts + ["lines", "2"]), text, rec["message"]]


# --------------------------------------------------------------------------------------------
# The keys DeepSpeed knows.


def model_keys(model: type[DeepSpeedConfigModel]) -> list[str]:
    """A pydantic config model's field names and aliases (populate_by_name: both are accepted)."""
    keys = []
    for name, info in model.model_fields.items():
        keys.append(name)
        if info.alias and info.alias != name:
            keys.append(info.alias)
    return keys


def nested_models(model: type[DeepSpeedConfigModel]) -> dict[str, type[DeepSpeedConfigModel]]:
    """The fields of a config model that are config models themselves (Optional or not)."""
    out = {}
    for name, info in model.model_fields.items():
        for candidate in (info.annotation, *typing.get_args(info.annotation)):
            if isinstance(candidate, type) and issubclass(candidate, DeepSpeedConfigModel):
                out[name] = candidate
    return out


def signature_keys(*callables, drop=("self", "params", "model_params", "optimizer")) -> list[str]:
    keys = []
    for fn in callables:
        for name, p in inspect.signature(fn).parameters.items():
            if name not in drop and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and name not in keys:
                keys.append(name)
    return keys


def key_lines(top_lookups: set) -> list[str]:
    removed_top = sorted(ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    removed_zero = sorted(ds_config._REMOVED_ZERO_CONFIG_KEYS)
    top = sorted(k for k in top_lookups if isinstance(k, str) and k not in removed_top)
    sections = {
        "top": ("DeepSpeedConfig-lookups", top),
        "fp16": ("DeepSpeedFP16Config", model_keys(DeepSpeedFP16Config)),
        "bf16": ("DeepSpeedBF16Config", model_keys(DeepSpeedBF16Config)),
        "zero_optimization": ("DeepSpeedZeroConfig", model_keys(DeepSpeedZeroConfig)),
        "optimizer": ("get_optimizer_name+params+legacy_fusion",
                      [ds_config.TYPE, ds_config.OPTIMIZER_PARAMS, ds_config.LEGACY_FUSION]),
        # Adam and AdamW: the engine pops torch_adam, adam_w_mode, fp32_optimizer_states (and,
        # with torch_adam, foreach) and hands the rest to FusedAdam, DeepSpeedCPUAdam (offload)
        # or torch.optim.Adam/AdamW (torch_adam).
        "optimizer.params.adam": ("engine-pops+FusedAdam+DeepSpeedCPUAdam+torch.optim.Adam+AdamW",
                                  [ds_config.TORCH_ADAM_PARAM, ds_config.ADAM_W_MODE, "fp32_optimizer_states", "foreach"]
                                  + signature_keys(FusedAdam.__init__, DeepSpeedCPUAdam.__init__,
                                                   torch.optim.Adam.__init__, torch.optim.AdamW.__init__)),
        "scheduler": ("get_scheduler_name+params", [ds_config.TYPE, ds_config.SCHEDULER_PARAMS]),
    }
    for name, model in nested_models(DeepSpeedZeroConfig).items():
        sections[f"zero_optimization.{name}"] = (model.__name__, model_keys(model))
    for name in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR"):
        sections[f"scheduler.params.{name}"] = (f"lr_schedules.{name}", signature_keys(getattr(lr_schedules, name).__init__))
    lines = []

    def record(header: str, names: list[str]):
        assert all(n and not any(ch.isspace() for ch in n) for n in names)
        lines.append(f"{header} lines {len(names)}")
        lines.extend(names)

    for section, (source, keys) in sections.items():
        record(f"keys section {section} source {source}", list(dict.fromkeys(keys)))
    record("removed section top", removed_top)
    record("removed section zero_optimization", removed_zero)
    record("names kind optimizers", list(ds_config.DEEPSPEED_OPTIMIZERS))
    record("names kind schedulers", list(lr_schedules.VALID_LR_SCHEDULES))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "deepspeed_config.txt")
    args = ap.parse_args()

    lookups: set = set()
    body = []
    names = set()
    for name, world, cfg in cases():
        assert name not in names, name
        names.add(name)
        body.append(case_lines(name, run_case(world, cfg, lookups), cfg, None))
    for name, world, cfg, source in file_cases():
        assert name not in names, name
        names.add(name)
        body.append(case_lines(name, run_case(world, cfg, lookups), cfg, source))
    # Without an mpu DeepSpeed also looks for Ulysses' sequence_parallel_size (it divides the
    # world size by it): one more lookup-only run.
    ds_config.DeepSpeedConfig(LookupLog({TBS: 1}, log=lookups))
    assert "sequence_parallel_size" in lookups
    # A second run gives the same lines: nothing depends on state left by an earlier case.
    again = [case_lines(n, run_case(w, c, set()), c, None) for n, w, c in cases()]
    assert again == body[: len(again)], "a case depends on an earlier one"
    # Every lookup the cases caused is a key DeepSpeed reads (the removed ones it reads to reject).
    head = (f"meta fixture deepspeed_config format {FORMAT} deepspeed {deepspeed.__version__} "
            f"torch {torch.__version__} python {platform.python_version()} "
            f"generator scripts/reference/deepspeed_config.py lines 0")
    lines = [head, *key_lines(lookups), *(line for case in body for line in case)]
    args.out.write_text("\n".join(lines) + "\n")
    ok = sum(1 for case in body if " outcome ok " in case[0])
    print(f"wrote {args.out}: {len(body)} cases ({ok} accepted, {len(body) - ok} rejected)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
