// examples/01_flagship/ds_config.hpp — the flagship GPT trainer's configuration: a DeepSpeed JSON
// config, read the way DeepSpeed 0.19.8 reads it, plus a "trident" section for what DeepSpeed
// leaves to Megatron-LM (tensor and pipeline parallelism, the model, the data, the run).
//
// Synopsis
//   enum class precision_kind { fp32, fp16, bf16 }
//   struct fp16_config, zero_config, optimizer_config, scheduler_config    DeepSpeed's sections
//   struct model_config, trident_config                                     the "trident" section
//   struct train_config                                                     all of it, resolved
//   train_config parse_config(const nlohmann::json&, int world_size)
//   train_config load_config(const std::string& path, int world_size)
//   void check_layout(const train_config&, int world_size)   the grid and the model fit together
//   const std::vector<key_section>& known_keys()              the keys read, and those ignored
//
// What "the way DeepSpeed reads it" means (tests/gpt/test_ds_config.cpp checks every case that
// DeepSpeed itself resolved in tests/fixtures/deepspeed_config.txt):
//   * Batch sizes: DeepSpeedConfig._set_batch_related_parameters and _batch_assertion, with the
//     data-parallel size dp = world_size / (tensor_parallel * pipeline_parallel) (what
//     Megatron's mpu reports to DeepSpeed). Given two of train_batch_size,
//     train_micro_batch_size_per_gpu and gradient_accumulation_steps the third is derived and
//     must divide exactly; given train_batch_size or the micro batch alone, gas is 1; given all
//     three, train_batch_size == micro * gas * dp. Every value must be positive.
//   * Defaults are DeepSpeed's, which are not always the ones its documentation or PyTorch
//     suggests: gradient_clipping 1.0; ZeRO's overlap_comm is on for stage 3 and off otherwise;
//     optimizer "Adam" is AdamW (decoupled decay) unless params.adam_w_mode is false, with
//     FusedAdam's weight_decay 0 (0.01 with params.torch_adam and decoupled decay: torch's
//     AdamW); WarmupLR's warmup_max_lr is the optimizer's lr, WarmupDecayLR's is 0.001.
//   * Keys: DeepSpeed knows far more keys than trident uses. A DeepSpeed key trident does not
//     use is listed in train_config::ignored (the trainer prints the list); a key DeepSpeed does
//     not know is an error naming the full dotted path and the nearest known key. DeepSpeed
//     itself ignores unknown top-level keys; trident refuses them, because a misspelt
//     "train_batch_size" would otherwise silently change the run.
//   * Stricter than DeepSpeed, on purpose: a string, a boolean or a fraction where DeepSpeed's
//     Python arithmetic or pydantic would have coerced it ("auto", "1000", true, 2.5) is an
//     error naming the key and what was expected; so are values trident cannot honour
//     (amsgrad, bias_correction false, a warmup_type DeepSpeed would replace by "log").
//     Integral numbers written as floats (5e8) are accepted wherever DeepSpeed accepts them.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trident/core/error.hpp"

