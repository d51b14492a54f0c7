// trident-requires: nvcc
#pragma once
// zero_optimizer's element-wise work on the GPU: gradient statistics, the fused optimizer step,
// the accumulation of reduced gradient pieces and the copies and clears of its buffers, all
// ordered on the communicator's CUDA stream (nothing on the legacy stream, nothing waited for).
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
#include "trident/exec/cuda/stream.hpp"
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

// One thread: the slots in order, as the host engine adds them (bitwise the same total).
template <class = void>
__global__ void total_kernel(const double* __restrict__ sums, std::size_t n, double* __restrict__ out) {
  double total = 0;
  for (std::size_t b = 0; b < n; ++b) total = __dadd_rn(total, sums[b]);
  out[0] = total;
  out[1] = isfinite(total) ? 0.0 : 1.0;
}

// step_async's decision: one thread, the host's code (detail::decide_step).
template <class = void>
__global__ void decide_kernel(const double* __restrict__ reports, std::size_t ranks, std::size_t fields, float unscale,
                              float max_grad_norm, double* __restrict__ state) {
  trident::detail::decide_step(reports, ranks, fields, unscale, max_grad_norm, state);
}

// Up to four doubles from kernel arguments: what a graph can replay, unlike a copy from the host.
template <class = void>
__global__ void store_kernel(double* dst, double a, double b, double c, double d, std::size_t n) {
  const double v[4] = {a, b, c, d};
  for (std::size_t i = 0; i < n; ++i) dst[i] = v[i];
}

template <class Comm>
cudaStream_t stream_of(Comm& comm) {
  if constexpr (requires { comm.stream(); }) return comm.stream();
  else return nullptr;
}

}  // namespace engine_detail

template <>
struct engine<cuda_space> {
  // CUB's temporary storage for cuda::gradient_stats_async; the sum goes to the bucket's slot.
  static std::size_t stats_scratch(std::size_t n) { return cuda::gradient_stats_scratch_size(n) - 1; }
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
  template <class Comm>
  static void total_into(Comm& comm, const double* sums, std::size_t n, double* out) {
    engine_detail::total_kernel<><<<1, 1, 0, engine_detail::stream_of(comm)>>>(sums, n, out);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }
  template <class Comm, class Opt, class H, std::size_t S>
  static void step_deferred(Comm& comm, const Opt& opt, float* params, const H* grads, const std::array<float*, S>& states,
                            std::size_t n, const double* decision, H* working) {
    std::array<device_span<float>, S> state;
    for (std::size_t s = 0; s < S; ++s) state[s] = {states[s], n};
    cuda::step_deferred(opt, device_span<float>(params, n), device_span<const H>(grads, n), state, decision,
                        working ? device_span<H>(working, n) : device_span<H>(), engine_detail::stream_of(comm));
  }
  template <class Comm>
  static void decide(Comm& comm, const double* reports, std::size_t ranks, std::size_t fields, float unscale,
                     float max_grad_norm, double* state) {
    engine_detail::decide_kernel<><<<1, 1, 0, engine_detail::stream_of(comm)>>>(reports, ranks, fields, unscale, max_grad_norm,
                                                                                state);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }
  template <class Comm>
  static void store(Comm& comm, double* dst, const std::array<double, 4>& v, std::size_t n) {
    engine_detail::store_kernel<><<<1, 1, 0, engine_detail::stream_of(comm)>>>(dst, v[0], v[1], v[2], v[3], n);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }
  template <class Comm>
  static bool capturing(Comm& comm) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    TRIDENT_CUDA_CHECK(cudaStreamIsCapturing(engine_detail::stream_of(comm), &status));
    return status != cudaStreamCaptureStatusNone;
  }
  // On the communicator's stream, never the legacy one (which a non-blocking stream does not wait
  // for). From pageable host memory CUDA stages the bytes before returning, so the source may go.
  template <class Comm>
  static void copy(Comm& comm, void* dst, const void* src, std::size_t bytes) {
    if (bytes != 0) TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, engine_detail::stream_of(comm)));
  }
  template <class Comm>
  static void fill_zero(Comm& comm, void* dst, std::size_t bytes) {
    if (bytes != 0) TRIDENT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, engine_detail::stream_of(comm)));
  }
  // A point in the communicator's stream that the host can wait for: the offload waits for one
  // piece's gradients to come down without waiting for the uploads queued before it.
  using marker = cuda_event;
  template <class Comm>
  static void mark(Comm& comm, marker& m) {
    m.record(engine_detail::stream_of(comm));
  }
  static void wait_for(const marker& m) { m.synchronize(); }
};

}  // namespace trident::zero
