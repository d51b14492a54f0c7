// The flagship's DeepSpeed config loader (examples/01_flagship/ds_config.hpp) against DeepSpeed
// itself: tests/fixtures/deepspeed_config.txt holds what DeepSpeed 0.19.8 accepted or rejected,
// and resolved, for every case below (scripts/reference/deepspeed_config.py), and the keys it
// knows. The hand-written cases pin the error messages: the dotted key, what was expected, and
// the nearest known key when a key is misspelt.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "01_flagship/ds_config.hpp"
#include "support/fixtures.hpp"

#ifndef TRIDENT_SOURCE_DIR
#error "define TRIDENT_SOURCE_DIR to the repository root"
#endif

using flagship::parse_config;
using flagship::precision_kind;
using flagship::train_config;
using nlohmann::json;

namespace {

//! The usage_error message of f(), or "<no error>".
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const trident::usage_error& e) {
    return e.message();
  }
  return "<no error>";
}

std::string parse_error(const json& j, int world = 1) {
  return error_of([&] { (void)parse_config(j, world); });
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

#define CHECK_MESSAGE_HAS(message, part) \
  do {                                   \
    const std::string m_ = (message);    \
    INFO("message: ", m_);               \
    CHECK(contains(m_, part));           \
  } while (false)

std::string source_path(const std::string& relative) { return std::string(TRIDENT_SOURCE_DIR) + "/" + relative; }

const std::vector<test_support::fixture_record>& fixture() {
  static const auto records = test_support::read_fixture("deepspeed_config.txt");
  return records;
}

//! Cases DeepSpeed accepts and trident refuses on purpose, with the reason.
const std::map<std::string, std::string>& stricter_than_deepspeed() {
  static const std::map<std::string, std::string> cases = {
      {"bool_micro_w4", "true is not a batch size (Python counts it as 1)"},
      {"huge_tbs_w1", "a train_batch_size of 2^31 does not fit an int"},
      {"float_micro_2.5_gas_2_w1", "2.5 samples per micro batch (DeepSpeed's arithmetic happens to balance)"},
      {"fp16_auto", "\"auto\" is a Hugging Face placeholder; DeepSpeed drops it and silently disables fp16"},
      {"fp16_string_window", "a string where a number is expected (pydantic converts \"1000\")"},
      {"zero_stage_string", "a string where a number is expected (pydantic converts \"2\")"},
      {"misspelt_top_level", "DeepSpeed ignores unknown top-level keys"},
      {"gradient_clipping_negative", "a negative clipping norm"},
      {"warmup_type_unknown", "DeepSpeed replaces an unknown warmup_type by \"log\" with a warning"},
      {"scheduler_last_batch_iteration", "a resumed run restores the schedule from its checkpoint"},
      {"adam_bias_correction_off", "trident's Adam always corrects the bias"},
  };
  return cases;
}

void check_resolved(const train_config& c, const test_support::fixture_record& r) {
  CHECK(c.data_parallel == r.integer("dp"));
  CHECK(c.train_batch_size == r.integer("tbs"));
  CHECK(c.micro_batch == r.integer("micro"));
  CHECK(c.gradient_accumulation_steps == r.integer("gas"));
  CHECK((c.precision == precision_kind::fp16) == (r.integer("fp16") == 1));
  CHECK((c.precision == precision_kind::bf16) == (r.integer("bf16") == 1));
  CHECK(c.fp16.loss_scale == r.number("loss_scale"));
  CHECK(c.fp16.initial_scale_power == r.integer("initial_scale_power"));
  CHECK(c.fp16.loss_scale_window == r.integer("loss_scale_window"));
  CHECK(c.fp16.hysteresis == r.integer("hysteresis"));
  CHECK(c.fp16.consecutive_hysteresis == (r.integer("consecutive_hysteresis") == 1));
  CHECK(c.fp16.min_loss_scale == r.number("min_loss_scale"));
  CHECK(c.gradient_clipping == static_cast<float>(r.number("gradient_clipping")));
  CHECK(c.zero.stage == r.integer("zero_stage"));
  CHECK(c.zero.reduce_bucket_size == static_cast<std::size_t>(r.integer("reduce_bucket_size")));
  CHECK(c.zero.allgather_bucket_size == static_cast<std::size_t>(r.integer("allgather_bucket_size")));
  CHECK(c.zero.overlap_comm == (r.integer("overlap_comm") == 1));
  CHECK(c.zero.contiguous_gradients == (r.integer("contiguous_gradients") == 1));
  CHECK(c.zero.reduce_scatter == (r.integer("reduce_scatter") == 1));
  CHECK(c.zero.stage3_prefetch_bucket_size == static_cast<std::size_t>(r.integer("prefetch_bucket_size")));
  CHECK(c.zero.stage3_param_persistence_threshold ==
        static_cast<std::size_t>(r.integer("param_persistence_threshold")));
  CHECK(c.zero.stage3_max_live_parameters == static_cast<std::size_t>(r.integer("max_live_parameters")));
  CHECK(c.zero.stage3_max_reuse_distance == static_cast<std::size_t>(r.integer("max_reuse_distance")));
  if (r.has("opt")) {
    // fused_adam: adam_w_mode says which; torch's classes say it by their name.
    const std::string& kind = r.text("opt");
    INFO("DeepSpeed built ", kind);
    CHECK(c.optimizer.decoupled_weight_decay == (r.integer("adam_w_mode") == 1));
    if (kind != "fused_adam") CHECK(c.optimizer.decoupled_weight_decay == (kind == "adamw"));
    CHECK(c.optimizer.lr == r.number("lr"));
    CHECK(c.optimizer.beta1 == static_cast<float>(r.number("beta1")));
    CHECK(c.optimizer.beta2 == static_cast<float>(r.number("beta2")));
    CHECK(c.optimizer.eps == static_cast<float>(r.number("eps")));
    CHECK(c.optimizer.weight_decay == static_cast<float>(r.number("weight_decay")));
  }
  if (r.has("sched")) {
    const auto& s = c.scheduler;
    CHECK(s.type == r.text("sched"));
    CHECK(std::max<std::int64_t>(2, s.warmup_num_steps) == r.integer("warmup_num_steps"));  // DeepSpeed keeps max(2, n)
    CHECK(s.warmup_type == r.text("warmup_type"));
    if (r.has("warmup_max_lr")) {
      CHECK(s.warmup_min_lr == r.number("warmup_min_lr"));
      CHECK(s.warmup_max_lr == r.number("warmup_max_lr"));
    }
    if (r.has("total_num_steps")) CHECK(s.total_num_steps == r.integer("total_num_steps"));
    if (r.has("cos_min_ratio")) {
      CHECK(s.cos_min_ratio == r.number("cos_min_ratio"));
      CHECK(s.warmup_min_ratio == r.number("warmup_min_ratio"));
      CHECK(c.optimizer.lr == r.number("base_lr"));  // the cosine schedule scales the optimizer's lr
    }
  } else {
    CHECK(c.scheduler.type.empty());
  }
}

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST_CASE("ds_config: every case DeepSpeed resolved, resolved the same; every case it rejected, rejected") {
  int ok = 0, rejected = 0, stricter = 0;
  std::set<std::string> seen;
  for (const auto& r : fixture()) {
    if (r.keyword != "case") continue;
    const std::string& name = r.text("name");
    seen.insert(name);
    const int world = static_cast<int>(r.integer("world"));
    const json j = json::parse(r.lines.at(0));
    INFO("case ", name, " world ", world, ": ", r.lines.at(0));
    if (r.has("file")) {
      // The file on disk is the one DeepSpeed read.
      std::ifstream in(source_path(r.text("file")));
      REQUIRE(in);
      CHECK(json::parse(in, nullptr, true, true) == j);
    }
    auto run = [&] {
      return r.has("file") ? flagship::load_config(source_path(r.text("file")), world) : parse_config(j, world);
    };
    if (r.text("outcome") == "error") {
      INFO("DeepSpeed: ", r.lines.at(1));
      CHECK(error_of([&] { (void)run(); }) != "<no error>");
      ++rejected;
    } else if (const auto it = stricter_than_deepspeed().find(name); it != stricter_than_deepspeed().end()) {
      INFO("trident refuses it: ", it->second);
      CHECK(error_of([&] { (void)run(); }) != "<no error>");
      ++stricter;
    } else {
      train_config c;
      const std::string error = error_of([&] { c = run(); });
      REQUIRE_MESSAGE(error == "<no error>", error);
      check_resolved(c, r);
      ++ok;
    }
  }
  // The stricter list names only cases that exist and that DeepSpeed accepted.
  for (const auto& [name, why] : stricter_than_deepspeed()) {
    INFO(name, ": ", why);
    CHECK(seen.count(name) == 1);
  }
  CHECK(ok >= 50);
  CHECK(rejected >= 50);
  CHECK(stricter == static_cast<int>(stricter_than_deepspeed().size()));
}

TEST_CASE("ds_config: the keys trident knows are the keys DeepSpeed knows") {
  const auto& sections = flagship::known_keys();
  auto cpp_section = [&](std::string_view path) -> const flagship::key_section* {
    for (const auto& s : sections)
      if (s.path == path) return &s;
    return nullptr;
  };
  std::set<std::string> compared;
  int key_records = 0;
  for (const auto& r : fixture()) {
    if (r.keyword == "keys") {
      ++key_records;
      std::string path = r.text("section");
      path = path == "top" ? "" : path == "optimizer.params.adam" ? "optimizer.params" : path;
      INFO("section '", path, "' (DeepSpeed's ", r.text("source"), ")");
      const std::set<std::string> deepspeed(r.lines.begin(), r.lines.end());
      const auto* s = cpp_section(path);
      if (s == nullptr) {
        // A section trident does not read must be one it ignores whole.
        const auto dot = path.rfind('.');
        REQUIRE(dot != std::string::npos);
        const auto* parent = cpp_section(path.substr(0, dot));
        REQUIRE(parent != nullptr);
        CHECK(std::count(parent->ignored.begin(), parent->ignored.end(), path.substr(dot + 1)) == 1);
        continue;
      }
      std::set<std::string> ours(s->used.begin(), s->used.end());
      ours.insert(s->ignored.begin(), s->ignored.end());
      if (path.empty()) ours.erase("trident");  // trident's own section
      std::vector<std::string> missing, extra;
      std::set_difference(deepspeed.begin(), deepspeed.end(), ours.begin(), ours.end(), std::back_inserter(missing));
      std::set_difference(ours.begin(), ours.end(), deepspeed.begin(), deepspeed.end(), std::back_inserter(extra));
      std::string m, e;
      for (const auto& k : missing) m += k + " ";
      for (const auto& k : extra) e += k + " ";
      INFO("DeepSpeed knows, trident does not: ", m);
      INFO("trident lists, DeepSpeed does not know: ", e);
      CHECK(missing.empty());
      CHECK(extra.empty());
      compared.insert(path);
    } else if (r.keyword == "removed") {
      const std::string path = r.text("section") == "top" ? "" : r.text("section");
      const auto* s = cpp_section(path);
      REQUIRE(s != nullptr);
      const std::set<std::string> deepspeed(r.lines.begin(), r.lines.end());
      const std::set<std::string> ours(s->removed.begin(), s->removed.end());
      CHECK(ours == deepspeed);
    } else if (r.keyword == "names" && r.text("kind") == "schedulers") {
      for (const char* name : {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"})
        CHECK(std::count(r.lines.begin(), r.lines.end(), name) == 1);
    } else if (r.keyword == "names" && r.text("kind") == "optimizers") {
      for (const char* name : {"adam", "adamw"}) CHECK(std::count(r.lines.begin(), r.lines.end(), name) == 1);
    }
  }
  CHECK(key_records >= 10);
  // Every DeepSpeed section trident reads was compared.
  for (const auto& s : sections) {
    INFO("section '", s.path, "'");
    if (s.deepspeed) CHECK(compared.count(std::string(s.path)) == 1);
    // A key is either used or ignored, never both.
    for (auto k : s.used) CHECK(std::count(s.ignored.begin(), s.ignored.end(), k) == 0);
  }
}

TEST_CASE("ds_config: configs from DeepSpeed's documentation load unchanged") {
  const std::string dir = source_path("tests/fixtures/deepspeed_config/");
  SUBCASE("getting started (deepspeed.ai/getting-started): the old boolean zero_optimization") {
    const auto c = flagship::load_config(dir + "getting_started.json", 2);
    CHECK(c.train_batch_size == 8);
    CHECK(c.micro_batch == 4);
    CHECK(c.gradient_accumulation_steps == 1);
    CHECK(c.precision == precision_kind::fp16);
    CHECK(c.zero.stage == 1);  // "zero_optimization": true
    CHECK(c.optimizer.type == "adam");
    CHECK(c.optimizer.decoupled_weight_decay);  // DeepSpeed's Adam is AdamW unless adam_w_mode is false
    CHECK(c.optimizer.lr == 0.00015);
    CHECK(c.ignored.empty());
  }
  SUBCASE("CIFAR-10 tutorial: Adam with WarmupLR") {
    const auto c = flagship::load_config(dir + "cifar10.json", 1);
    CHECK(c.micro_batch == 4);
    CHECK(c.optimizer.beta1 == 0.8f);
    CHECK(c.optimizer.weight_decay == 3e-7f);
    CHECK(c.scheduler.type == "WarmupLR");
    CHECK(c.scheduler.warmup_max_lr == 0.001);
    CHECK(c.scheduler.warmup_num_steps == 1000);
    CHECK(c.ignored == std::vector<std::string>{"steps_per_print", "wall_clock_breakdown"});
  }
  SUBCASE("ZeRO tutorial, ZeRO-Infinity: a fragment, with a batch size added") {
    std::ifstream in(dir + "zero3_infinity.json");
    json j = json::parse(in);
    CHECK(contains(parse_error(j, 4), "expected train_batch_size or train_micro_batch_size_per_gpu"));
    j["train_micro_batch_size_per_gpu"] = 2;
    const auto c = parse_config(j, 4);
    CHECK(c.train_batch_size == 8);
    CHECK(c.zero.stage == 3);
    CHECK(c.zero.overlap_comm);                               // DeepSpeed's default for stage 3
    CHECK(c.zero.stage3_prefetch_bucket_size == 10'000'000);  // written 1e7
    CHECK(c.zero.stage3_param_persistence_threshold == 100'000);
    CHECK(c.zero.reduce_bucket_size == 10'000'000);
    CHECK(c.ignored == std::vector<std::string>{"zero_optimization.offload_optimizer",
                                                "zero_optimization.offload_param", "zero_optimization.sub_group_size"});
  }
  SUBCASE("BERT pre-training tutorial: refused, as DeepSpeed 0.19.8 refuses it") {
    const std::string m = error_of([&] { (void)flagship::load_config(dir + "bert_pretraining.json", 1); });
    CHECK_MESSAGE_HAS(m, "optimizer.params.max_grad_norm");
    CHECK_MESSAGE_HAS(m, "gradient_clipping");
  }
}

TEST_CASE("ds_config: the flagship's sample config") {
  const auto c = flagship::load_config(source_path("examples/01_flagship/configs/kjv_small.json"), 8);
  CHECK(c.data_parallel == 2);
  CHECK(c.gradient_accumulation_steps == 2);  // 32 = 8 x 2 x 2
  CHECK(c.precision == precision_kind::fp32);
  CHECK(c.zero.stage == 2);
  CHECK(c.trident.tensor_parallel == 2);
  CHECK(c.trident.pipeline_parallel == 2);
  CHECK(c.trident.model.seq_len == 64);
  CHECK(c.trident.train_data == "build/data/kjv_train.bin");
  CHECK(c.scheduler.type == "WarmupCosineLR");
  CHECK(c.ignored == std::vector<std::string>{"steps_per_print", "wall_clock_breakdown"});
  CHECK_NOTHROW(flagship::check_layout(c, 8));
  CHECK(contains(error_of([&] { flagship::check_layout(c, 6); }), "world size 6"));
}

TEST_CASE("ds_config: a misspelt key names its dotted path and the nearest known key") {
  struct misspelt {
    json config;
    const char* unknown;
    const char* suggestion;
  };
  const std::vector<misspelt> cases = {
      {{{"trian_batch_size", 8}, {"train_micro_batch_size_per_gpu", 1}}, "'trian_batch_size'", "'train_batch_size'"},
      {{{"train_batch_size", 8}, {"Gradient_Clipping", 1.0}}, "'Gradient_Clipping'", "'gradient_clipping'"},
      {{{"train_batch_size", 8}, {"fp16", {{"enabled", true}, {"initial_scale_pow", 8}}}},
       "'fp16.initial_scale_pow'",
       "'fp16.initial_scale_power'"},
      {{{"train_batch_size", 8}, {"bf16", {{"enable", true}}}}, "'bf16.enable'", "'bf16.enabled'"},
      {{{"train_batch_size", 8}, {"zero_optimization", {{"stage", 2}, {"reduce_bucket_sise", 5e8}}}},
       "'zero_optimization.reduce_bucket_sise'",
       "'zero_optimization.reduce_bucket_size'"},
      {{{"train_batch_size", 8}, {"zero_optimization", {{"stage", 3}, {"offload_param", {{"devic", "cpu"}}}}}},
       "'zero_optimization.offload_param.devic'",
       "'zero_optimization.offload_param.device'"},
      {{{"train_batch_size", 8}, {"optimizer", {{"tpye", "Adam"}}}}, "'optimizer.tpye'", "'optimizer.type'"},
      {{{"train_batch_size", 8}, {"optimizer", {{"type", "AdamW"}, {"params", {{"weight_decy", 0.1}}}}}},
       "'optimizer.params.weight_decy'",
       "'optimizer.params.weight_decay'"},
      {{{"train_batch_size", 8},
        {"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 10}, {"cos_min_ration", 0.1}}}}}},
       "'scheduler.params.cos_min_ration'",
       "'scheduler.params.cos_min_ratio'"},
      {{{"train_batch_size", 8}, {"trident", {{"tensor_paralel", 2}}}},
       "'trident.tensor_paralel'",
       "'trident.tensor_parallel'"},
      {{{"train_batch_size", 8}, {"trident", {{"model", {{"hiden", 64}}}}}},
       "'trident.model.hiden'",
       "'trident.model.hidden'"},
  };
  for (const auto& c : cases) {
    const std::string m = parse_error(c.config);
    CHECK_MESSAGE_HAS(m, std::string("unknown key ") + c.unknown);
    CHECK_MESSAGE_HAS(m, std::string("did you mean ") + c.suggestion);
  }
  // Nothing close: no suggestion. A scheduler parameter of another type is unknown to this one.
  const std::string far = parse_error({{"train_batch_size", 8}, {"learning_rate", 1e-3}});
  CHECK_MESSAGE_HAS(far, "unknown key 'learning_rate'");
  CHECK_FALSE(contains(far, "did you mean"));
  const std::string other = parse_error(
      {{"train_batch_size", 8}, {"scheduler", {{"type", "WarmupLR"}, {"params", {{"cos_min_ratio", 0.1}}}}}});
  CHECK_MESSAGE_HAS(other, "unknown key 'scheduler.params.cos_min_ratio'");
  // Misspelt values get the same help.
  CHECK_MESSAGE_HAS(
      parse_error({{"train_batch_size", 8}, {"scheduler", {{"type", "WarmUpLR"}, {"params", json::object()}}}}),
      "did you mean \"WarmupLR\"");
  // Keys DeepSpeed removed are named as such.
  CHECK_MESSAGE_HAS(parse_error({{"train_batch_size", 8}, {"elasticity", {{"enabled", true}}}}),
                    "'elasticity' was removed from DeepSpeed");
  CHECK_MESSAGE_HAS(
      parse_error({{"train_batch_size", 8}, {"zero_optimization", {{"stage", 3}, {"mics_shard_size", 8}}}}),
      "'zero_optimization.mics_shard_size' was removed");
}

TEST_CASE("ds_config: wrong types and values name the key and what was expected") {
  const json base = {{"train_batch_size", 8}};
  auto with = [&](const char* key, json value) {
    json j = base;
    j[key] = std::move(value);
    return parse_error(j);
  };
  CHECK_MESSAGE_HAS(with("train_micro_batch_size_per_gpu", "8"),
                    "train_micro_batch_size_per_gpu: expected a positive integer, got \"8\" (a string)");
  CHECK_MESSAGE_HAS(with("train_batch_size", 8.5), "train_batch_size: expected a positive integer, got 8.5");
  CHECK_MESSAGE_HAS(with("train_batch_size", -8), "train_batch_size: expected a positive integer, got -8");
  CHECK_MESSAGE_HAS(with("train_batch_size", true), "got true (a boolean)");
  CHECK_MESSAGE_HAS(with("train_batch_size", "auto"), "Hugging Face");
  CHECK_MESSAGE_HAS(with("fp16", {{"enabled", "auto"}}), "fp16.enabled: expected true or false, got \"auto\"");
  CHECK_MESSAGE_HAS(with("fp16", true), "fp16: expected an object, got true");
  CHECK_MESSAGE_HAS(with("zero_optimization", {{"stage", 5}}), "zero_optimization.stage: expected 0, 1, 2 or 3, got 5");
  CHECK_MESSAGE_HAS(with("zero_optimization", {{"reduce_bucket_size", -1}}),
                    "zero_optimization.reduce_bucket_size: expected an integer >= 1");
  CHECK_MESSAGE_HAS(with("zero_optimization", {{"allgather_bucket_size", 5.5e0}}),
                    "zero_optimization.allgather_bucket_size");
  CHECK_MESSAGE_HAS(
      with("zero_optimization", {{"stage", 3}, {"prefetch_bucket_size", 1}, {"stage3_prefetch_bucket_size", 2}}),
      "are one setting");
  CHECK_MESSAGE_HAS(with("gradient_clipping", "1.0"), "gradient_clipping: expected a number >= 0");
  CHECK_MESSAGE_HAS(with("trident", {{"recompute", "partial"}}), "trident.recompute: 'partial'; expected \"none\", \"selective\" or \"full\"");
  CHECK(parse_config(json{{"train_batch_size", 8}, {"trident", {{"recompute", "selective"}}}}, 1).trident.recompute == "selective");
  CHECK_MESSAGE_HAS(with("trident", {{"attention", "fused"}}),
                    "trident.attention: 'fused'; expected \"auto\", \"standard\", \"flash\" or \"flash_bf16\"");
  CHECK(parse_config(json{{"train_batch_size", 8}, {"trident", {{"attention", "flash"}}}}, 1).trident.attention == "flash");
  CHECK(parse_config(json{{"train_batch_size", 8}, {"trident", {{"attention", "flash_bf16"}}}}, 1).trident.attention == "flash_bf16");
  CHECK(parse_config(json{{"train_batch_size", 8}}, 1).trident.attention == "auto");
  {  // what auto (and each explicit choice) gives a run
    using flagship::resolve_attention;
    const auto is = [](flagship::attention_choice c, bool flash, bool bf16) { return c.flash == flash && c.bf16 == bf16; };
    CHECK(is(resolve_attention("auto", "nccl", "bf16", 768, 12), true, true));  // GPT-2 124M on the GPU in bf16
    CHECK(is(resolve_attention("auto", "nccl", "bf16", 64, 2), true, true));    // head_dim 32
    CHECK(is(resolve_attention("auto", "nccl", "fp32", 768, 12), false, false));
    CHECK(is(resolve_attention("auto", "nccl", "bf16", 96, 2), false, false));  // head_dim 48: no tiles for it
    CHECK(is(resolve_attention("auto", "local", "bf16", 768, 12), false, false));
    CHECK(is(resolve_attention("auto", "mpi", "bf16", 768, 12), false, false));
    CHECK(is(resolve_attention("standard", "nccl", "bf16", 768, 12), false, false));
    CHECK(is(resolve_attention("flash", "nccl", "fp32", 768, 12), true, false));
    CHECK(is(resolve_attention("flash_bf16", "nccl", "fp32", 768, 12), true, true));
    CHECK_THROWS_WITH_AS(resolve_attention("flash", "local", "fp32", 768, 12),
                         doctest::Contains("attention flash is the GPU path's (--backend nccl); the local backend runs the standard"),
                         trident::usage_error);
    CHECK_THROWS_WITH_AS(resolve_attention("fused", "nccl", "bf16", 768, 12),
                         doctest::Contains("attention fused; expected auto, standard, flash or flash_bf16"), trident::usage_error);
  }
  CHECK_MESSAGE_HAS(with("optimizer", {{"type", "Lamb"}}), "optimizer.type: trident supports \"Adam\" and \"AdamW\"");
  CHECK_MESSAGE_HAS(with("optimizer", {{"type", "OneBitAdam"}, {"params", {{"lr", 1e-3}}}}), "got \"OneBitAdam\"");
  CHECK_MESSAGE_HAS(with("optimizer", {{"type", "Adam"}, {"params", {{"betas", {0.9}}}}}),
                    "optimizer.params.betas: expected two numbers");
  CHECK_MESSAGE_HAS(with("optimizer", {{"type", "Adam"}, {"params", {{"betas", {0.9, 1.5}}}}}),
                    "optimizer.params.betas[1]: expected a number in [0, 1)");
  CHECK_MESSAGE_HAS(with("optimizer", {{"type", "Adam"}, {"params", {{"amsgrad", true}}}}),
                    "optimizer.params.amsgrad: expected false");
  CHECK_MESSAGE_HAS(with("optimizer", {{"type", "Adam"}, {"params", {{"lr", -1}}}}),
                    "optimizer.params.lr: expected a number >= 0");
  CHECK_MESSAGE_HAS(with("scheduler", {{"type", "OneCycle"}, {"params", json::object()}}),
                    "trident supports \"WarmupLR\", \"WarmupDecayLR\" and \"WarmupCosineLR\"");
  CHECK_MESSAGE_HAS(with("scheduler", {{"type", "WarmupLR"}}), "scheduler.params: expected an object");
  CHECK_MESSAGE_HAS(with("scheduler", {{"type", "WarmupDecayLR"}, {"params", json::object()}}),
                    "scheduler.params.total_num_steps: required by WarmupDecayLR");
  CHECK_MESSAGE_HAS(with("scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 100.0}}}}),
                    "scheduler.params.warmup_num_steps: expected a positive integer");
  CHECK_MESSAGE_HAS(with("scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_type", "cosine"}}}}),
                    "scheduler.params.warmup_type: expected \"log\" or \"linear\"");
  CHECK_MESSAGE_HAS(with("gradient_allreduce_op", "sum"), "gradient_allreduce_op: expected \"mean\"");
  CHECK_MESSAGE_HAS(with("sequence_parallel_size", 2), "sequence_parallel_size: expected 1");
  CHECK_MESSAGE_HAS(with("trident", {{"tensor_parallel", 0}}),
                    "trident.tensor_parallel: expected an integer >= 1, got 0");
  CHECK_MESSAGE_HAS(with("trident", {{"model", {{"heads", "4"}}}}),
                    "trident.model.heads: expected an integer >= 1, got \"4\"");
  CHECK_MESSAGE_HAS(with("trident", {{"train_data", 3}}), "trident.train_data: expected a string");
  CHECK_MESSAGE_HAS(parse_error({{"train_batch_size", 8}, {"bf16", json::object()}, {"bfloat16", json::object()}}),
                    "'bf16' and 'bfloat16'");
  CHECK(parse_config({{"train_batch_size", 8}, {"bfloat16", {{"enabled", true}}}}, 1).precision ==
        precision_kind::bf16);
  CHECK_MESSAGE_HAS(parse_error(json::array()), "expected a JSON object");
  CHECK_MESSAGE_HAS(parse_error(base, 0), "expected a world size of at least 1");
  CHECK_MESSAGE_HAS(
      parse_error({{"train_batch_size", 8}, {"fp16", {{"enabled", true}}}, {"bf16", {{"enabled", true}}}}),
      "fp16.enabled and bf16.enabled are both true");
  // Integral numbers written as floats are integers, as in DeepSpeed.
  const auto c =
      parse_config({{"train_batch_size", 8.0}, {"zero_optimization", {{"stage", 2}, {"reduce_bucket_size", 5e8}}}}, 2);
  CHECK(c.micro_batch == 4);
  CHECK(c.zero.reduce_bucket_size == 500'000'000);
}

TEST_CASE("ds_config: batch-size errors say which rule failed") {
  CHECK_MESSAGE_HAS(
      parse_error({{"train_batch_size", 32}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", 2}},
                  2),
      "train_batch_size 32 must equal train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x data-parallel "
      "size 2 = 16");
  CHECK_MESSAGE_HAS(parse_error({{"train_batch_size", 30}, {"train_micro_batch_size_per_gpu", 4}}, 2),
                    "must be a positive multiple of train_micro_batch_size_per_gpu 4 x data-parallel size 2 = 8");
  CHECK_MESSAGE_HAS(parse_error({{"train_batch_size", 8}}, 3),
                    "must be a positive multiple of the data-parallel size 3");
  CHECK_MESSAGE_HAS(parse_error({{"gradient_accumulation_steps", 4}}, 1),
                    "expected train_batch_size or train_micro_batch_size_per_gpu");
  CHECK_MESSAGE_HAS(parse_error({{"train_micro_batch_size_per_gpu", 1 << 30}, {"gradient_accumulation_steps", 4}}, 1),
                    "train_batch_size 4294967296 (micro x gas x data-parallel size) does not fit an int");
  // The data-parallel size is the world over tensor x pipeline.
  const auto c =
      parse_config({{"train_batch_size", 16}, {"trident", {{"tensor_parallel", 2}, {"pipeline_parallel", 2}}}}, 8);
  CHECK(c.data_parallel == 2);
  CHECK(c.micro_batch == 8);
  CHECK_MESSAGE_HAS(
      parse_error({{"train_batch_size", 16}, {"trident", {{"tensor_parallel", 4}}}}, 6),
      "world size 6 is not a multiple of trident.tensor_parallel (t = 4) x trident.pipeline_parallel (p = 1)");
}

TEST_CASE("ds_config: DeepSpeed keys trident does not use are listed, sorted, with their dotted paths") {
  const json j = {{"train_batch_size", 8},
                  {"wall_clock_breakdown", false},
                  {"steps_per_print", 10},
                  {"tensorboard", {{"enabled", true}}},
                  {"fp16", {{"enabled", true}, {"auto_cast", false}}},
                  {"zero_optimization",
                   {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}, {"round_robin_gradients", true}}},
                  {"optimizer", {{"type", "AdamW"}, {"legacy_fusion", false}, {"params", {{"foreach", true}}}}},
                  {"allgather_size", 100}};
  const auto c = parse_config(j, 1);
  CHECK(sorted(c.ignored) == c.ignored);
  CHECK(c.ignored == std::vector<std::string>{"allgather_size", "fp16.auto_cast", "optimizer.legacy_fusion",
                                              "optimizer.params.foreach", "steps_per_print", "tensorboard",
                                              "wall_clock_breakdown", "zero_optimization.offload_optimizer",
                                              "zero_optimization.round_robin_gradients"});
  // With the old boolean zero_optimization, allgather_size is read, not ignored.
  const auto old = parse_config({{"train_batch_size", 8}, {"zero_optimization", true}, {"allgather_size", 1000}}, 1);
  CHECK(old.ignored.empty());
  CHECK(old.zero.allgather_bucket_size == 1000);
  CHECK(parse_config({{"train_batch_size", 8}}, 1).ignored.empty());
}

TEST_CASE("ds_config: defaults") {
  const auto c = parse_config({{"train_batch_size", 8}}, 1);
  CHECK(c.precision == precision_kind::fp32);
  CHECK(c.gradient_clipping == 1.0f);  // DeepSpeed's default, not "off"
  CHECK(c.zero.stage == 0);
  CHECK_FALSE(c.zero.overlap_comm);
  // No optimizer section: trident's own optimizer, torch.optim.AdamW's defaults.
  CHECK(c.optimizer.type == "adamw");
  CHECK(c.optimizer.decoupled_weight_decay);
  CHECK(c.optimizer.weight_decay == 0.01f);
  // With a section, FusedAdam's: weight_decay 0.
  const auto a = parse_config({{"train_batch_size", 8}, {"optimizer", {{"type", "AdamW"}}}}, 1);
  CHECK(a.optimizer.weight_decay == 0.0f);
  CHECK(c.scheduler.type.empty());
  CHECK(c.trident.schedule == "1f1b");
  CHECK(c.trident.model.vocab_size == 256);
}

TEST_CASE("ds_config: check_layout") {
  auto layout = [](int t, int p, int v, const char* schedule, flagship::model_config m) {
    train_config c;
    c.trident.tensor_parallel = t;
    c.trident.pipeline_parallel = p;
    c.trident.virtual_stages = v;
    c.trident.schedule = schedule;
    c.trident.model = m;
    return c;
  };
  const flagship::model_config m{256, 64, 64, 4, 4, 0};
  CHECK_NOTHROW(flagship::check_layout(layout(2, 2, 1, "1f1b", m), 8));
  CHECK_NOTHROW(flagship::check_layout(layout(1, 2, 2, "interleaved", m), 2));
  auto error = [&](const train_config& c, int world) { return error_of([&] { flagship::check_layout(c, world); }); };
  const std::string w = error(layout(2, 2, 1, "1f1b", m), 6);
  CHECK_MESSAGE_HAS(w, "world size 6");
  CHECK_MESSAGE_HAS(w, "t = 2");
  CHECK_MESSAGE_HAS(w, "p = 2");
  CHECK_MESSAGE_HAS(w, "expected world size = d*t*p");
  CHECK_MESSAGE_HAS(error(layout(8, 1, 1, "1f1b", {256, 64, 64, 4, 4, 0}), 8),
                    "trident.model.heads 4 is not divisible by trident.tensor_parallel 8");
  CHECK_MESSAGE_HAS(error(layout(1, 1, 1, "1f1b", {256, 64, 66, 4, 4, 0}), 1),
                    "trident.model.hidden 66 is not divisible by trident.model.heads 4");
  CHECK_MESSAGE_HAS(error(layout(1, 3, 1, "1f1b", m), 3),
                    "trident.model.layers 4 is not divisible by trident.pipeline_parallel 3");
  CHECK_MESSAGE_HAS(error(layout(1, 2, 4, "interleaved", m), 2), "x trident.virtual_stages 4 = 8");
  const std::string s = error(layout(1, 1, 1, "1F1B-interleaved", m), 1);
  CHECK_MESSAGE_HAS(s, "expected one of gpipe, 1f1b, interleaved, zb-h1, zb-h2");
  CHECK_MESSAGE_HAS(error(layout(1, 1, 1, "zb-h3", m), 1), "did you mean \"zb-h1\"");
  CHECK_MESSAGE_HAS(error(layout(1, 2, 2, "1f1b", m), 2),
                    "trident.virtual_stages 2 needs trident.schedule \"interleaved\"");
  const std::string vocab = error(layout(4, 1, 1, "1f1b", {50257, 64, 64, 4, 4, 0}), 4);
  CHECK_MESSAGE_HAS(vocab, "trident.model.vocab_size 50257 is not divisible by trident.tensor_parallel 4");
  CHECK_MESSAGE_HAS(vocab, "pad the vocabulary to 50260");
  CHECK_MESSAGE_HAS(error(layout(2, 1, 1, "1f1b", {256, 64, 64, 4, 4, 129}), 2), "trident.model.ffn 129");
  // A config built by hand, not parsed: zero sizes are errors, not divisions by zero.
  CHECK_MESSAGE_HAS(error(layout(1, 1, 1, "1f1b", {256, 64, 64, 0, 4, 0}), 1),
                    "trident.model.heads: expected an integer >= 1");
  CHECK_MESSAGE_HAS(error(layout(0, 1, 1, "1f1b", m), 1),
                    "trident.tensor_parallel and trident.pipeline_parallel must be >= 1");
  auto sp = layout(2, 1, 1, "1f1b", {256, 63, 64, 4, 4, 0});
  CHECK_NOTHROW(flagship::check_layout(sp, 2));
  sp.trident.sequence_parallel = true;
  CHECK_MESSAGE_HAS(error(sp, 2), "trident.model.seq_len 63");
}

TEST_CASE("ds_config: load_config reads comments, refuses duplicate keys and bad JSON") {
  const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
  const auto dir = std::filesystem::temp_directory_path() / ("trident_ds_config_" + std::to_string(stamp));
  std::filesystem::create_directories(dir);
  auto write = [&](const char* name, const char* text) {
    const auto path = (dir / name).string();
    std::ofstream(path) << text;
    return path;
  };
  const auto commented =
      write("commented.json", "{\n  // the global batch\n  \"train_batch_size\": 8 /* samples */\n}\n");
  CHECK(flagship::load_config(commented, 2).micro_batch == 4);
  const auto twice = write("twice.json", R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "stage": 2}})");
  CHECK_MESSAGE_HAS(error_of([&] { (void)flagship::load_config(twice, 1); }),
                    "key 'zero_optimization.stage' appears twice");
  const auto top_twice = write("top_twice.json", R"({"train_batch_size": 8, "train_batch_size": 16})");
  CHECK_MESSAGE_HAS(error_of([&] { (void)flagship::load_config(top_twice, 1); }),
                    "key 'train_batch_size' appears twice");
  const auto broken = write("broken.json", R"({"train_batch_size": 8,})");
  CHECK_MESSAGE_HAS(error_of([&] { (void)flagship::load_config(broken, 1); }), "is not valid JSON");
  CHECK_MESSAGE_HAS(error_of([&] { (void)flagship::load_config((dir / "missing.json").string(), 1); }),
                    "cannot open config file");
  // 200000 nested arrays once overflowed the stack while the error message printed the value.
  const std::string deep = R"({"train_batch_size": )" + std::string(200000, '[') + std::string(200000, ']') + "}";
  CHECK_MESSAGE_HAS(error_of([&] { (void)flagship::load_config(write("deep.json", deep.c_str()), 1); }),
                    "values nested more than 64 deep");
  // 60 levels are parsed (and then refused for what they are, not for their depth)
  const std::string sixty = R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"betas": )" +
                            std::string(60, '[') + std::string(60, ']') + "}}}";
  const auto m = error_of([&] { (void)flagship::load_config(write("sixty.json", sixty.c_str()), 1); });
  CHECK_MESSAGE_HAS(m, "optimizer.params.betas");
  CHECK(m.find("nested") == std::string::npos);
  std::filesystem::remove_all(dir);
}
