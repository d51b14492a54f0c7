// Tensor parallelism on thread ranks: the conjugate operators, and column- and row-parallel
// layers (an MLP) equal to the unsharded ones for t = 1, 2, 3, 4 and on a (t = 2, d = 2) grid.
#include <doctest/doctest.h>

#include "tensor/tensor_suite.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/process_grid.hpp"

using trident::local_comm;
using trident::local_world;

TEST_CASE("tensor regions: f, g and the sequence-parallel pair, forward and backward (threads, t = 1..4)") {
  for (int t = 1; t <= 4; ++t) local_world::run(t, [](local_comm& tp) { tensor_suite::regions(tp); });
}

TEST_CASE("tensor-parallel MLP = the unsharded MLP (threads, t = 1, 2, 3, 4)") {
  for (int t = 1; t <= 4; ++t) local_world::run(t, [](local_comm& tp) { tensor_suite::mlp_equals_serial(tp, 7); });
}

TEST_CASE("tensor-parallel MLP on the tensor axis of a (t = 2, d = 2) grid: each data group equals its own serial run") {
  local_world::run(4, [](local_comm& world) {
    trident::process_grid grid(world, 2, 1);
    tensor_suite::mlp_equals_serial(grid.tensor(), 100 + static_cast<std::uint64_t>(grid.coordinate(trident::grid_axis::data)));
  });
}

TEST_CASE("tensor-parallel layers: shapes that do not fit the group are usage errors naming the sizes (threads)") {
  for (int t = 1; t <= 4; ++t) local_world::run(t, [](local_comm& tp) { tensor_suite::bad_shapes(tp); });
}

TEST_CASE("vocabulary-parallel embedding and cross-entropy = the unsharded ones (threads, t = 1..4)") {
  for (int t = 1; t <= 4; ++t) local_world::run(t, [](local_comm& tp) { tensor_suite::vocab_equals_serial(tp, 21); });
}
