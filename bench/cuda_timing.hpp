#pragma once
// Timing of GPU work for the CUDA benchmarks: CUDA events around `iterations` calls after three
// warm-up calls, on the legacy default stream (what the benchmarks enqueue on).
#include "trident/core/cuda_runtime.hpp"

namespace bench {

template <class F>
float time_ms(F&& f, int iterations) {
  cudaEvent_t a, b;
  TRIDENT_CUDA_CHECK(cudaEventCreate(&a));
  TRIDENT_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();  // warm-up
  TRIDENT_CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < iterations; ++i) f();
  TRIDENT_CUDA_CHECK(cudaEventRecord(b));
  TRIDENT_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  TRIDENT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  TRIDENT_CUDA_CHECK(cudaEventDestroy(a));
  TRIDENT_CUDA_CHECK(cudaEventDestroy(b));
  return ms / static_cast<float>(iterations);
}

}  // namespace bench
