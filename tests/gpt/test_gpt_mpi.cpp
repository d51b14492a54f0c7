// The flagship GPT over MPI (mpirun -np 4): a (d, t, p) = (2, 2, 1) grid and a (1, 2, 2) grid
// train to one rank's losses and norms, ZeRO 1 and 3.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "gpt/gpt_suite.hpp"
#include "support/mpi_main.hpp"
#include "trident/comm/mpi.hpp"

TEST_CASE("gpt over MPI: (2, 2, 1) and (1, 2, 2) grids train to one rank's losses and norms (fp32, 20 steps)") {
  auto& world = test_support::mpi_world();
  REQUIRE(world.size() == 4);
  for (int stage : {1, 3}) {
    auto o = gpt_suite::small_options();
    o.tensor = 2;
    o.zero_stage = stage;
    gpt_suite::equals_serial(world, o);
    o.pipeline = 2;
    gpt_suite::equals_serial(world, o);
  }
}

int main(int argc, char** argv) { return test_support::mpi_doctest_main(argc, argv); }
