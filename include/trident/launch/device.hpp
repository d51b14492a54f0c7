// trident/launch/device.hpp — one GPU per local rank.
//
// Synopsis
//   int select_device(const launch_env&)   cudaSetDevice(local_rank % device count)
//
// Needs the CUDA runtime, not nvcc: with TRIDENT_HAS_CUDA (link trident::cuda) it declares
// select_device; without, nothing (like core/cuda_runtime.hpp), so host-only code may include it.
#pragma once

#include "trident/core/config.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/error.hpp"
#include "trident/launch/launch_env.hpp"

#if TRIDENT_HAS_CUDA
namespace trident {

//! Makes device `env.local_rank % device count` current for this thread and returns it: one GPU
//! per local rank, wrapping around when there are more ranks than GPUs on the node (which NCCL
//! only accepts in nccl_options::host_id_per_rank test mode). Call it before creating CUDA
//! buffers or a communicator.
//!
//!   const int device = trident::select_device(trident::launch_env::detect());
inline int select_device(const launch_env& env) {
  int count = 0;
  TRIDENT_CUDA_CHECK(cudaGetDeviceCount(&count));
  TRIDENT_EXPECT(count > 0, "select_device: no CUDA device is visible to this process");
  TRIDENT_EXPECT(env.local_rank >= 0, "select_device: local_rank ", env.local_rank, " is negative");
  const int device = env.local_rank % count;
  TRIDENT_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

}  // namespace trident
#endif  // TRIDENT_HAS_CUDA
