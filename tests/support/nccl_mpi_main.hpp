#pragma once
// main() for doctest executables in which every mpirun rank drives GPU 0 through NCCL (ranks
// told apart by NCCL_HOSTID): all ranks skip together (exit 77) when any of them sees no device,
// and one failing rank fails the job.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>

#include "trident/comm/nccl.hpp"
#include "trident/core/cuda_runtime.hpp"

namespace test_support {

inline int nccl_mpi_doctest_main(int argc, char** argv, std::optional<trident::nccl_comm>& world) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Every rank must agree to skip, or the others would wait for it forever.
  const int devices = trident::cuda_device_count();
  int fewest = 0;
  MPI_Allreduce(&devices, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (fewest == 0) {
    if (rank == 0) std::printf("SKIPPED: no CUDA device is visible to every rank (no GPU or no driver)\n");
    MPI_Finalize();
    return 77;
  }
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);  // one machine: the loopback interface is enough
  int failed = 0;
  try {
    TRIDENT_CUDA_CHECK(cudaSetDevice(0));  // every rank on GPU 0, on purpose
    world.emplace(trident::nccl_comm::from_mpi(MPI_COMM_WORLD, {.host_id_per_rank = true}));
    doctest::Context context(argc, argv);
    failed = context.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    failed = 1;
  }
  world.reset();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed != 0 ? 1 : 0;
}

}  // namespace test_support
