// trident-requires: nvcc
#pragma once
// zero_optimizer's element-wise work on the GPU: gradient statistics, the fused optimizer step
// and the accumulation of reduced gradient pieces, ordered on the communicator's CUDA stream.
// Include it (from a .cu file) to use zero_optimizer with nccl_comm.
//
//   #include <trident/comm/nccl.hpp>
//   #include <trident/parallel/data/cuda/zero_engine.cuh>
//   trident::zero::zero_optimizer<2, trident::optim::adamw, trident::nccl_comm,
//                                 trident::mixed_precision<trident::bf16>> zero(comm, spec, adamw);
#if !defined(__CUDACC__)
#error "trident/parallel/data/cuda/zero_engine.cuh contains CUDA kernels: compile this translation unit with nvcc"
#endif

#include <array>
#include <cstdint>

#include "trident/core/cuda_runtime.hpp"
#include "trident/core/cuda/convert.cuh"
#include "trident/optim/cuda/step.cuh"
#include "trident/parallel/data/zero_optimizer.hpp"

namespace trident::zero {

namespace engine_detail {

template <class H>
__global__ void accumulate_kernel(H* dst, const H* src, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = static_cast<H>(static_cast<float>(dst[i]) + static_cast<float>(src[i]));  // as host_combine: in float
}

template <class Comm>
cudaStream_t stream_of(Comm& comm) {
  if constexpr (requires { comm.stream(); }) return comm.stream();
  else return nullptr;
}

}  // namespace engine_detail

template <>
struct engine<cuda_space> {
  // The per-block partial sums of cuda::gradient_stats_async; the total goes to the bucket's slot.
  static std::size_t stats_scratch(std::size_t n) noexcept { return cuda::gradient_stats_scratch_size(n) - 1; }
  template <class Comm, class H>
  static void stats_into(Comm& comm, const H* grads, std::size_t n, float multiplier, double* sum, double* scratch,
                         std::size_t scratch_size) {
    cuda::gradient_stats_async(device_span<const H>(grads, n), multiplier, sum, device_span<double>(scratch, scratch_size),
                               engine_detail::stream_of(comm));
  }
  template <class Comm, class Opt, class H, std::size_t S>
  static void step(Comm& comm, const Opt& opt, float* params, const H* grads, const std::array<float*, S>& states, std::size_t n,
                   std::int64_t t, float multiplier, H* working) {
    std::array<device_span<float>, S> state;
    for (std::size_t s = 0; s < S; ++s) state[s] = {states[s], n};
    cuda::step(opt, device_span<float>(params, n), device_span<const H>(grads, n), state, t, multiplier,
               working ? device_span<H>(working, n) : device_span<H>(), engine_detail::stream_of(comm));
  }
  template <class Comm, class H>
  static void accumulate(Comm& comm, H* dst, const H* src, std::size_t n) {
    if (n == 0) return;
    constexpr int block = 256;
    engine_detail::accumulate_kernel<<<cuda::grid_for(n, block), block, 0, engine_detail::stream_of(comm)>>>(dst, src, n);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace trident::zero