namespace flagship {

enum class precision_kind { fp32, fp16, bf16 };

//! DeepSpeed's "fp16" section (DeepSpeedFP16Config): dynamic loss scaling unless loss_scale > 0.
struct fp16_config {
  double loss_scale = 0;  // 0: dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;  // an integer in DeepSpeed; a double here because the scaler takes one
};

//! DeepSpeed's "zero_optimization" section (DeepSpeedZeroConfig). Sizes count elements, as in
//! DeepSpeed, not bytes. The stage-3 fields keep their config names (DeepSpeed also accepts
//! them without the "stage3_" prefix).
struct zero_config {
  int stage = 0;
  std::size_t reduce_bucket_size = 500'000'000;
  std::size_t allgather_bucket_size = 500'000'000;
  bool overlap_comm = false;  // resolved: DeepSpeed's default is stage == 3
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  std::size_t stage3_prefetch_bucket_size = 50'000'000;
  std::size_t stage3_param_persistence_threshold = 100'000;
  std::size_t stage3_max_live_parameters = 1'000'000'000;
  std::size_t stage3_max_reuse_distance = 1'000'000'000;
};

//! DeepSpeed's "optimizer" section, Adam and AdamW only, resolved the way
//! DeepSpeedEngine._configure_basic_optimizer builds it. Without the section DeepSpeed uses the
//! client's optimizer; trident's is then torch.optim.AdamW's defaults (weight_decay 0.01).
struct optimizer_config {
  std::string type = "adamw";          // "adam" or "adamw": DeepSpeed's lower-cased name
  bool decoupled_weight_decay = true;  // DeepSpeed's effective adam_w_mode: AdamW, or Adam unless adam_w_mode is false
  double lr = 1e-3;  // a double, as in Python: the schedules multiply it before the optimizer rounds it
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

//! DeepSpeed's "scheduler" section (deepspeed/runtime/lr_schedules.py), resolved: defaults filled
//! in, warmup_max_lr included. trident::optim::warmup_lr and friends take these values.
struct scheduler_config {
  std::string type;  // "" (none), "WarmupLR", "WarmupDecayLR" or "WarmupCosineLR"
  double warmup_min_lr = 0, warmup_max_lr = 0.001;  // WarmupLR, WarmupDecayLR
  std::int64_t warmup_num_steps = 1000;             // as written; DeepSpeed (and trident) use max(2, n)
  std::string warmup_type = "log";                  // "log" or "linear"
  std::int64_t total_num_steps = 0;                 // WarmupDecayLR, WarmupCosineLR (required there)
  double cos_min_ratio = 0.0001;                    // WarmupCosineLR
  double warmup_min_ratio = 0;                      // WarmupCosineLR
};

//! The GPT's shape ("trident.model"). ffn 0 means 4 * hidden.
struct model_config {
  std::size_t vocab_size = 256, seq_len = 64, hidden = 64, heads = 4, layers = 4, ffn = 0;
};

//! The "trident" section: everything DeepSpeed leaves to the training script. All keys are
//! trident's own, so an unknown one is always an error.
struct trident_config {
  int tensor_parallel = 1, pipeline_parallel = 1, virtual_stages = 1;
  std::string schedule = "1f1b";  // gpipe, 1f1b, interleaved, zb-h1, zb-h2
  bool sequence_parallel = false;
  std::string recompute = "none";  // none, selective, full (activation recomputation)
  std::string attention = "auto";  // auto, standard, flash, flash_bf16 (resolve_attention)
  model_config model;
  std::string train_data, val_data;
  std::int64_t steps = 100;
  std::int64_t eval_every = 0;  // 0: no validation
  int eval_batches = 4;
  std::uint64_t seed = 1234;
  std::string loss_csv, loss_svg, trace;
};

//! A whole configuration, resolved for one world size.
struct train_config {
  int train_batch_size = 0, micro_batch = 0, gradient_accumulation_steps = 0;  // resolved, as DeepSpeed does
  int data_parallel = 1;                                                        // world_size / (t * p)
  precision_kind precision = precision_kind::fp32;
  fp16_config fp16;
  zero_config zero;
  float gradient_clipping = 1.0f;  // DeepSpeed's default (0: off)
  optimizer_config optimizer;
  scheduler_config scheduler;
  trident_config trident;
  //! DeepSpeed keys present in the file that trident does not use, as dotted paths
  //! ("wall_clock_breakdown", "zero_optimization.offload_optimizer"), sorted.
  std::vector<std::string> ignored;
};

//! The keys of one section that trident reads (`used`, perhaps only to reject some values) and
//! the DeepSpeed keys it ignores, plus those DeepSpeed has removed and rejects. `path` is the
//! section's dotted path ("" for the top level; scheduler parameters per type,
//! "scheduler.params.WarmupLR"). Sections under an ignored key are not read at all, except the
//! ZeRO offload sections, whose key names are checked.
struct key_section {
  std::string_view path;
  std::vector<std::string_view> used, ignored, removed;
  bool deepspeed = true;  // false: trident's own section
};

//! Every section's keys, for the parser, the error messages and the test that compares them
//! with the keys DeepSpeed knows.
inline const std::vector<key_section>& known_keys() {
  static const std::vector<key_section> sections = {
      {"",
       {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "fp16", "bf16",
        "bfloat16", "zero_optimization", "allgather_size", "gradient_clipping", "optimizer", "scheduler",
        "gradient_allreduce_op", "sequence_parallel_size", "trident"},
       {"activation_checkpointing", "aio", "autotuning", "checkpoint", "comet", "comms_logger",
        "communication_data_type", "compile", "csv_monitor", "data_efficiency", "data_types", "dataloader_drop_last",
        "datastates_ckpt", "disable_allgather", "disable_python_gc", "dump_state", "expert_parallel", "flops_profiler",
        "gradient_predivide_factor", "hybrid_engine", "log_level", "managed_gradient_accumulation", "memory_breakdown",
        "pipeline", "prescale_gradients", "seq_parallel_communication_data_type", "steps_per_print",
        "tensor_parallel", "tensorboard", "timers", "torch_autocast", "use_data_before_expert_parallelism",
        "vocabulary_size", "wall_clock_breakdown", "wandb", "weight_quantization", "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer"},
       {"amp", "compression_training", "curriculum_learning", "eigenvalue", "elasticity", "graph_harvesting", "nebula",
        "progressive_layer_drop", "quantize_training", "sparse_attention", "sparse_gradients"}},
      {"fp16",
       {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
        "min_loss_scale"},
       {"auto_cast", "fp16_master_weights_and_grads"},
       {}},
      {"bf16",
       {"enabled"},
       {"immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads", "bf16_optimizer_states"},
       {}},
      {"zero_optimization",
       {"stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients",
        "reduce_scatter", "stage3_prefetch_bucket_size", "prefetch_bucket_size", "stage3_param_persistence_threshold",
        "param_persistence_threshold", "stage3_max_live_parameters", "max_live_parameters",
        "stage3_max_reuse_distance", "max_reuse_distance"},
       {"use_multi_rank_bucket_allreduce", "allgather_partitions", "compute_grad_norm", "load_from_fp32_weights",
        "elastic_checkpoint", "offload_param", "offload_optimizer", "zenflow", "sub_group_size", "cpu_offload_param",
        "cpu_offload_use_pin_memory", "cpu_offload", "model_persistence_threshold",
        "stage3_model_persistence_threshold",
        "gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
        "module_granularity_threshold", "stage3_module_granularity_threshold", "use_all_reduce_for_fetch_params",
        "stage3_use_all_reduce_for_fetch_params", "allgather_sequential", "stage3_allgather_sequential",
        "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "legacy_stage1",
        "round_robin_gradients", "parameter_alignment", "zero_hpz_partition_size", "zero_quantized_weights",
        "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "memory_efficient_linear",
        "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
        "save_muon_momentum_buffer_in_memory", "leaf_module"},
       {"mics_hierarchical_params_gather", "mics_shard_size", "zeropp_loco_param"}},
      {"zero_optimization.offload_param",
       {},
       {"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"},
       {}},
      {"zero_optimization.offload_optimizer",
       {},
       {"device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read", "pipeline_write", "fast_init", "ratio",
        "super_offload", "cpuadam_cores_perc"},
       {}},
      {"optimizer", {"type", "params"}, {"legacy_fusion"}, {}},
      // Adam and AdamW: what the engine pops, then FusedAdam's, DeepSpeedCPUAdam's and
      // torch.optim.Adam/AdamW's keyword arguments. Those that change the update are read, to
      // refuse values trident does not implement.
      {"optimizer.params",
       {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam", "amsgrad", "bias_correction", "maximize",
        "decoupled_weight_decay"},
       {"fp32_optimizer_states", "foreach", "set_grad_none", "adamw_mode", "capturable", "differentiable", "fused"},
       {}},
      {"scheduler", {"type", "params"}, {}, {}},
      {"scheduler.params.WarmupLR",
       {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"},
       {},
       {}},
      {"scheduler.params.WarmupDecayLR",
       {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"},
       {},
       {}},
      {"scheduler.params.WarmupCosineLR",
       {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
        "last_batch_iteration"},
       {},
       {}},
      {"trident",
       {"tensor_parallel", "pipeline_parallel", "virtual_stages", "schedule", "sequence_parallel", "recompute", "attention", "model",
        "train_data", "val_data", "steps", "eval_every", "eval_batches", "seed", "loss_csv", "loss_svg", "trace"},
       {},
       {},
       false},
      {"trident.model", {"vocab_size", "seq_len", "hidden", "heads", "layers", "ffn"}, {}, {}, false},
  };
  return sections;
}

//! trident's pipeline schedules, as the "trident.schedule" key names them.
inline constexpr std::string_view pipeline_schedules[] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"};

namespace detail {

using json = nlohmann::json;

template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  std::ostringstream out;
  out << "config: ";
  (out << ... << std::forward<Parts>(parts));
  throw trident::usage_error(out.str());
}

inline std::string join(std::string_view path, std::string_view key) {
  std::string out{path};
  if (!out.empty()) out += '.';
  out += key;
  return out;
}

inline const key_section& section(std::string_view path) {
  for (const auto& s : known_keys())
    if (s.path == path) return s;
  fail("internal: no key section '", path, "'");
}

//! Optimal string alignment distance (Levenshtein plus adjacent transpositions), case-blind:
//! "trian_batch_size" is one edit from "train_batch_size", "Stage" none from "stage".
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  auto lower = [](char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; };
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1]))
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

//! The closest candidate within two edits (one for keys of up to four letters, where two edits
//! would turn "lr" into anything), or "" when none is that close.
template <class Range>
std::string_view nearest(std::string_view key, const Range& candidates) {
  const std::size_t limit = key.size() <= 4 ? 1 : 2;
  std::string_view best;
  std::size_t best_distance = limit + 1;
  for (std::string_view c : candidates) {
    const std::size_t dist = edit_distance(key, c);
    if (dist < best_distance) best = c, best_distance = dist;
  }
  return best;
}

inline std::string did_you_mean(std::string_view path, std::string_view suggestion) {
  return suggestion.empty() ? std::string{} : "; did you mean '" + join(path, suggestion) + "'?";
}

inline std::string did_you_mean_value(std::string_view suggestion) {
  return suggestion.empty() ? std::string{} : "; did you mean \"" + std::string{suggestion} + "\"?";
}

//! A short description of a JSON value for error messages: its text and its type.
inline std::string describe(const json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  const char* kind = v.is_string()    ? "a string"
                     : v.is_boolean() ? "a boolean"
                     : v.is_null()    ? "null"
                     : v.is_array()   ? "an array"
                     : v.is_object()  ? "an object"
                                      : "a number";
  return text + " (" + kind + ")";
}

[[noreturn]] inline void wrong_type(const std::string& key, const json& v, std::string_view expected) {
  if (v.is_string() && v.get_ref<const std::string&>() == "auto")
    fail(key, ": expected ", expected,
         ", got \"auto\" (a Hugging Face Trainer placeholder, which only the HF "
         "Trainer fills in: write the value)");
  fail(key, ": expected ", expected, ", got ", describe(v));
}

//! Checks the keys of one object against its section: a used key is left to the caller, an
//! ignored one is recorded (unless `record` is false: inside an already ignored key), a removed
//! or unknown one is an error. `where` is the dotted path in the file, `rules` the section.
inline void check_keys(const json& obj, const std::string& where, const key_section& rules,
                       std::vector<std::string>& ignored, bool record = true) {
  for (const auto& [key, value] : obj.items()) {
    (void)value;
    auto has = [&](const std::vector<std::string_view>& list) {
      return std::find(list.begin(), list.end(), key) != list.end();
    };
    if (has(rules.used)) continue;
    if (has(rules.ignored)) {
      if (record) ignored.push_back(join(where, key));
      continue;
    }
    if (has(rules.removed))
      fail("'", join(where, key), "' was removed from DeepSpeed (0.19 rejects it as well): delete it");
    std::vector<std::string_view> all = rules.used;
    all.insert(all.end(), rules.ignored.begin(), rules.ignored.end());
    const char* whose = rules.deepspeed ? "neither a DeepSpeed key nor one of trident's" : "not a key of trident's";
    fail("unknown key '", join(where, key), "' (", whose, ")", did_you_mean(where, nearest(key, all)));
  }
}

inline const json* find(const json& obj, std::string_view key) {
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

inline const json& expect_object(const json& v, const std::string& key) {
  if (!v.is_object()) wrong_type(key, v, "an object");
  return v;
}

//! An integer in [lo, hi]. Integral floats (5e8) are integers, as in pydantic's int fields;
//! with `floats` false they are not (DeepSpeed's schedulers insist on a Python int).
inline std::int64_t get_integer(const json& v, const std::string& key, std::int64_t lo, std::int64_t hi,
                                std::string_view expected, bool floats = true) {
  std::int64_t x = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      fail(key, ": expected ", expected, ", got ", u);
    x = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<std::int64_t>();
  } else if (v.is_number_float() && floats) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::trunc(d) != d || std::fabs(d) >= 0x1p63) wrong_type(key, v, expected);
    x = static_cast<std::int64_t>(d);
  } else {
    wrong_type(key, v, expected);
  }
  if (x < lo || x > hi) fail(key, ": expected ", expected, ", got ", x);
  return x;
}

