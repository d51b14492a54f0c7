// ZeRO stages 0-3 over MPI (mpirun -np 4): the same MLP as the thread tests, compared with
// single-rank training on the global batch, which each process computes for itself on one
// thread rank; and the misuse suite (misuse_suite.hpp): bad input is the same usage_error on
// every rank, and the optimizer goes on.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "support/mpi_main.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/mpi.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"
#include "zero/async_suite.hpp"
#include "zero/misuse_suite.hpp"
#include "zero/zero_training.hpp"

namespace zero = trident::zero;
namespace optim = trident::optim;

namespace {

using zero_training::by_name;
using zero_training::relative_difference;

template <class Opt>
void check(Opt opt, const char* name) {
  const auto serial = trident::local_world::run(1, [&](trident::local_comm& c) { return by_name<0>(c, opt, 20); })[0];
  auto& comm = test_support::mpi_world();
  const auto s0 = by_name<0>(comm, opt, 20);
  const auto s1 = by_name<1>(comm, opt, 20);
  const auto s2 = by_name<2>(comm, opt, 20);
  const auto s3 = by_name<3>(comm, opt, 20);
  INFO(name, " on ", comm.size(), " MPI ranks");
  CHECK(relative_difference(s0, serial) <= 1e-5);
  CHECK(relative_difference(s1, serial) <= 1e-5);
  CHECK(relative_difference(s2, serial) <= 1e-5);
  CHECK(relative_difference(s3, serial) <= 1e-5);
}

}  // namespace

TEST_CASE("zero over MPI: stages 0-3 = one rank on the global batch (SGD momentum, AdamW)") {
  optim::sgd sgd;
  sgd.opt.lr = 0.05f;
  sgd.opt.momentum = 0.9f;
  check(sgd, "sgd");
  optim::adamw adamw;
  adamw.opt.lr = 3e-3f;
  check(adamw, "adamw");
}

TEST_CASE("zero over MPI: step_async = step(), bit for bit; skips, orders and refusals as on thread ranks") {
  auto& comm = test_support::mpi_world();
  async_suite::same_as_step<0, trident::full_precision>(comm, async_suite::adamw(), 0.0);
  async_suite::same_as_step<1, trident::mixed_precision<trident::bf16>>(comm, async_suite::adamw(), 0.0);
  async_suite::same_as_step<2, trident::full_precision>(comm, async_suite::sgd(), 0.0);
  async_suite::same_as_step<3, trident::full_precision>(comm, async_suite::adamw(), 0.0);
  async_suite::skipped_everywhere<2, trident::mixed_precision<trident::bf16>>(comm, 0.0);
  async_suite::different_orders<1>(comm, 0.0);
  async_suite::refusals(comm);
}

TEST_CASE("zero over MPI: misuse is the same usage_error on every rank, before anything is queued or applied") {
  auto& comm = test_support::mpi_world();
  misuse_suite::for_each_stage([&](auto stage) {
    constexpr int Stage = decltype(stage)::value;
    INFO("stage ", Stage, " on ", comm.size(), " MPI ranks");
    misuse_suite::grad_ready_twice<Stage>(comm);
    misuse_suite::grad_ready_twice_in_shared_bucket<Stage>(comm);
    misuse_suite::different_orders<Stage>(comm);
    for (bool old_span : {true, false}) misuse_suite::written_after_ready<Stage>(comm, true, old_span);
    if constexpr (Stage >= 2) misuse_suite::written_after_ready<Stage>(comm, false, false);
    misuse_suite::checked_mode_is_exact<Stage>(comm);
    misuse_suite::handles<Stage>(comm);
  });
  misuse_suite::stale_parameters_read_nan(comm);
}

// Stage 3 with prefetch, one rank in another order: an all-gather meets a reduce-scatter. MPI
// cannot tell without its argument check (undefined: garbage or a hang until the watchdog), so
// the check is on here; it refuses the pair at the start, on every rank, and the optimizer turns
// that into the order usage_error naming both buckets, and goes on.
TEST_CASE("zero over MPI: stage 3 with prefetch, ranks in different orders, argument check on: the usage_error naming both buckets") {
  auto& comm = test_support::mpi_world();
  struct restore {
    trident::mpi_comm& c;
    ~restore() { c.check_arguments(false); }
  } off{comm};
  comm.check_arguments(true);
  misuse_suite::different_orders<3>(comm, true);
}

TEST_CASE("zero over MPI: layers without tensors train like one rank on the global batch") {
  auto& comm = test_support::mpi_world();
  for (const auto& m : misuse_suite::empty_layer_models())
    for (bool skip_empty : {false, true}) {
      zero_training::toy::walk how;
      how.skip_empty = skip_empty;
      const auto options = misuse_suite::buckets_of(m.bucket_elements);
      const auto serial = trident::local_world::run(1, [&](trident::local_comm& c) {
        return zero_training::toy::train<0>(c, m.spec, misuse_suite::sgd(), options, 4, how);
      })[0];
      misuse_suite::for_each_stage([&](auto stage) {
        misuse_suite::layers_without_tensors<decltype(stage)::value>(comm, m, skip_empty, serial, {});
      });
    }
}

int main(int argc, char** argv) { return test_support::mpi_doctest_main(argc, argv); }
