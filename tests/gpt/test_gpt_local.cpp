// The flagship GPT on thread ranks: loss curves and gradient norms of every grid in
// {(1,1,1), (2,1,1), (1,2,1), (1,1,2), (2,2,2)} x ZeRO {0, 1, 2, 3} equal one rank's over 20 steps
// (fp32, within 1e-5), and so do sequence parallelism and interleaved virtual stages.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "gpt/gpt_suite.hpp"
#include "trident/comm/local.hpp"

using trident::local_comm;
using trident::local_world;

TEST_CASE("gpt: every grid x ZeRO stage trains to one rank's losses and norms (threads, fp32, 20 steps)") {
  struct grid {
    int d, t, p;
  };
  for (const grid g : std::array<grid, 5>{{{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 2}}})
    for (int stage = 0; stage <= 3; ++stage) {
      auto o = gpt_suite::small_options();
      o.tensor = g.t;
      o.pipeline = g.p;
      o.zero_stage = stage;
      local_world::run(g.d * g.t * g.p, [&](local_comm& world) { gpt_suite::equals_serial(world, o); });
    }
}

TEST_CASE("gpt: sequence parallelism, GPipe and interleaved virtual stages train to one rank's losses (threads)") {
  auto o = gpt_suite::small_options();
  o.tensor = 2;
  o.pipeline = 2;
  o.model.sequence_parallel = true;
  o.zero_stage = 2;
  local_world::run(4, [&](local_comm& world) { gpt_suite::equals_serial(world, o); });
  o.model.sequence_parallel = false;
  o.schedule = "gpipe";
  o.zero_stage = 3;
  local_world::run(8, [&](local_comm& world) { gpt_suite::equals_serial(world, o); });
  o.schedule = "interleaved";
  o.virtual_stages = 2;
  o.accumulation = 4;
  o.zero_stage = 1;
  local_world::run(4, [&](local_comm& world) { gpt_suite::equals_serial(world, o); });
}

TEST_CASE("gpt: with flash attention's tiles emulated on the host (TF32 and bf16), a (1, 2, 2) grid trains to one rank's "
          "losses with the same tiles (threads, sequence parallelism, ZeRO-3)") {
  auto o = gpt_suite::small_options();
  o.model.hidden = 64;  // head_dim 32: one head per rank at t = 2
  o.model.heads = 2;
  o.model.ffn = 64;
  o.model.flash_attention = true;
  o.model.sequence_parallel = true;
  o.tensor = 2;
  o.pipeline = 2;
  o.zero_stage = 3;
  // A gentler learning rate than the fp32 grids' 1e-2. The tiles round their operands (TF32:
  // 2^-11, bf16: 2^-9), so the grid's last-bit differences from the serial run (its GEMMs sum in
  // another order) now and then move an operand across a rounding boundary; at 1e-2, with the
  // gradient clipped on most steps, these snowball (TF32 4e-5 at step 2, the grad norm 1.0 apart
  // at step 17); at 1e-3 they stay near their size (TF32 7.6e-5, bf16 4.6e-4 over 20 steps).
  o.lr = [](std::int64_t step) { return 1e-3 * std::min<double>(1.0, static_cast<double>(step) / 5.0); };
  for (const bool bf16 : {false, true}) {
    o.model.flash_bf16 = bf16;
    local_world::run(4, [&](local_comm& world) {
      const gpt_suite::serial_and_grid<local_comm> runs(world, o);
      double worst = 0;
      for (std::size_t s = 0; s < runs.got.size(); ++s)
        worst = std::max({worst, gpt_suite::relative(runs.got[s].loss, runs.want[s].loss),
                          gpt_suite::relative(runs.got[s].grad_norm, runs.want[s].grad_norm)});
      INFO(std::string(bf16 ? "bf16" : "TF32"), " tiles: step 1 ", runs.got[0].loss, " vs ", runs.want[0].loss, ", over 20 steps ", worst);
      CHECK(gpt_suite::relative(runs.got[0].loss, runs.want[0].loss) <= 1e-6);  // the same weights
      CHECK(gpt_suite::relative(runs.got[0].grad_norm, runs.want[0].grad_norm) <= 1e-5);
      CHECK(worst <= (bf16 ? 2e-3 : 5e-4));
      CHECK(runs.want.back().loss < runs.want.front().loss - 0.1);  // it learns
      if (world.rank() == 0) MESSAGE(std::string(bf16 ? "bf16" : "TF32"), " tiles: grid from serial over 20 steps ", worst);
    });
  }
}