inline double get_number(const json& v, const std::string& key, double lo, double hi, std::string_view expected) {
  if (!v.is_number()) wrong_type(key, v, expected);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) fail(key, ": expected ", expected, ", got ", v.dump());
  return x;
}

inline bool get_bool(const json& v, const std::string& key) {
  if (!v.is_boolean()) wrong_type(key, v, "true or false");
  return v.get<bool>();
}

inline std::string get_string(const json& v, const std::string& key) {
  if (!v.is_string()) wrong_type(key, v, "a string");
  return v.get<std::string>();
}

inline constexpr std::int64_t int_max = std::numeric_limits<int>::max();
inline constexpr std::int64_t size_max = std::numeric_limits<std::int64_t>::max();

//! Reads `obj[key]` into `out` when present, through `read(value, dotted_key)`.
template <class T, class Read>
void read_if(const json& obj, const std::string& where, std::string_view key, T& out, Read read) {
  if (const json* v = find(obj, key)) out = static_cast<T>(read(*v, join(where, key)));
}

//! A ZeRO-3 field DeepSpeed accepts under two names (its pydantic alias and the field name);
//! both at once is an error there too.
inline void read_zero3_size(const json& zero, std::string_view alias, std::string_view name, std::size_t& out) {
  const json* a = find(zero, alias);
  const json* b = find(zero, name);
  if (a && b)
    fail("zero_optimization: '", alias, "' and '", name,
         "' are one setting (DeepSpeed rejects both together): keep one");
  if (const json* v = a ? a : b)
    out = static_cast<std::size_t>(
        get_integer(*v, join("zero_optimization", a ? alias : name), 0, size_max, "an integer >= 0"));
}

