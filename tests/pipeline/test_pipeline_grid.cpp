// 3-D parallelism on 8 thread ranks: a (d = 2, t = 2, p = 2) grid trains four transformer
// blocks (two per stage, tensor-parallel, ZeRO-1 or ZeRO-2 on the data axis) to the parameters
// of one rank training them alone on the same 2 x m micro-batches, within 1e-5, for 10 steps.
#include <doctest/doctest.h>

#include "pipeline/grid_suite.hpp"
#include "trident/comm/local.hpp"

using trident::local_comm;
using trident::local_world;
namespace pp = trident::pipeline;

TEST_CASE("3-D: (d, t, p) = (2, 2, 2) with ZeRO-1 and 1F1B = one rank (threads, 10 steps)") {
  local_world::run(8, [](local_comm& world) { grid_suite::equals_serial<1>(world, 2, 2, 4, 4, 10, pp::one_f_one_b); });
}

TEST_CASE("3-D: (d, t, p) = (2, 2, 2) with ZeRO-2 and GPipe = one rank (threads, 10 steps)") {
  local_world::run(8, [](local_comm& world) { grid_suite::equals_serial<2>(world, 2, 2, 4, 3, 10, pp::gpipe); });
}

TEST_CASE("3-D: (d, t, p) = (2, 2, 2) with ZeRO-3 (and plain data parallelism) and 1F1B = one rank (threads, 10 steps)") {
  local_world::run(8, [](local_comm& world) { grid_suite::equals_serial<3>(world, 2, 2, 4, 4, 10, pp::one_f_one_b); });
  local_world::run(8, [](local_comm& world) { grid_suite::equals_serial<0>(world, 2, 2, 4, 2, 10, pp::one_f_one_b); });
}
