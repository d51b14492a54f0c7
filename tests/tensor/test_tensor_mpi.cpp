// Tensor parallelism over MPI (mpirun -np 4): the same bodies as on thread ranks, with t = 4
// (the world) and t = 2 (the tensor axis of a grid with d = 2).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "support/mpi_main.hpp"
#include "tensor/tensor_suite.hpp"
#include "tensor/zero_suite.hpp"
#include "trident/comm/mpi.hpp"
#include "trident/comm/process_grid.hpp"

TEST_CASE("tensor regions over MPI") { tensor_suite::regions(test_support::mpi_world()); }

TEST_CASE("tensor-parallel MLP = the unsharded MLP over MPI (t = world, and t = 2 on a grid)") {
  auto& world = test_support::mpi_world();
  tensor_suite::mlp_equals_serial(world, 7);
  trident::process_grid grid(world, 2, 1);
  tensor_suite::mlp_equals_serial(grid.tensor(), 100 + static_cast<std::uint64_t>(grid.coordinate(trident::grid_axis::data)));
}

TEST_CASE("vocabulary-parallel embedding and cross-entropy over MPI") {
  tensor_suite::vocab_equals_serial(test_support::mpi_world(), 21);
}

TEST_CASE("tensor-parallel transformer block = the unsharded block over MPI (t = 4, and t = 2 on a grid)") {
  auto& world = test_support::mpi_world();
  tensor_suite::block_equals_serial(world, 300);
  trident::process_grid grid(world, 2, 1);
  tensor_suite::block_equals_serial(grid.tensor(), 400 + static_cast<std::uint64_t>(grid.coordinate(trident::grid_axis::data)));
  tensor_suite::block_equals_serial(world, 500, true);
  tensor_suite::activation_bytes(world, false);
  tensor_suite::activation_bytes(world, true);
  tensor_suite::recompute_equals_plain(world, false);
  tensor_suite::recompute_equals_plain(world, true);
  tensor_suite::block_traffic(world, false);
  tensor_suite::block_traffic(world, true);
  tensor_suite::block_bad_shapes(world);
}

TEST_CASE("two tensor-parallel blocks with ZeRO-1 and ZeRO-3 on a (t = 2, d = 2) MPI grid, clipping on = one rank") {
  tensor_zero_suite::zero_equals_serial<1>(test_support::mpi_world(), 2);
  tensor_zero_suite::zero_equals_serial<3>(test_support::mpi_world(), 2);
}

TEST_CASE("ZeRO with a model-parallel group that is not the grid's tensor axis is a usage error (MPI)") {
  tensor_zero_suite::wrong_model_group(test_support::mpi_world());
}

TEST_CASE("tensor-parallel layers: bad shapes over MPI") { tensor_suite::bad_shapes(test_support::mpi_world()); }

int main(int argc, char** argv) { return test_support::mpi_doctest_main(argc, argv); }