//! world_size = d * t * p; returns d.
inline int check_world(int world_size, const trident_config& t) {
  if (world_size < 1) fail("expected a world size of at least 1 rank, got ", world_size);
  if (t.tensor_parallel < 1 || t.pipeline_parallel < 1)
    fail("trident.tensor_parallel and trident.pipeline_parallel must be >= 1, got ", t.tensor_parallel, " and ",
         t.pipeline_parallel);
  const std::int64_t tp = std::int64_t{t.tensor_parallel} * t.pipeline_parallel;
  if (world_size % tp != 0)
    fail("world size ", world_size, " is not a multiple of trident.tensor_parallel (t = ", t.tensor_parallel,
         ") x trident.pipeline_parallel (p = ", t.pipeline_parallel, "): expected world size = d*t*p");
  return static_cast<int>(world_size / tp);
}

inline void parse_trident(const json& j, trident_config& t, std::vector<std::string>& ignored) {
  const json& s = expect_object(j, "trident");
  check_keys(s, "trident", section("trident"), ignored);
  auto positive_int = [](std::string_view what) {
    return [what](const json& v, const std::string& key) { return get_integer(v, key, 1, int_max, what); };
  };
  auto size = [](const json& v, const std::string& key) { return get_integer(v, key, 1, size_max, "an integer >= 1"); };
  auto string = [](const json& v, const std::string& key) { return get_string(v, key); };
  read_if(s, "trident", "tensor_parallel", t.tensor_parallel, positive_int("an integer >= 1"));
  read_if(s, "trident", "pipeline_parallel", t.pipeline_parallel, positive_int("an integer >= 1"));
  read_if(s, "trident", "virtual_stages", t.virtual_stages, positive_int("an integer >= 1"));
  if (const json* v = find(s, "schedule")) t.schedule = get_string(*v, "trident.schedule");
  read_if(s, "trident", "sequence_parallel", t.sequence_parallel, get_bool);
  if (const json* v = find(s, "recompute")) {
    t.recompute = get_string(*v, "trident.recompute");
    TRIDENT_EXPECT(t.recompute == "none" || t.recompute == "selective" || t.recompute == "full", "trident.recompute: '", t.recompute,
                   "'; expected \"none\", \"selective\" or \"full\"");
  }
  if (const json* v = find(s, "attention")) {
    t.attention = get_string(*v, "trident.attention");
    TRIDENT_EXPECT(t.attention == "auto" || t.attention == "standard" || t.attention == "flash" || t.attention == "flash_bf16",
                   "trident.attention: '", t.attention, "'; expected \"auto\", \"standard\", \"flash\" or \"flash_bf16\"");
  }
  if (const json* m = find(s, "model")) {
    const json& model = expect_object(*m, "trident.model");
    check_keys(model, "trident.model", section("trident.model"), ignored);
    read_if(model, "trident.model", "vocab_size", t.model.vocab_size, size);
    read_if(model, "trident.model", "seq_len", t.model.seq_len, size);
    read_if(model, "trident.model", "hidden", t.model.hidden, size);
    read_if(model, "trident.model", "heads", t.model.heads, size);
    read_if(model, "trident.model", "layers", t.model.layers, size);
    read_if(model, "trident.model", "ffn", t.model.ffn, [](const json& v, const std::string& key) {
      return get_integer(v, key, 0, size_max, "an integer >= 0 (0: 4 * hidden)");
    });
  }
  read_if(s, "trident", "train_data", t.train_data, string);
  read_if(s, "trident", "val_data", t.val_data, string);
  read_if(s, "trident", "steps", t.steps, size);
  read_if(s, "trident", "eval_every", t.eval_every, [](const json& v, const std::string& key) {
    return get_integer(v, key, 0, size_max, "an integer >= 0 (0: no validation)");
  });
  read_if(s, "trident", "eval_batches", t.eval_batches, positive_int("an integer >= 1"));
  read_if(s, "trident", "seed", t.seed,
          [](const json& v, const std::string& key) { return get_integer(v, key, 0, size_max, "an integer >= 0"); });
  read_if(s, "trident", "loss_csv", t.loss_csv, string);
  read_if(s, "trident", "loss_svg", t.loss_svg, string);
  read_if(s, "trident", "trace", t.trace, string);
}

