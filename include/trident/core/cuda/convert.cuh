// trident/core/cuda/convert.cuh — element-type conversion on the device (fp32 <-> fp16/bf16, ...).
// trident-requires: nvcc
//
// Synopsis
//   namespace trident::cuda
//     dim3 grid_for(std::size_t n, int block)     a grid-stride launch size for n elements
//     void convert(device_span<const From> src, device_span<To> dst, cudaStream_t stream = 0)
//                                                  (float -> fp16/bf16: four at a time when aligned)
//
// For CUDA translation units only. Mixed precision casts master weights to working weights with
// this; it rounds exactly like the host conversions in core/half.hpp (to nearest, ties to even).
#pragma once

#if !defined(__CUDACC__)
#error "trident/core/cuda/convert.cuh is for CUDA translation units: compile this file with nvcc"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

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

// float -> a 16-bit type (fp16, bf16), four at a time: 16-byte loads and 8-byte stores, for
// src 16-byte and dst 8-byte aligned; the last size % 4 elements one per thread. The same
// rounding as convert_kernel (To's constructor); a memory-bound pass, and gemm_math::bf16 runs
// one per GEMM operand.
template <class To>
__global__ void convert_quads_kernel(device_span<const float> src, device_span<To> dst) {
  const std::size_t n = src.size(), quads = n / 4, stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::size_t i = first; i < quads; i += stride) {
    const float4 v = reinterpret_cast<const float4*>(src.data())[i];
    const uint2 packed{static_cast<unsigned>(To(v.x).bits()) | (static_cast<unsigned>(To(v.y).bits()) << 16),
                       static_cast<unsigned>(To(v.z).bits()) | (static_cast<unsigned>(To(v.w).bits()) << 16)};
    reinterpret_cast<uint2*>(dst.data())[i] = packed;
  }
  if (4 * quads + first < n) dst[4 * quads + first] = To(src[4 * quads + first]);
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
  if constexpr (std::is_same_v<From, float> && sizeof(To) == 2) {
    const auto at = [](const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; };
    if (at(src.data(), 16) && at(dst.data(), 8)) {
      detail::convert_quads_kernel<To><<<grid_for((src.size() + 3) / 4, block), block, 0, stream>>>(src, dst);
      TRIDENT_CUDA_CHECK(cudaGetLastError());
      return;
    }
  }
  detail::convert_kernel<From, To><<<grid_for(src.size(), block), block, 0, stream>>>(src, dst);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace trident::cuda