TEST_CASE("gpt: with bf16 GEMM operands emulated on the host (and the bf16 flash tiles), a (1, 2, 2) grid trains to one "
          "rank's losses with the same roundings (threads, sequence parallelism, ZeRO-3); and further from fp32 than that") {
  auto o = gpt_suite::small_options();
  o.model.hidden = 64;  // head_dim 32: the bf16 tiles, one head per rank at t = 2
  o.model.heads = 2;
  o.model.ffn = 64;
  o.model.flash_attention = true;
  o.model.flash_bf16 = true;
  o.model.sequence_parallel = true;
  o.tensor = 2;
  o.pipeline = 2;
  o.zero_stage = 3;
  o.lr = [](std::int64_t step) { return 1e-3 * std::min<double>(1.0, static_cast<double>(step) / 5.0); };  // as the flash case
  auto plain = o;
  plain.model.bf16_gemm = false;
  o.model.bf16_gemm = true;  // every GEMM: the blocks' linear layers and the head
  local_world::run(4, [&](local_comm& world) {
    const gpt_suite::serial_and_grid<local_comm> runs(world, o);
    const auto tiles_only = flagship::train(world, plain);
    double worst = 0, from_plain = 0;
    for (std::size_t s = 0; s < runs.got.size(); ++s) {
      worst = std::max({worst, gpt_suite::relative(runs.got[s].loss, runs.want[s].loss),
                        gpt_suite::relative(runs.got[s].grad_norm, runs.want[s].grad_norm)});
      from_plain = std::max(from_plain, gpt_suite::relative(runs.got[s].loss, tiles_only[s].loss));
    }
    const double first = gpt_suite::relative(runs.got[0].loss, runs.want[0].loss);
    const double first_norm = gpt_suite::relative(runs.got[0].grad_norm, runs.want[0].grad_norm);
    const double first_plain = gpt_suite::relative(runs.got[0].loss, tiles_only[0].loss);
    INFO("bf16 GEMMs: step 1 ", runs.got[0].loss, " vs ", runs.want[0].loss, " (", first, "; grad norm ", first_norm, "), over 20 "
         "steps ", worst, "; from the run without them: step 1 ", first_plain, ", 20 steps ", from_plain);
    CHECK(first <= 1e-6);  // the same weights, the same roundings
    CHECK(first_norm <= 1e-5);
    CHECK(first_plain > 100 * first);  // the GEMMs' rounding moved the forward, far more than the grid's sums did
    CHECK(worst <= 2e-3);
    CHECK(runs.want.back().loss < runs.want.front().loss - 0.1);  // it learns
    if (world.rank() == 0)
      MESSAGE("bf16 GEMMs: grid from serial: step 1 ", first, ", 20 steps ", worst, "; from fp32 GEMMs: step 1 ", first_plain,
              ", 20 steps ", from_plain);
  });
}

TEST_CASE("gpt: selective and full recomputation train bitwise as keeping every activation (threads, (2, 2, 2), with and "
          "without sequence parallelism)") {
  auto o = gpt_suite::small_options();
  o.tensor = 2;
  o.pipeline = 2;
  o.zero_stage = 1;
  o.steps = 8;
  for (const bool sp : {false, true}) {
    o.model.sequence_parallel = sp;
    o.model.recompute = flagship::recompute_mode::none;
    const auto kept = local_world::run(8, [&](local_comm& world) { return flagship::train(world, o); });
    for (const auto mode : {flagship::recompute_mode::selective, flagship::recompute_mode::full}) {
      o.model.recompute = mode;
      const auto again = local_world::run(8, [&](local_comm& world) { return flagship::train(world, o); });
      for (std::size_t r = 0; r < kept.size(); ++r)
        for (std::size_t s = 0; s < kept[r].size(); ++s) {
          INFO("recompute ", std::string(flagship::name_of(mode)), std::string(sp ? ", sequence parallel" : ""), ", rank ", r, ", step ", s + 1);
          CHECK(again[r][s].loss == kept[r][s].loss);  // bitwise
          CHECK(again[r][s].grad_norm == kept[r][s].grad_norm);
        }
    }
  }
}

