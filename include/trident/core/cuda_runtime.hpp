// trident/core/cuda_runtime.hpp — the CUDA runtime as the host sees it: check macro, devices.
//
// Synopsis
//   TRIDENT_CUDA_CHECK(call)       throws trident::cuda_error naming the call when it fails
//   int cuda_device_count()        0 when CUDA is absent, there is no driver or no device
//
// Guarded: with TRIDENT_HAS_CUDA == 0 (plain host build) only cuda_device_count() exists and
// returns 0, so host code can ask "is there a GPU?" without any CUDA on its include path.
#pragma once

#include <source_location>

#include "trident/core/config.hpp"
#include "trident/core/error.hpp"

#if TRIDENT_HAS_CUDA
#include <cuda_runtime_api.h>

namespace trident {
namespace detail {

inline void cuda_check(cudaError_t status, const char* operation,
                       std::source_location where = std::source_location::current()) {
  if (status == cudaSuccess) [[likely]]
    return;
  // Clear the sticky-free "last error" so that a caught error does not resurface in the next
  // unrelated check; sticky errors (a faulted context) stay, as CUDA intends.
  (void)cudaGetLastError();
  throw cuda_error(static_cast<int>(status), concat(cudaGetErrorName(status), ": ", cudaGetErrorString(status)),
                   operation, where);
}

}  // namespace detail

//! The number of CUDA devices this process can use; 0 when there is no driver or no device
//! (tests use it to report themselves skipped rather than failed).
//!
//!   if (trident::cuda_device_count() == 0) return skip("no GPU");
inline int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace trident

//! Wraps one CUDA runtime call: `TRIDENT_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDefault));`
#define TRIDENT_CUDA_CHECK(...) ::trident::detail::cuda_check((__VA_ARGS__), #__VA_ARGS__)

#else  // !TRIDENT_HAS_CUDA

namespace trident {

inline int cuda_device_count() noexcept { return 0; }

}  // namespace trident

#endif