//! DeepSpeedConfig._set_batch_related_parameters and _batch_assertion, in integers.
inline void resolve_batch(const json& j, int dp, train_config& c) {
  auto read = [&](std::string_view key) -> std::int64_t {
    const json* v = find(j, key);
    // DeepSpeed reads these with dict.get: an explicit null is the same as leaving the key out.
    if (v == nullptr || v->is_null()) return 0;
    return get_integer(*v, std::string{key}, 1, int_max, "a positive integer");
  };
  std::int64_t tbs = read("train_batch_size"), micro = read("train_micro_batch_size_per_gpu"),
               gas = read("gradient_accumulation_steps");
  const std::int64_t d = dp;
  if (tbs && micro && gas) {
    if (tbs != micro * gas * d)
      fail("train_batch_size ", tbs, " must equal train_micro_batch_size_per_gpu ", micro,
           " x gradient_accumulation_steps ", gas, " x data-parallel size ", d, " = ", micro * gas * d);
  } else if (tbs && micro) {
    if (tbs % (micro * d) != 0 || tbs < micro * d)
      fail("train_batch_size ", tbs, " must be a positive multiple of train_micro_batch_size_per_gpu ", micro,
           " x data-parallel size ", d, " = ", micro * d, " (gradient_accumulation_steps is derived from them)");
    gas = tbs / (micro * d);
  } else if (tbs && gas) {
    if (tbs % (gas * d) != 0 || tbs < gas * d)
      fail("train_batch_size ", tbs, " must be a positive multiple of gradient_accumulation_steps ", gas,
           " x data-parallel size ", d, " = ", gas * d, " (train_micro_batch_size_per_gpu is derived from them)");
    micro = tbs / (gas * d);
  } else if (micro && gas) {
    tbs = micro * gas * d;
  } else if (tbs) {
    gas = 1;
    if (tbs % d != 0 || tbs < d)
      fail("train_batch_size ", tbs, " must be a positive multiple of the data-parallel size ", d,
           " (with gradient_accumulation_steps 1, the micro batch is train_batch_size / ", d, ")");
    micro = tbs / d;
  } else if (micro) {
    gas = 1;
    tbs = micro * d;
  } else {
    fail("expected train_batch_size or train_micro_batch_size_per_gpu (or both; DeepSpeed derives the others)");
  }
  if (tbs > int_max) fail("train_batch_size ", tbs, " (micro x gas x data-parallel size) does not fit an int");
  c.train_batch_size = static_cast<int>(tbs);
  c.micro_batch = static_cast<int>(micro);
  c.gradient_accumulation_steps = static_cast<int>(gas);
}

inline bool parse_fp16(const json& v, fp16_config& f, std::vector<std::string>& ignored) {
  const json& s = expect_object(v, "fp16");
  check_keys(s, "fp16", section("fp16"), ignored);
  bool enabled = false;
  read_if(s, "fp16", "enabled", enabled, get_bool);
  read_if(s, "fp16", "loss_scale", f.loss_scale, [](const json& x, const std::string& key) {
    return get_number(x, key, 0, std::numeric_limits<double>::max(), "a number >= 0 (0: dynamic loss scaling)");
  });
  const bool dynamic = enabled && f.loss_scale == 0;
  // DeepSpeed checks the dynamic scaler's settings only when it will make one; so does trident.
  const std::int64_t lo = dynamic ? 1 : std::numeric_limits<int>::min();
  read_if(s, "fp16", "initial_scale_power", f.initial_scale_power, [&](const json& x, const std::string& key) {
    return get_integer(x, key, dynamic ? 0 : lo, dynamic ? 127 : int_max, "an integer in [0, 127]");
  });
  read_if(s, "fp16", "loss_scale_window", f.loss_scale_window,
          [&](const json& x, const std::string& key) { return get_integer(x, key, lo, int_max, "an integer >= 1"); });
  read_if(s, "fp16", "hysteresis", f.hysteresis,
          [&](const json& x, const std::string& key) { return get_integer(x, key, lo, int_max, "an integer >= 1"); });
  read_if(s, "fp16", "consecutive_hysteresis", f.consecutive_hysteresis, get_bool);
  read_if(s, "fp16", "min_loss_scale", f.min_loss_scale,
          [&](const json& x, const std::string& key) { return get_integer(x, key, lo, int_max, "an integer >= 1"); });
  return enabled;
}

inline void parse_zero(const json& j, train_config& c, std::vector<std::string>& ignored) {
  zero_config& z = c.zero;
  const json* v = find(j, "zero_optimization");
  if (v != nullptr && v->is_boolean()) {
    // DeepSpeed's old form: true is stage 1, with the top-level allgather_size as its bucket.
    z.stage = v->get<bool>() ? 1 : 0;
    if (const json* a = find(j, "allgather_size"); a && z.stage > 0)
      z.allgather_bucket_size =
          static_cast<std::size_t>(get_integer(*a, "allgather_size", 0, size_max, "an integer >= 0"));
  } else if (v != nullptr) {
    const json& s = expect_object(*v, "zero_optimization");
    check_keys(s, "zero_optimization", section("zero_optimization"), ignored);
    for (std::string_view sub : {"offload_param", "offload_optimizer"})
      if (const json* o = find(s, sub); o && o->is_object())
        check_keys(*o, join("zero_optimization", sub), section(join("zero_optimization", sub)), ignored, false);
    read_if(s, "zero_optimization", "stage", z.stage,
            [](const json& x, const std::string& key) { return get_integer(x, key, 0, 3, "0, 1, 2 or 3"); });
    read_if(s, "zero_optimization", "reduce_bucket_size", z.reduce_bucket_size,
            [](const json& x, const std::string& key) {
              return get_integer(x, key, 1, size_max, "an integer >= 1 (elements)");
            });
    read_if(s, "zero_optimization", "allgather_bucket_size", z.allgather_bucket_size,
            [](const json& x, const std::string& key) {
              return get_integer(x, key, 0, size_max, "an integer >= 0 (elements)");
            });
    z.overlap_comm = z.stage == 3;
    if (const json* o = find(s, "overlap_comm"); o && !o->is_null())
      z.overlap_comm = get_bool(*o, "zero_optimization.overlap_comm");
    read_if(s, "zero_optimization", "contiguous_gradients", z.contiguous_gradients, get_bool);
    read_if(s, "zero_optimization", "reduce_scatter", z.reduce_scatter, get_bool);
    read_zero3_size(s, "stage3_prefetch_bucket_size", "prefetch_bucket_size", z.stage3_prefetch_bucket_size);
    read_zero3_size(s, "stage3_param_persistence_threshold", "param_persistence_threshold",
                    z.stage3_param_persistence_threshold);
    read_zero3_size(s, "stage3_max_live_parameters", "max_live_parameters", z.stage3_max_live_parameters);
    read_zero3_size(s, "stage3_max_reuse_distance", "max_reuse_distance", z.stage3_max_reuse_distance);
  }
  if (find(j, "allgather_size") && !(v && v->is_boolean())) ignored.emplace_back("allgather_size");
}

