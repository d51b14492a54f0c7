// Sharded checkpoints of zero_optimizer on NCCL (mpirun; several ranks may share GPU 0): 10
// steps, save, a new optimizer loads, 10 steps equals 20 steps bit for bit, ZeRO 0-3 x fp32,
// bf16, fp16, the optimizer's state in device memory (resume_suite.hpp; forward and backward
// on the host through staging, as in tests/zero/test_zero_nccl.cu). scripts/gpu_check.sh runs
// it (ctest -L nccl).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <string>

#include "checkpoint/resume_suite.hpp"
#include "support/nccl_mpi_main.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/parallel/data/cuda/zero_engine.cuh"

using namespace resume_suite;

namespace {

std::optional<trident::nccl_comm> world;

}  // namespace

TEST_CASE("checkpoint (NCCL): 10 steps, save, load, 10 steps equals 20 steps bit for bit, ZeRO 0-3, fp32, bf16 and fp16") {
  auto& comm = *world;
  for_each_stage_and_precision([&]<int Stage, class Precision>(const char* precision) {
    CAPTURE(Stage);
    CAPTURE(precision);
    const auto straight_dir = shared_dir(comm, "straight"), resumed_dir = shared_dir(comm, "resumed");
    const auto straight = run_on<Stage, Precision>(comm, straight_dir, false);
    const auto resumed = run_on<Stage, Precision>(comm, resumed_dir, true);
    check_same<Precision>(straight, resumed, straight_dir, resumed_dir, comm.size());
  });
  const auto scratch = shared_dir(comm, "done").parent_path();
  if (comm.rank() == 0) fs::remove_all(scratch);
}

int main(int argc, char** argv) { return test_support::nccl_mpi_doctest_main(argc, argv, world); }
