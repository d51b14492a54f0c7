// trident/core/cuda/convert.cuh — element-type conversion on the device (fp32 <-> fp16/bf16, ...).
// trident-requires: nvcc
//
// Synopsis
//   namespace trident::cuda
//     dim3 grid_for(std::size_t n, int block)     a grid-stride launch size for n elements
//     void convert(device_span<const From> src, device_span<To> dst, cudaStream_t stream = 0)
//
// For CUDA translation units only. Mixed precision casts master weights to working weights with
// this; it rounds exactly like the host conversions in core/half.hpp (to nearest, ties to even).
#pragma once

#if !defined(__CUDACC__)
#error "trident/core/cuda/convert.cuh is for CUDA translation units: compile this file with nvcc"
#endif

#include <algorithm>
#include <cstddef>

#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/error.hpp"
#include "trident/core/half.hpp"

namespace trident::cuda {

//! A grid for a grid-stride loop over n elements: enough blocks to fill the device a few times
//! over, never more than n needs (a grid-stride loop is correct for any grid size).
inline dim3 grid_for(std::size_t n, int block) {
  int device = 0;
  int sms = 0;
  TRIDENT_CUDA_CHECK(cudaGetDevice(&device));
  TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const std::size_t needed = (n + static_cast<std::size_t>(block) - 1) / static_cast<std::size_t>(block);
  const std::size_t cap = static_cast<std::size_t>(sms) * 8;
  return dim3(static_cast<unsigned>(std::max<std::size_t>(1, std::min(needed, cap))));
}

namespace detail {

template <class From, class To>
__global__ void convert_kernel(device_span<const From> src, device_span<To> dst) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < src.size(); i += stride) {
    dst[i] = To(static_cast<float>(src[i]));
  }
}

}  // namespace detail

//! Converts every element of `src` to To into `dst`, ordered on `stream`.
//! Throws usage_error naming both sizes when they differ.
//!
//!   trident::cuda::convert<float, trident::bf16>(master.device_handle(), working.device_handle(), stream);
template <class From, class To>
void convert(device_span<const From> src, device_span<To> dst, cudaStream_t stream = nullptr) {
  TRIDENT_EXPECT(src.size() == dst.size(), "cuda::convert: source has ", src.size(), " elements, destination ",
                 dst.size());
  if (src.empty()) return;
  constexpr int block = 256;
  detail::convert_kernel<From, To><<<grid_for(src.size(), block), block, 0, stream>>>(src, dst);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace trident::cuda