inline void parse_optimizer(const json& v, optimizer_config& o, std::vector<std::string>& ignored) {
  const json& s = expect_object(v, "optimizer");
  check_keys(s, "optimizer", section("optimizer"), ignored);
  const json* type = find(s, "type");
  if (type == nullptr)
    fail("optimizer.type: expected \"Adam\" or \"AdamW\" (DeepSpeed ignores a section without a type)");
  std::string name = get_string(*type, "optimizer.type");
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](char ch) { return (ch >= 'A' && ch <= 'Z') ? static_cast<char>(ch - 'A' + 'a') : ch; });
  if (lower != "adam" && lower != "adamw")
    fail("optimizer.type: trident supports \"Adam\" and \"AdamW\" (DeepSpeed's names, any case), got \"", name, "\"");
  o.type = lower;
  o.weight_decay = 0;  // FusedAdam's default; torch_adam's is settled below
  const json* params = find(s, "params");
  if (params == nullptr || params->is_null()) {
    o.decoupled_weight_decay = true;
    return;
  }
  const json& p = expect_object(*params, "optimizer.params");
  if (find(p, "max_grad_norm"))
    fail(
        "optimizer.params.max_grad_norm: not an optimizer parameter (DeepSpeed refuses it too): use the top-level "
        "\"gradient_clipping\"");
  check_keys(p, "optimizer.params", section("optimizer.params"), ignored);
  const std::string at = "optimizer.params";
  bool adam_w_mode = true, torch_adam = false;
  read_if(p, at, "adam_w_mode", adam_w_mode, get_bool);
  read_if(p, at, "torch_adam", torch_adam, get_bool);
  // DeepSpeedEngine._configure_basic_optimizer: AdamW always decouples; Adam unless told not to.
  o.decoupled_weight_decay = lower == "adamw" || adam_w_mode;
  // With torch_adam the engine makes torch.optim.AdamW (decoupled) or Adam, whose defaults differ.
  o.weight_decay = torch_adam && o.decoupled_weight_decay ? 0.01f : 0.0f;
  auto unit = [](const json& x, const std::string& key) { return get_number(x, key, 0, 1, "a number in [0, 1)"); };
  auto non_negative = [](const json& x, const std::string& key) {
    return get_number(x, key, 0, std::numeric_limits<double>::max(), "a number >= 0");
  };
  read_if(p, at, "lr", o.lr, non_negative);
  read_if(p, at, "eps", o.eps, non_negative);
  read_if(p, at, "weight_decay", o.weight_decay, non_negative);
  if (const json* b = find(p, "betas")) {
    if (!b->is_array() || b->size() != 2) wrong_type("optimizer.params.betas", *b, "two numbers [beta1, beta2]");
    o.beta1 = static_cast<float>(unit((*b)[0], "optimizer.params.betas[0]"));
    o.beta2 = static_cast<float>(unit((*b)[1], "optimizer.params.betas[1]"));
    if (o.beta1 >= 1 || o.beta2 >= 1) fail("optimizer.params.betas: expected two numbers in [0, 1), got ", b->dump());
  }
  // Keys that would change the update into one trident does not implement.
  auto refuse = [&](std::string_view key, bool harmless, const char* why) {
    if (const json* x = find(p, key); x && get_bool(*x, join(at, key)) != harmless)
      fail(join(at, key), ": expected ", harmless ? "true" : "false", " (", why, "), got ", x->dump());
  };
  refuse("amsgrad", false, "trident's Adam has no AMSGrad variant here; DeepSpeed's FusedAdam refuses it too");
  refuse("bias_correction", true, "trident's Adam always corrects the bias");
  refuse("maximize", false, "trident minimizes the loss");
  refuse("decoupled_weight_decay", false, "write \"type\": \"AdamW\" instead");
}

