// Host-side cost of one call, per backend, with Google Benchmark: trident's wrapper against the
// raw library call on the same communicator and buffer, in the same run. One rank and a one-
// element buffer, so the figure is what the wrapper adds (argument checks, dispatch), not data
// movement.
//   ./bench_comm_overhead                 thread backend and MPI (MPI_COMM_SELF; the wrapper with
//                                         and without its cross-rank argument check)
//   (with a GPU) the NCCL trio runs too: raw ncclAllReduce, trident's front-end, and the
//   backend's execute() alone; 4 B in place and 1-4 MiB out of place; the stream is
//   synchronised every 256 calls
#include <benchmark/benchmark.h>

#include <cstdint>
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
// Without the cross-rank argument check (TRIDENT_CHECK_COLLECTIVES=0): the wrapper alone.
void mpi_wrapper_all_reduce(benchmark::State& state) {
  trident::mpi_comm comm(MPI_COMM_SELF, false);
  std::vector<float> x(1, 1.0f);
  for (auto _ : state) comm.all_reduce(x);
}
BENCHMARK(mpi_wrapper_all_reduce);

// With it, the default: one more (small) MPI_Allreduce per call, here on one rank, so the figure
// is its host cost; across ranks it costs a round trip (bench/collectives.cpp measures that).
void mpi_wrapper_checked_all_reduce(benchmark::State& state) {
  trident::mpi_comm comm(MPI_COMM_SELF, true);
  std::vector<float> x(1, 1.0f);
  for (auto _ : state) comm.all_reduce(x);
}
BENCHMARK(mpi_wrapper_checked_all_reduce);

void mpi_raw_all_reduce(benchmark::State& state) {
  trident::mpi_comm comm(MPI_COMM_SELF, false);  // the same duplicated communicator
  std::vector<float> x(1, 1.0f);
  for (auto _ : state) MPI_Allreduce(MPI_IN_PLACE, x.data(), 1, MPI_FLOAT, MPI_SUM, comm.native());
}
BENCHMARK(mpi_raw_all_reduce);
#endif

#if TRIDENT_HAS_NCCL
// Which path issues the all-reduce: the raw NCCL call, trident's front-end (argument checks,
// then the backend), or the backend's execute() on a prepared call (the front-end skipped), so
// a difference between wrapper and raw can be located.
enum class nccl_path { raw, wrapper, execute };

// range(0): bytes per call. 4 bytes is in place; larger sizes are out of place, which on one
// rank is a device-to-device cudaMemcpyAsync inside NCCL (in place is a no-op there), so those
// figures include the real launch cost the collectives benchmark sees at 1-4 MiB.
void nccl_pair(benchmark::State& state, nccl_path path) {
  if (trident::cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  ncclUniqueId id;
  TRIDENT_NCCL_CHECK(ncclGetUniqueId(&id));
  auto comm = trident::nccl_comm::init(id, 0, 1);
  const auto count = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  const bool in_place = count <= 1;
  trident::buffer<float, trident::cuda_space> in(count), out(count);
  float* recv = in_place ? in.data() : out.data();
  trident::collective_call call;
  call.kind = trident::collective::all_reduce;
  call.send = in.data();
  call.recv = recv;
  call.send_count = call.recv_count = count;
  call.type = trident::dtype::float32;
  int i = 0;
  for (auto _ : state) {
    switch (path) {
      case nccl_path::raw: ncclAllReduce(in.data(), recv, count, ncclFloat, ncclSum, comm.native(), comm.stream()); break;
      case nccl_path::wrapper:
        if (in_place) comm.all_reduce(in);
        else comm.all_reduce(in, out);
        break;
      case nccl_path::execute: comm.execute(call); break;
    }
    if (++i % 256 == 0) comm.synchronize();
  }
  comm.synchronize();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
void nccl_wrapper_all_reduce(benchmark::State& state) { nccl_pair(state, nccl_path::wrapper); }
void nccl_execute_all_reduce(benchmark::State& state) { nccl_pair(state, nccl_path::execute); }
void nccl_raw_all_reduce(benchmark::State& state) { nccl_pair(state, nccl_path::raw); }
BENCHMARK(nccl_wrapper_all_reduce)->Arg(4)->Arg(1 << 20)->Arg(4 << 20);
BENCHMARK(nccl_execute_all_reduce)->Arg(4)->Arg(1 << 20)->Arg(4 << 20);
BENCHMARK(nccl_raw_all_reduce)->Arg(4)->Arg(1 << 20)->Arg(4 << 20);
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
