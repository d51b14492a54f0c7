// exec/cuda/stream.hpp on a real device (skipped without one): the compute stream of a
// cuda_context is ordered against another stream by events alone, copies are asynchronous on
// it, and a step made of these calls can be captured into a CUDA graph (no allocation, no host
// synchronisation inside).
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/exec/cuda/stream.hpp"

namespace {

// Spins for about `cycles` clock ticks, then writes `value`: makes ordering mistakes visible.
__global__ void slow_fill(float* out, std::size_t n, float value, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = value;
}

__global__ void add_one(float* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] += 1.0f;
}

}  // namespace

TEST_CASE("cuda_context: attributes are read once, device_guard restores the device") {
  trident::cuda_context ctx;
  const auto& a = ctx.attributes();
  CHECK(a.sm_count > 0);
  CHECK(a.major >= 7);
  CHECK(&a == &trident::device_attributes::of(ctx.device()));
  int before = -1, after = -1;
  cudaGetDevice(&before);
  { trident::device_guard on(ctx.device()); }
  cudaGetDevice(&after);
  CHECK(before == after);
}

TEST_CASE("cuda_context: the compute stream waits for another stream's work through an event") {
  trident::cuda_context ctx;
  trident::cuda_stream comm_stream(ctx.device());
  constexpr std::size_t n = 1 << 16;
  trident::buffer<float, trident::cuda_space> x(n);
  trident::buffer<float, trident::pinned_host_space> host(n);
  for (int round = 0; round < 3; ++round) {
    // "communication" writes x slowly on its stream; compute must see the finished values.
    slow_fill<<<64, 256, 0, comm_stream.get()>>>(x.data(), n, static_cast<float>(round), 20'000'000);
    ctx.order_after(comm_stream.get());
    add_one<<<64, 256, 0, ctx.stream()>>>(x.data(), n);
    ctx.hand_to(comm_stream.get());  // and the next slow_fill waits for add_one
    copy_async(ctx, std::span<float>(host.data(), n), std::span<const float>(x.data(), n));
    ctx.synchronize();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += host.data()[i] != static_cast<float>(round) + 1.0f;
    CHECK(wrong == 0);
  }
}

TEST_CASE("cuda_context: copies, fills and hand-offs can be captured into a CUDA graph") {
  trident::cuda_context ctx;
  trident::cuda_stream other(ctx.device());
  constexpr std::size_t n = 4096;
  trident::buffer<float, trident::cuda_space> a(n), b(n);
  std::vector<float> start(n);
  std::iota(start.begin(), start.end(), 0.0f);
  trident::copy(std::span<const float>(start), a);
  cudaGraph_t graph = nullptr;
  TRIDENT_CUDA_CHECK(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal));
  trident::fill_zero_async(ctx, b);
  trident::copy_async(ctx, b, a);
  add_one<<<16, 256, 0, ctx.stream()>>>(b.data(), n);
  ctx.hand_to(other.get());     // fork into the other stream ...
  add_one<<<16, 256, 0, other.get()>>>(b.data(), n);
  ctx.order_after(other.get());  // ... and join back
  TRIDENT_CUDA_CHECK(cudaStreamEndCapture(ctx.stream(), &graph));
  cudaGraphExec_t exec = nullptr;
  TRIDENT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 2; ++i) TRIDENT_CUDA_CHECK(cudaGraphLaunch(exec, ctx.stream()));
  ctx.synchronize();
  const auto got = trident::to_vector(b);
  CHECK(got[0] == 2.0f);
  CHECK(got[n - 1] == static_cast<float>(n - 1) + 2.0f);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}
