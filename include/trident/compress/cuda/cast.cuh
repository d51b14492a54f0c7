// trident/compress/cuda/cast.cuh — compress::cast<Half> on device memory (nccl_comm).
// trident-requires: nvcc
//
// Synopsis (namespace trident::compress)
//   template <> struct cast_engine<cuda_space>   what compress::cast uses on a device: include
//                                                this header (from a .cu file) to use cast<Half>
//                                                with nccl_comm
//
// The host's arithmetic (compress/cast.hpp), element for element: x rounded to Half, divided by
// the ranks in float and rounded again (for avg), all-reduced with sum in Half by NCCL, cast
// back. One kernel before and one after the all-reduce, all on the communicator's stream; the
// Half buffer is kept per bucket index (allocated at a bucket's first reduction, charged to
// mem_category::communication), so a warm step allocates nothing and waits for nothing.
//
//   #include <trident/comm/nccl.hpp>
//   #include <trident/compress/cuda/cast.cuh>
//   zero.reduce_gradients_with(std::make_shared<trident::compress::cast<trident::bf16>>());
#pragma once

#if !defined(__CUDACC__)
#error "trident/compress/cuda/cast.cuh contains CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "trident/compress/cast.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/cuda/convert.cuh"

namespace trident::compress {

namespace cast_detail {

template <class T, class Half>
__global__ void to_half_kernel(const T* __restrict__ x, Half* __restrict__ h, std::size_t n, float ranks, bool average) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    Half v = static_cast<Half>(static_cast<float>(x[i]));
    if (average) v = static_cast<Half>(__fdiv_rn(static_cast<float>(v), ranks));
    h[i] = v;
  }
}

template <class Half, class T>
__global__ void from_half_kernel(const Half* __restrict__ h, T* __restrict__ x, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    x[i] = static_cast<T>(static_cast<float>(h[i]));
}

// The kernels go where the communicator's all-reduce goes, or nothing orders them.
template <class Comm>
cudaStream_t stream_of(Comm& comm) {
  static_assert(requires { comm.stream(); }, "compress::cast on a device: the communicator must have a stream()");
  return comm.stream();
}

}  // namespace cast_detail

template <>
struct cast_engine<cuda_space> {
  template <class Half, class Comm, class T>
  static void all_reduce(Comm& comm, const bucket_view<T, cuda_space>& b, std::shared_ptr<void>& scratch) {
    const std::size_t n = b.data.size();
    if (n == 0) return;
    auto* held = static_cast<buffer<Half, cuda_space>*>(scratch.get());
    if (held == nullptr || held->size() != n) {
      // A bucket's first reduction (or a resized bucket): the one allocation, never per step.
      auto fresh = std::make_shared<buffer<Half, cuda_space>>(n, mem_category::communication);
      held = fresh.get();
      scratch = std::move(fresh);
    }
    const cudaStream_t stream = cast_detail::stream_of(comm);
    constexpr int block = 256;
    const auto grid = cuda::grid_for(n, block);
    cast_detail::to_half_kernel<<<grid, block, 0, stream>>>(b.data.data(), held->data(), n, static_cast<float>(comm.size()),
                                                           b.op == reduce_op::avg);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    space_span<Half, cuda_space> wire(held->data(), n);
    comm.all_reduce(wire, reduce_op::sum);
    cast_detail::from_half_kernel<<<grid, block, 0, stream>>>(held->data(), b.data.data(), n);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace trident::compress