inline void parse_scheduler(const json& v, const optimizer_config& o, scheduler_config& s,
                            std::vector<std::string>& ignored) {
  const json& sec = expect_object(v, "scheduler");
  check_keys(sec, "scheduler", section("scheduler"), ignored);
  const std::vector<std::string_view> types = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
  const json* type = find(sec, "type");
  if (type == nullptr)
    fail(
        "scheduler.type: expected \"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\" (DeepSpeed ignores a section "
        "without a type)");
  s.type = get_string(*type, "scheduler.type");
  // DeepSpeed looks the name up as a class: case matters.
  if (std::find(types.begin(), types.end(), s.type) == types.end())
    fail("scheduler.type: trident supports \"WarmupLR\", \"WarmupDecayLR\" and \"WarmupCosineLR\", got \"", s.type,
         "\"", did_you_mean_value(nearest(s.type, types)));
  const json* params = find(sec, "params");
  if (params == nullptr || params->is_null())
    fail("scheduler.params: expected an object (DeepSpeed calls the scheduler with **params: an empty {} is fine)");
  const json& p = expect_object(*params, "scheduler.params");
  check_keys(p, "scheduler.params", section(join("scheduler.params", s.type)), ignored);
  const std::string at = "scheduler.params";
  auto non_negative = [](const json& x, const std::string& key) {
    return get_number(x, key, 0, std::numeric_limits<double>::max(), "a number >= 0");
  };
  auto ratio = [](const json& x, const std::string& key) { return get_number(x, key, 0, 1, "a number in [0, 1]"); };
  const bool cosine = s.type == "WarmupCosineLR";
  if (!cosine) {
    // WarmupLR's maximum is the optimizer's lr unless given; WarmupDecayLR's is 0.001.
    s.warmup_max_lr = s.type == "WarmupLR" ? o.lr : 0.001;
    read_if(p, at, "warmup_min_lr", s.warmup_min_lr, non_negative);
    read_if(p, at, "warmup_max_lr", s.warmup_max_lr, non_negative);
  } else {
    read_if(p, at, "warmup_min_ratio", s.warmup_min_ratio, ratio);
    read_if(p, at, "cos_min_ratio", s.cos_min_ratio, ratio);
  }
  read_if(p, at, "warmup_num_steps", s.warmup_num_steps, [](const json& x, const std::string& key) {
    return get_integer(x, key, 1, size_max, "a positive integer (DeepSpeed refuses 100.0)", false);
  });
  read_if(p, at, "warmup_type", s.warmup_type, [](const json& x, const std::string& key) {
    std::string w = get_string(x, key);
    // DeepSpeed replaces any other word by "log" with a warning; a typo should not do that.
    if (w != "log" && w != "linear") fail(key, ": expected \"log\" or \"linear\", got \"", w, "\"");
    return w;
  });
  if (const json* x = find(p, "last_batch_iteration");
      x && get_integer(*x, join(at, "last_batch_iteration"), -1, size_max, "an integer") != -1)
    fail(join(at, "last_batch_iteration"),
         ": expected -1 (a resumed run restores the schedule from its checkpoint), got ", x->dump());
  if (s.type != "WarmupLR") {
    const json* total = find(p, "total_num_steps");
    if (total == nullptr) fail(join(at, "total_num_steps"), ": required by ", s.type, " (it has no default)");
    s.total_num_steps = get_integer(*total, join(at, "total_num_steps"), 1, size_max, "an integer >= 1");
  }
}

inline void check_must_be(const json& j, std::string_view key, const json& expected, const char* why) {
  if (const json* v = find(j, key); v && *v != expected)
    fail(key, ": expected ", expected.dump(), " (", why, "), got ", describe(*v));
}

}  // namespace detail

//! Reads a DeepSpeed config (with its "trident" section) for `world_size` ranks; the
//! data-parallel size is world_size / (tensor_parallel * pipeline_parallel). Throws
//! trident::usage_error naming the dotted key and what was expected.
//!
//!   auto cfg = flagship::parse_config(nlohmann::json::parse(R"({"train_batch_size": 32})"), 4);
//!   // cfg.micro_batch == 8, cfg.gradient_accumulation_steps == 1
inline train_config parse_config(const nlohmann::json& j, int world_size) {
  using namespace detail;
  train_config c;
  if (!j.is_object()) wrong_type("the configuration", j, "a JSON object");
  check_keys(j, "", section(""), c.ignored);
  if (const json* t = find(j, "trident")) parse_trident(*t, c.trident, c.ignored);
  c.data_parallel = check_world(world_size, c.trident);
  resolve_batch(j, c.data_parallel, c);

  bool fp16 = false, bf16 = false;
  if (const json* v = find(j, "fp16")) fp16 = parse_fp16(*v, c.fp16, c.ignored);
  if (find(j, "bf16") && find(j, "bfloat16")) fail("'bf16' and 'bfloat16' (its old name) are one section: keep 'bf16'");
  for (const char* name : {"bf16", "bfloat16"})
    if (const json* v = find(j, name)) {
      const json& s = expect_object(*v, name);
      check_keys(s, name, section("bf16"), c.ignored);
      read_if(s, name, "enabled", bf16, get_bool);
    }
  if (fp16 && bf16) fail("fp16.enabled and bf16.enabled are both true (DeepSpeed refuses it too): enable one");
  c.precision = fp16 ? precision_kind::fp16 : bf16 ? precision_kind::bf16 : precision_kind::fp32;

  parse_zero(j, c, c.ignored);
  read_if(j, "", "gradient_clipping", c.gradient_clipping, [](const json& v, const std::string& key) {
    return get_number(v, key, 0, std::numeric_limits<float>::max(), "a number >= 0 (0: no clipping)");
  });
  if (const json* v = find(j, "optimizer")) parse_optimizer(*v, c.optimizer, c.ignored);
  if (const json* v = find(j, "scheduler")) parse_scheduler(*v, c.optimizer, c.scheduler, c.ignored);
  check_must_be(j, "gradient_allreduce_op", "mean", "trident averages gradients; \"sum\" would scale them by dp");
  check_must_be(j, "sequence_parallel_size", 1,
                "DeepSpeed-Ulysses; trident's sequence parallelism is trident.sequence_parallel");
  std::sort(c.ignored.begin(), c.ignored.end());
  return c;
}

//! Reads a config file: JSON, with // and /* */ comments allowed (DeepSpeed reads files with
//! hjson) and duplicate keys refused (DeepSpeed refuses them too).
inline train_config load_config(const std::string& path, int world_size) {
  using detail::json;
  std::ifstream in(path, std::ios::binary);
  if (!in) detail::fail("cannot open config file '", path, "'");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  struct frame {
    std::set<std::string> keys;
    std::string last;
  };
  std::vector<frame> frames;
  // Nesting is bounded: the parser keeps its own stack, but printing and destroying a value
  // recurse, and 200000 nested arrays overflowed the call stack in an error message.
  constexpr int max_depth = 64;
  int depth = 0;
  auto on_event = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) {
      if (++depth > max_depth) detail::fail(path, ": values nested more than ", max_depth, " deep; a DeepSpeed config needs a few levels");
    }
    if (event == json::parse_event_t::object_end || event == json::parse_event_t::array_end) --depth;
    if (event == json::parse_event_t::object_start) frames.emplace_back();
    if (event == json::parse_event_t::object_end) frames.pop_back();
    if (event == json::parse_event_t::key) {
      std::string key = parsed.get<std::string>();
      if (!frames.back().keys.insert(key).second) {
        std::string where;
        for (std::size_t i = 0; i + 1 < frames.size(); ++i) where = detail::join(where, frames[i].last);
        detail::fail(path, ": key '", detail::join(where, key), "' appears twice");
      }
      frames.back().last = std::move(key);
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, on_event, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    detail::fail(path, " is not valid JSON: ", e.what());
  }
  return parse_config(j, world_size);
}

