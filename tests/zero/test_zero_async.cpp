// zero_optimizer::step_async on thread ranks: step()'s results bit for bit (stages 0-3, fp32 and
// bf16, AdamW and SGD with Nesterov momentum, clipping on), a non-finite gradient skipping the
// step everywhere, different collective orders named by last_step(), and what it refuses.
// The same bodies run over MPI (test_zero_mpi.cpp) and NCCL, captured in a CUDA graph
// (test_zero_graph_nccl.cu).
#include <doctest/doctest.h>

#include "trident/comm/local.hpp"
#include "zero/async_suite.hpp"

using trident::local_comm;
using trident::local_world;

namespace {

template <int Stage>
void stage_cases() {
  for (int n : {1, 2, 3}) {
    local_world::run(n, [&](local_comm& comm) {
      async_suite::same_as_step<Stage, trident::full_precision>(comm, async_suite::adamw(), 0.0);
      async_suite::same_as_step<Stage, trident::mixed_precision<trident::bf16>>(comm, async_suite::adamw(), 0.0);
      async_suite::skipped_everywhere<Stage, trident::mixed_precision<trident::bf16>>(comm, 0.0);
      async_suite::different_orders<Stage>(comm, 0.0);
    });
  }
  local_world::run(2, [&](local_comm& comm) {
    async_suite::same_as_step<Stage, trident::full_precision>(comm, async_suite::sgd(), 0.0);
  });
}

}  // namespace

TEST_CASE("zero.async: step_async = step(), bit for bit, stage 0") { stage_cases<0>(); }
TEST_CASE("zero.async: step_async = step(), bit for bit, stage 1") { stage_cases<1>(); }
TEST_CASE("zero.async: step_async = step(), bit for bit, stage 2") { stage_cases<2>(); }
TEST_CASE("zero.async: step_async = step(), bit for bit, stage 3") { stage_cases<3>(); }

TEST_CASE("zero.async: what decides on the host is refused by name") {
  local_world::run(2, [](local_comm& comm) { async_suite::refusals(comm); });
}
