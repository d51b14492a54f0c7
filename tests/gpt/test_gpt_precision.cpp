// The flagship GPT in bf16 and fp16 (fp32 master weights, half working weights and gradients)
// on thread ranks: a grid follows one rank's run within the half type's rounding, both follow
// the fp32 run, and fp16's dynamic loss scale skips the steps that overflow and backs off as
// DeepSpeed's does, on every rank alike.
#include <doctest/doctest.h>

#include <cmath>

#include "gpt/gpt_suite.hpp"
#include "trident/comm/local.hpp"

using trident::local_comm;
using trident::local_world;

namespace {

template <class Precision>
std::vector<flagship::step_report> on(int ranks, const flagship::train_options& o) {
  std::vector<flagship::step_report> out;
  local_world::run(ranks, [&](local_comm& world) {
    auto r = flagship::train<Precision>(world, o);
    if (world.rank() == 0) out = std::move(r);
  });
  return out;
}

flagship::train_options serial_of(flagship::train_options o, int d) {
  o.tensor = o.pipeline = 1;
  o.zero_stage = 0;
  o.accumulation *= d;
  return o;
}

}  // namespace

TEST_CASE("gpt: bf16 on a (2, 2, 2) grid follows one rank's bf16 run and the fp32 run (threads, 20 steps)") {
  auto o = gpt_suite::small_options();
  o.tensor = 2;
  o.pipeline = 2;
  o.zero_stage = 2;
  const auto grid = on<trident::mixed_precision<trident::bf16>>(8, o);
  const auto serial = on<trident::mixed_precision<trident::bf16>>(1, serial_of(o, 2));
  const auto fp32 = on<trident::full_precision>(1, serial_of(o, 2));
  REQUIRE(grid.size() == 20);
  double worst_grid = 0, worst_fp32 = 0, differs = 0;
  for (std::size_t s = 0; s < grid.size(); ++s) {
    worst_grid = std::max(worst_grid, gpt_suite::relative(grid[s].loss, serial[s].loss));
    worst_fp32 = std::max(worst_fp32, gpt_suite::relative(serial[s].loss, fp32[s].loss));
    differs = std::max(differs, std::abs(serial[s].loss - fp32[s].loss));
    CHECK(grid[s].applied);
  }
  CHECK(worst_grid <= 1e-2);  // the sums' orders differ, each rounded to bf16's 8 bits
  CHECK(worst_fp32 <= 3e-2);
  CHECK(differs > 0);  // the weights really were bf16
  CHECK(grid.back().loss < grid.front().loss - 0.5);
}

TEST_CASE("gpt: fp16 with DeepSpeed's dynamic loss scale skips overflowing steps and backs off, on a grid as on one rank") {
  auto o = gpt_suite::small_options();
  o.tensor = 2;
  o.pipeline = 2;
  o.zero_stage = 1;
  o.dynamic_scaler.initial_scale = std::ldexp(1.0, 20);  // too large: the first steps overflow
  o.dynamic_scaler.hysteresis = 2;
  const auto grid = on<trident::mixed_precision<trident::fp16>>(4, o);
  const auto serial = on<trident::mixed_precision<trident::fp16>>(1, serial_of(o, 1));
  REQUIRE(grid.size() == 20);
  int skipped = 0;
  for (std::size_t s = 0; s < grid.size(); ++s) {
    INFO("step ", s + 1, ": scale ", grid[s].loss_scale);
    CHECK(grid[s].applied == serial[s].applied);  // the same verdicts and scales everywhere
    CHECK(grid[s].loss_scale == serial[s].loss_scale);
    CHECK(gpt_suite::relative(grid[s].loss, serial[s].loss) <= 2e-3);
    skipped += !grid[s].applied;
  }
  CHECK(!grid[0].applied);
  CHECK(skipped >= 2);
  // Hysteresis 2: the first overflow keeps the scale, each later one halves it, until steps apply.
  CHECK(grid[1].loss_scale == grid[0].loss_scale);
  CHECK(grid[2].loss_scale == grid[1].loss_scale / 2);
  CHECK(grid.back().applied);
  CHECK(grid.back().loss_scale < std::ldexp(1.0, 20));
  CHECK(grid.back().loss < grid.front().loss - 0.5);
}