//! Checks that the grid and the model fit: world = d*t*p, heads and the vocabulary split over
//! the tensor-parallel ranks, layers over the pipeline stages, a known pipeline schedule.
//!
//!   flagship::check_layout(cfg, world_size);   // before building the process grid
inline void check_layout(const train_config& c, int world_size) {
  using detail::fail;
  const trident_config& t = c.trident;
  const model_config& m = t.model;
  detail::check_world(world_size, t);
  // A config from parse_config has these >= 1 already; one built by hand may not.
  for (const auto& [name, value] :
       {std::pair{"trident.model.heads", m.heads}, std::pair{"trident.model.hidden", m.hidden},
        std::pair{"trident.model.layers", m.layers}, std::pair{"trident.model.vocab_size", m.vocab_size},
        std::pair{"trident.model.seq_len", m.seq_len}})
    if (value < 1) fail(name, ": expected an integer >= 1, got ", value);
  if (t.virtual_stages < 1) fail("trident.virtual_stages: expected an integer >= 1, got ", t.virtual_stages);
  if (m.heads % static_cast<std::size_t>(t.tensor_parallel) != 0)
    fail("trident.model.heads ", m.heads, " is not divisible by trident.tensor_parallel ", t.tensor_parallel,
         " (each tensor-parallel rank holds whole heads)");
  if (m.hidden % m.heads != 0)
    fail("trident.model.hidden ", m.hidden, " is not divisible by trident.model.heads ", m.heads);
  const std::size_t ffn = m.ffn == 0 ? 4 * m.hidden : m.ffn;
  if (ffn % static_cast<std::size_t>(t.tensor_parallel) != 0)
    fail("trident.model.ffn ", ffn, " is not divisible by trident.tensor_parallel ", t.tensor_parallel);
  if (m.vocab_size % static_cast<std::size_t>(t.tensor_parallel) != 0) {
    const auto tp = static_cast<std::size_t>(t.tensor_parallel);
    fail("trident.model.vocab_size ", m.vocab_size, " is not divisible by trident.tensor_parallel ", tp,
         ": pad the vocabulary to ", (m.vocab_size + tp - 1) / tp * tp, " (Megatron pads it the same way)");
  }
  if (t.sequence_parallel && m.seq_len % static_cast<std::size_t>(t.tensor_parallel) != 0)
    fail("trident.model.seq_len ", m.seq_len, " is not divisible by trident.tensor_parallel ", t.tensor_parallel,
         " (sequence parallelism splits the sequence over the tensor-parallel ranks)");
  const auto stages = static_cast<std::size_t>(t.pipeline_parallel) * static_cast<std::size_t>(t.virtual_stages);
  if (m.layers % stages != 0)
    fail("trident.model.layers ", m.layers, " is not divisible by trident.pipeline_parallel ", t.pipeline_parallel,
         " x trident.virtual_stages ", t.virtual_stages, " = ", stages);
  if (std::find(std::begin(pipeline_schedules), std::end(pipeline_schedules), t.schedule) ==
      std::end(pipeline_schedules))
    fail("trident.schedule: expected one of gpipe, 1f1b, interleaved, zb-h1, zb-h2, got \"", t.schedule, "\"",
         detail::did_you_mean_value(detail::nearest(t.schedule, pipeline_schedules)));
  if (t.virtual_stages > 1 && t.schedule != "interleaved")
    fail("trident.virtual_stages ", t.virtual_stages, " needs trident.schedule \"interleaved\", got \"", t.schedule,
         "\"");
}

//! The attention a run gets: {flash_attention, flash_bf16} for `attention` (--attention or
//! trident.attention) on `backend` in `precision`. "auto" (the default) is the bf16 tiles where
//! they are the fastest and smallest choice (the GPU path in bf16, head_dim 32 or 64: on an H200
//! GPT-2 124M's step 15% faster than the unfused attention's, 9 GiB less; bench/RESULTS.md), and
//! the standard attention everywhere else (main.cpp also falls back to it on a GPU older than
//! compute capability 8.0, which the tiles refuse). The flash choices are the GPU path's: asked of a host
//! backend they are an error (the host blocks would run the tiles' emulation, for tests only).
struct attention_choice {
  bool flash = false, bf16 = false;
};
inline attention_choice resolve_attention(const std::string& attention, const std::string& backend, const std::string& precision,
                                          std::size_t hidden, std::size_t heads) {
  TRIDENT_EXPECT(attention == "auto" || attention == "standard" || attention == "flash" || attention == "flash_bf16",
                 "flagship: attention ", attention, "; expected auto, standard, flash or flash_bf16");
  if (attention == "auto") {
    const bool tiles = heads > 0 && hidden % heads == 0 && (hidden / heads == 32 || hidden / heads == 64);
    return backend == "nccl" && precision == "bf16" && tiles ? attention_choice{true, true} : attention_choice{};
  }
  TRIDENT_EXPECT(backend == "nccl" || attention == "standard", "flagship: attention ", attention, " is the GPU path's "
                 "(--backend nccl); the ", backend, " backend runs the standard attention");
  return {attention != "standard", attention == "flash_bf16"};
}

}  // namespace flagship
