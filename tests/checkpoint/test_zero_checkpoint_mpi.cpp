// Sharded checkpoints under MPI (mpirun -np 2): 10 steps, save, a new optimizer loads, 10 steps
// equals 20 steps bit for bit, ZeRO 0-3 x fp32, bf16, fp16, the ranks being processes that share
// only the file system (resume_suite.hpp; the thread test adds resharding and broken files).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "checkpoint/resume_suite.hpp"
#include "support/mpi_main.hpp"

using namespace resume_suite;

TEST_CASE("checkpoint (MPI): 10 steps, save, load, 10 steps equals 20 steps bit for bit, ZeRO 0-3, fp32, bf16 and fp16") {
  auto& comm = test_support::mpi_world();
  for_each_stage_and_precision([&]<int Stage, class Precision>(const char* precision) {
    CAPTURE(Stage);
    CAPTURE(precision);
    const auto straight_dir = shared_dir(comm, "straight"), resumed_dir = shared_dir(comm, "resumed");
    const auto straight = run_on<Stage, Precision>(comm, straight_dir, false);
    const auto resumed = run_on<Stage, Precision>(comm, resumed_dir, true);
    check_same<Precision>(straight, resumed, straight_dir, resumed_dir, comm.size());
  });
  const auto scratch = shared_dir(comm, "done").parent_path();
  comm.barrier();
  if (comm.rank() == 0) fs::remove_all(scratch);
}

int main(int argc, char** argv) { return test_support::mpi_doctest_main(argc, argv); }
