// The ZeRO misuse suite (misuse_suite.hpp) over NCCL (issue 17: a regression test for every case,
// on every backend where it applies): every rank of mpirun drives GPU 0 through one nccl_comm
// (ranks told apart by NCCL_HOSTID, so NCCL's socket transport carries the collectives), and the
// optimizer's buffers are device memory. The bodies reach parameters() and gradients() through
// zero_training::to_host and on_host: the communicator's stream is synchronised before every
// device read (and so before every write, which reads first), and a write has landed before
// on_host returns, so the next call that hands the gradients to the communicator (grad_ready,
// step) queues its work after it. Without a GPU every rank exits 77 (skipped).
//
// Every body of the suite runs here except one case:
//   different_orders<3>(comm, true) (stage 3 with prefetch, ranks in different orders). Rank 1's
//   prefetch all-gathers a bucket where rank 0 reduce-scatters another: two collectives of
//   different kinds and sizes at the same position. The thread backend and MPI's argument check
//   refuse that pair before it runs, and the optimizer turns the refusal into the order
//   usage_error; NCCL checks nothing across ranks, so the pair is undefined there (garbage, or a
//   hang until nccl_options::timeout aborts the communicator, which would then fail every test
//   after it). The same case without prefetch, where only equal-sized buckets are swapped, runs
//   here and is caught at step() like on every backend.
// layers_without_tensors is given no stage-0 result to match bit for bit (as under MPI): NCCL's
// sums are its own, so only the comparison with one rank on the global batch applies.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <optional>
#include <vector>

#include "support/nccl_mpi_main.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/parallel/data/cuda/zero_engine.cuh"
#include "zero/misuse_suite.hpp"
#include "zero/zero_training.hpp"

namespace {

std::optional<trident::nccl_comm> world;  // made in main, after MPI_Init, before the tests

}  // namespace

TEST_CASE("zero over NCCL: grad_ready twice, by every rank, for a layer alone in its bucket: usage_error, nothing reduced twice") {
  auto& comm = *world;
  misuse_suite::for_each_stage([&](auto stage) {
    INFO("stage ", stage.value, " on ", comm.size(), " NCCL ranks");
    misuse_suite::grad_ready_twice<decltype(stage)::value>(comm);
  });
}

TEST_CASE("zero over NCCL: grad_ready twice inside a bucket of several layers; stages 0-1 reducing a bucket twice in a step") {
  auto& comm = *world;
  misuse_suite::for_each_stage([&](auto stage) {
    INFO("stage ", stage.value, " on ", comm.size(), " NCCL ranks");
    misuse_suite::grad_ready_twice_in_shared_bucket<decltype(stage)::value>(comm);
  });
}

TEST_CASE("zero over NCCL: ranks that touch layers in different orders get a usage_error naming both buckets at step()") {
  auto& comm = *world;
  misuse_suite::for_each_stage([&](auto stage) {
    INFO("stage ", stage.value, " on ", comm.size(), " NCCL ranks");
    misuse_suite::different_orders<decltype(stage)::value>(comm);
  });
}

TEST_CASE("zero over NCCL, checked mode: gradients written after grad_ready are a usage_error at step() on every rank") {
  auto& comm = *world;
  misuse_suite::for_each_stage([&](auto stage) {
    constexpr int Stage = decltype(stage)::value;
    for (bool old_span : {true, false}) {
      INFO("stage ", Stage, (old_span ? ", through a span held from before" : ", through a new gradients() call"));
      misuse_suite::written_after_ready<Stage>(comm, true, old_span);
    }
    // Without checked mode, stages 2-3 still catch gradients of a micro-batch that is never reduced.
    if constexpr (Stage >= 2) misuse_suite::written_after_ready<Stage>(comm, false, false);
  });
}

TEST_CASE("zero over NCCL, checked mode: a stage-3 parameters() span read after release() holds NaN") {
  misuse_suite::stale_parameters_read_nan(*world);
}

TEST_CASE("zero over NCCL: checked mode trains bit for bit like unchecked mode, with micro-batches too") {
  auto& comm = *world;
  misuse_suite::for_each_stage([&](auto stage) {
    INFO("stage ", stage.value, " on ", comm.size(), " NCCL ranks");
    misuse_suite::checked_mode_is_exact<decltype(stage)::value>(comm);
  });
}

TEST_CASE("zero over NCCL: handles resolve a tensor once and see the same memory as names") {
  auto& comm = *world;
  misuse_suite::for_each_stage([&](auto stage) {
    INFO("stage ", stage.value);
    misuse_suite::handles<decltype(stage)::value>(comm);
  });
}

TEST_CASE("zero over NCCL: layers without tensors train like one rank on the global batch") {
  auto& comm = *world;
  const auto models = misuse_suite::empty_layer_models();
  for (std::size_t m = 0; m < models.size(); ++m)
    for (bool skip_empty : {false, true}) {
      INFO("model ", m, (skip_empty ? ", empty layers skipped" : ", empty layers marked ready"), ", ", comm.size(), " NCCL ranks");
      zero_training::toy::walk how;
      how.skip_empty = skip_empty;
      const auto options = misuse_suite::buckets_of(models[m].bucket_elements);
      const auto serial = trident::local_world::run(1, [&](trident::local_comm& c) {
        return zero_training::toy::train<0>(c, models[m].spec, misuse_suite::sgd(), options, 4, how);
      })[0];
      misuse_suite::for_each_stage([&](auto stage) {
        misuse_suite::layers_without_tensors<decltype(stage)::value>(comm, models[m], skip_empty, serial, {});
      });
    }
}

int main(int argc, char** argv) { return test_support::nccl_mpi_doctest_main(argc, argv, world); }