TEST_CASE("gpt: a step's Chrome trace shows every rank's forward, backward, communication, ZeRO step and checkpoint save (threads)") {
  auto o = gpt_suite::small_options();
  o.tensor = 2;
  o.pipeline = 2;
  o.steps = 3;
  o.trace_step = 2;
  o.trace_file = (std::filesystem::temp_directory_path() / ("trident_gpt_trace_" + std::to_string(::getpid()) + ".json")).string();
  o.save_every = 2;  // the traced step saves a checkpoint: its span is in the trace
  o.checkpoint_dir = (std::filesystem::temp_directory_path() / ("trident_gpt_trace_ckpt_" + std::to_string(::getpid()))).string();
  local_world::run(8, [&](local_comm& world) { (void)flagship::train(world, o); });
  std::filesystem::remove_all(o.checkpoint_dir);
  std::ifstream f(o.trace_file);
  REQUIRE(f.good());
  const std::string json((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::filesystem::remove(o.trace_file);
  CHECK(json.starts_with("{\"displayTimeUnit\":\"ms\",\"traceEvents\":["));
  CHECK(json.ends_with("]}\n"));
  auto has = [&](int rank, const std::string& category, const std::string& name) {
    return json.find("\"tid\":" + std::to_string(rank) + ",\"cat\":\"" + category + "\",\"name\":\"" + name) != std::string::npos;
  };
  for (int r = 0; r < 8; ++r) {
    INFO("world rank ", r);
    const int stage = r / 4;  // Megatron order: tensor fastest, then data, then pipeline
    CHECK(json.find("\"tid\":" + std::to_string(r) + ",\"args\":{\"name\":\"rank " + std::to_string(r) + " (d ") != std::string::npos);
    CHECK(has(r, "step", "step 2"));
    CHECK(has(r, "forward", "F" + std::to_string(stage) + " mb 1"));
    CHECK(has(r, "backward", "B" + std::to_string(stage) + " mb 1"));
    CHECK(has(r, "comm", "all_reduce"));  // the tensor-parallel layers' g
    CHECK(has(r, "comm", "wait for stage messages"));
    CHECK(has(r, "optimizer", "ZeRO step"));
    CHECK(has(r, "checkpoint", "save (the copy to host memory)"));
    CHECK_FALSE(has(r, "step", "step 1"));  // one step only
  }
}

namespace {

// What train() throws on every rank of a 4-rank world (the first rank's message: they agree).
std::string failure(const flagship::train_options& o, int ranks = 4) {
  try {
    local_world::run(ranks, [&](local_comm& world) { (void)flagship::train(world, o); });
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

std::string bad_shard(const std::string& name, const std::function<void(std::vector<unsigned char>&)>& damage) {
  const auto good = gpt_suite::small_options().train_files[0];
  std::ifstream in(good, std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  damage(bytes);
  const auto path = (std::filesystem::temp_directory_path() / ("trident_gpt_" + name + "_" + std::to_string(::getpid()) + ".bin")).string();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

}  // namespace

TEST_CASE("gpt: bad input is an error that names what was expected, on every rank, never a crash or a hang") {
  auto o = gpt_suite::small_options();
  o.tensor = 2;
  o.pipeline = 2;
  o.steps = 2;
  {
    auto bad = o;
    bad.train_files = {bad_shard("magic", [](auto& b) { b[0] ^= 0xFF; })};
    const auto e = failure(bad);
    CHECK_MESSAGE(e.find("magic") != std::string::npos, e);
    std::filesystem::remove(bad.train_files[0]);
  }
  {
    auto bad = o;
    bad.train_files = {bad_shard("truncated", [](auto& b) { b.erase(b.end() - 7, b.end()); })};
    const auto e = failure(bad);
    CHECK_MESSAGE(e.find("tokens") != std::string::npos, e);
    std::filesystem::remove(bad.train_files[0]);
  }
  {
    auto bad = o;
    bad.train_files = {"/nonexistent/trident_shard.bin"};
    const auto e = failure(bad);
    CHECK_MESSAGE(e.find("/nonexistent/trident_shard.bin") != std::string::npos, e);
  }
  {
    auto bad = o;
    bad.model.heads = 3;
    bad.model.hidden = 12;
    const auto e = failure(bad);
    CHECK_MESSAGE(e.find("3 attention heads do not divide over a tensor-parallel group of 2") != std::string::npos, e);
  }
  {
    const auto e = failure(o, 6);
    CHECK_MESSAGE(e.find("a world of 6 ranks is not d x t x p for t = 2 and p = 2") != std::string::npos, e);
  }
  {
    auto bad = o;  // flash attention's tiles are for head_dim 32 or 64
    bad.model.flash_attention = true;
    const auto e = failure(bad);
    CHECK_MESSAGE(e.find("flash attention takes head_dim 32 or 64; hidden 16 over 4 heads is 4") != std::string::npos, e);
  }
  {
    auto bad = o;
    bad.schedule = "zigzag";
    const auto e = failure(bad);
    CHECK_MESSAGE(e.find("unknown pipeline schedule 'zigzag'; expected one of gpipe, 1f1b, interleaved") != std::string::npos, e);
  }
  {
    auto bad = o;
    bad.model.layers = 3;
    const auto e = failure(bad);
    CHECK_MESSAGE(e.find("3 layers do not divide into 2 pipeline stages") != std::string::npos, e);
  }
  {
    auto bad = o;
    bad.model.vocab = 31;
    const auto e = failure(bad);
    CHECK_MESSAGE(e.find("vocabulary of 31 tokens does not divide over a tensor-parallel group of 2") != std::string::npos, e);
  }
  {
    auto bad = o;  // tokens of the shard outside a smaller vocabulary
    bad.model.vocab = 16;
    const auto e = failure(bad);
    CHECK_MESSAGE(e.find("outside the vocabulary [0, 16)") != std::string::npos, e);
  }
  {
    auto bad = o;  // a validation shard of a larger vocabulary: named as such, on every rank
    bad.eval_every = 1;
    bad.val_files = {gpt_suite::synthetic_shard("val_vocab64", 4000, 64, 3)};
    const auto e = failure(bad);
    CHECK_MESSAGE(e.find("outside the vocabulary [0, 32)") != std::string::npos, e);
    CHECK_MESSAGE(e.find("validation batch") != std::string::npos, e);
  }
}
