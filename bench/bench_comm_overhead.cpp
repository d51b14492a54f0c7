// Host-side cost of one call, per backend, with Google Benchmark: trident's wrapper against the
// raw library call on the same communicator and buffer, in the same run. One rank and a one-
// element buffer, so the figure is what the wrapper adds (argument checks, dispatch), not data
// movement.
//   ./bench_comm_overhead                 thread backend and MPI (MPI_COMM_SELF)
//   (with a GPU) the NCCL pair runs too: enqueue cost, the stream synchronised every 256 calls
#include <benchmark/benchmark.h>

#include <vector>

#include "trident/comm/local.hpp"
#if TRIDENT_HAS_MPI
#include "trident/comm/mpi.hpp"
#endif
#if TRIDENT_HAS_NCCL
#include "trident/comm/nccl.hpp"
#include "trident/core/cuda_runtime.hpp"
#endif

namespace {

void local_all_reduce_1_rank(benchmark::State& state) {
  trident::local_world::run(1, [&](trident::local_comm& comm) {
    std::vector<float> x(1, 1.0f);
    for (auto _ : state) comm.all_reduce(x);
  });
}
BENCHMARK(local_all_reduce_1_rank);

void local_all_reduce_2_ranks(benchmark::State& state) {
  // Rank 1 mirrors rank 0's loop; the figure is one synchronised round trip between threads.
  const auto iterations = static_cast<std::size_t>(state.max_iterations);
  trident::local_world::run(2, [&](trident::local_comm& comm) {
    std::vector<float> x(1, 1.0f);
    if (comm.rank() == 0) {
      for (auto _ : state) comm.all_reduce(x);
    } else {
      for (std::size_t i = 0; i < iterations; ++i) comm.all_reduce(x);
    }
  });
}
BENCHMARK(local_all_reduce_2_ranks)->Iterations(20000);

#if TRIDENT_HAS_MPI
void mpi_wrapper_all_reduce(benchmark::State& state) {
  trident::mpi_comm comm(MPI_COMM_SELF, false);
  std::vector<float> x(1, 1.0f);
  for (auto _ : state) comm.all_reduce(x);
}
BENCHMARK(mpi_wrapper_all_reduce);

void mpi_raw_all_reduce(benchmark::State& state) {
  trident::mpi_comm comm(MPI_COMM_SELF, false);  // the same duplicated communicator
  std::vector<float> x(1, 1.0f);
  for (auto _ : state) MPI_Allreduce(MPI_IN_PLACE, x.data(), 1, MPI_FLOAT, MPI_SUM, comm.native());
}
BENCHMARK(mpi_raw_all_reduce);
#endif

#if TRIDENT_HAS_NCCL
void nccl_pair(benchmark::State& state, bool wrapper) {
  if (trident::cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  ncclUniqueId id;
  TRIDENT_NCCL_CHECK(ncclGetUniqueId(&id));
  auto comm = trident::nccl_comm::init(id, 0, 1);
  trident::buffer<float, trident::cuda_space> x(1);
  int i = 0;
  for (auto _ : state) {
    if (wrapper) comm.all_reduce(x);
    else ncclAllReduce(x.data(), x.data(), 1, ncclFloat, ncclSum, comm.native(), comm.stream());
    if (++i % 256 == 0) comm.synchronize();
  }
  comm.synchronize();
}
void nccl_wrapper_all_reduce(benchmark::State& state) { nccl_pair(state, true); }
void nccl_raw_all_reduce(benchmark::State& state) { nccl_pair(state, false); }
BENCHMARK(nccl_wrapper_all_reduce);
BENCHMARK(nccl_raw_all_reduce);
#endif

}  // namespace

int main(int argc, char** argv) {
#if TRIDENT_HAS_MPI
  trident::mpi_environment env(argc, argv);
#endif
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
