// trident/parallel/local_sgd/cuda/diloco.cuh — local_sgd::diloco on device memory (nccl_comm).
// trident-requires: nvcc
//
// Synopsis (namespace trident::local_sgd)
//   template <> struct engine<cuda_space>   what diloco uses on a device: include this header
//                                           (from a .cu file) to use diloco with nccl_comm
//
// The host engine's work (parallel/local_sgd/diloco.hpp) on the communicator's stream: copies
// with cudaMemcpyAsync, the pseudo-gradient and the mixing in kernels rounded as the host rounds
// (explicit intrinsics, no FMA), the outer step through cuda::step (the host's SGD element
// function): with NCCL's average of two ranks (one rounded addition and an exact halving) the
// same bits as on thread ranks.
//
//   #include <trident/comm/nccl.hpp>
//   #include <trident/parallel/local_sgd/cuda/diloco.cuh>
//   trident::local_sgd::diloco<trident::nccl_comm> outer(across, trident::local_sgd::parameters_of(inner), {.inner_steps = 100});
#pragma once

#if !defined(__CUDACC__)
#error "trident/parallel/local_sgd/cuda/diloco.cuh contains CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/cuda/convert.cuh"
#include "trident/exec/cuda/stream.hpp"
#include "trident/optim/cuda/step.cuh"
#include "trident/parallel/local_sgd/diloco.hpp"

namespace trident::local_sgd {

namespace diloco_detail {

template <class = void>
__global__ void pseudo_gradient_kernel(float* __restrict__ delta, const float* __restrict__ global, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    delta[i] = __fsub_rn(global[i], delta[i]);
}

template <class = void>
__global__ void mix_kernel(float* __restrict__ local, const float* __restrict__ global, float alpha, std::size_t n) {
  const float rest = __fsub_rn(1.0f, alpha);
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    local[i] = __fadd_rn(__fmul_rn(alpha, local[i]), __fmul_rn(rest, global[i]));
}

// The work goes where the communicator's collectives go, or nothing orders it.
template <class Comm>
cudaStream_t stream_of(Comm& comm) {
  static_assert(requires { comm.stream(); }, "local_sgd::diloco on a device: the communicator must have a stream()");
  return comm.stream();
}

}  // namespace diloco_detail

template <>
struct engine<cuda_space> {
  template <class Comm>
  static void copy(Comm& comm, float* dst, const float* src, std::size_t n) {
    if (n != 0)
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, diloco_detail::stream_of(comm)));
  }
  template <class Comm>
  static void fill_zero(Comm& comm, float* dst, std::size_t n) {
    if (n != 0) TRIDENT_CUDA_CHECK(cudaMemsetAsync(dst, 0, n * sizeof(float), diloco_detail::stream_of(comm)));
  }
  template <class Comm>
  static void pseudo_gradient(Comm& comm, float* delta, const float* global, std::size_t n) {
    if (n == 0) return;
    constexpr int block = 256;
    diloco_detail::pseudo_gradient_kernel<><<<cuda::grid_for(n, block), block, 0, diloco_detail::stream_of(comm)>>>(delta, global, n);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }
  template <class Comm>
  static void outer_step(Comm& comm, const optim::sgd& o, float* params, const float* grads, float* momentum, std::size_t n,
                         std::int64_t t) {
    cuda::step(o, device_span<float>(params, n), device_span<const float>(grads, n), {device_span<float>(momentum, n)}, t, 1.0f,
               device_span<float>(), diloco_detail::stream_of(comm));
  }
  template <class Comm>
  static void mix(Comm& comm, float* local, const float* global, float alpha, std::size_t n) {
    if (n == 0) return;
    constexpr int block = 256;
    diloco_detail::mix_kernel<><<<cuda::grid_for(n, block), block, 0, diloco_detail::stream_of(comm)>>>(local, global, alpha, n);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }
  using marker = cuda_event;
  template <class Comm>
  static void mark(Comm& comm, marker& m) {
    m.record(diloco_detail::stream_of(comm));
  }
  static void wait_for(const marker& m) { m.synchronize(); }
};

}  // namespace trident::local_sgd
