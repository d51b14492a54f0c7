// The pipeline executor over MPI (mpirun -np 4): the same bodies as on thread ranks, with
// p = 4 (the world), p = 2 (two pipelines side by side) and p = 3 (ranks 0-2; rank 3 runs
// alone, p = 1).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "pipeline/pipeline_suite.hpp"
#include "support/mpi_main.hpp"
#include "trident/comm/mpi.hpp"

TEST_CASE("pipeline executor over MPI: every schedule = gradient accumulation on one rank (p = 4, 2, 3; m = 1..8)") {
  auto& world = test_support::mpi_world();
  REQUIRE(world.size() == 4);
  pipeline_suite::all_schedules_equal_serial(world);
  auto pairs = world.split(world.rank() / 2, world.rank());
  pipeline_suite::all_schedules_equal_serial(pairs);
  auto three = world.split(world.rank() < 3 ? 0 : 1, world.rank());
  pipeline_suite::all_schedules_equal_serial(three);
}

TEST_CASE("pipeline executor over MPI: peak activation bytes as the schedules' papers state (p = 4)") {
  for (int m : {1, 3, 8}) pipeline_suite::activation_memory(test_support::mpi_world(), m);
}

int main(int argc, char** argv) { return test_support::mpi_doctest_main(argc, argv); }
