// The flagship GPT on thread ranks: loss curves and gradient norms of every grid in
// {(1,1,1), (2,1,1), (1,2,1), (1,1,2), (2,2,2)} x ZeRO {0, 1, 2, 3} equal one rank's over 20 steps
// (fp32, within 1e-5), and so do sequence parallelism and interleaved virtual stages.
#include <doctest/doctest.h>

#include <array>

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
