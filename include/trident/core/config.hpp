// trident/core/config.hpp — version, feature and portability macros.
//
// Synopsis
//   TRIDENT_VERSION_{MAJOR,MINOR,PATCH}, TRIDENT_VERSION, TRIDENT_VERSION_STRING
//   TRIDENT_HOST_DEVICE      __host__ __device__ under nvcc, empty for a host compiler
//   TRIDENT_EXEC_CHECK_DISABLE  before a TRIDENT_HOST_DEVICE template that calls a functor it is
//                            given: nvcc then lets a host-only functor through on the host side
//   TRIDENT_HAS_CUDA         1 when the CUDA runtime may be called from this translation unit
//   TRIDENT_HAS_NCCL         1 when NCCL may be called (set by the trident::nccl target)
//   TRIDENT_HAS_MPI          1 when MPI may be called (set by the trident::mpi target)
//
// The feature macros are set by the CMake component targets (trident::cuda, trident::nccl,
// trident::mpi), never guessed from what headers happen to be installed: a host-only user who
// links trident::trident gets a build that cannot touch CUDA, NCCL or MPI, even on a machine
// that has all three.
#pragma once

// The single source of the version: CMake, Conan and vcpkg read it from here.
#define TRIDENT_VERSION_MAJOR 0
#define TRIDENT_VERSION_MINOR 1
#define TRIDENT_VERSION_PATCH 0
#define TRIDENT_VERSION (TRIDENT_VERSION_MAJOR * 10000 + TRIDENT_VERSION_MINOR * 100 + TRIDENT_VERSION_PATCH)
#define TRIDENT_VERSION_STRING "0.1.0"

#if defined(__CUDACC__)
#define TRIDENT_HOST_DEVICE __host__ __device__
#define TRIDENT_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define TRIDENT_HOST_DEVICE
#define TRIDENT_EXEC_CHECK_DISABLE
#endif

// nvcc compiles every translation unit with the CUDA runtime on the include path, so CUDA is
// always available there; a host compiler sees it only through the trident::cuda target.
#if !defined(TRIDENT_HAS_CUDA)
#if defined(__CUDACC__)
#define TRIDENT_HAS_CUDA 1
#else
#define TRIDENT_HAS_CUDA 0
#endif
#endif

#if !defined(TRIDENT_HAS_NCCL)
#define TRIDENT_HAS_NCCL 0
#endif

#if !defined(TRIDENT_HAS_MPI)
#define TRIDENT_HAS_MPI 0
#endif

#if TRIDENT_HAS_NCCL && !TRIDENT_HAS_CUDA
#error "TRIDENT_HAS_NCCL needs TRIDENT_HAS_CUDA: link trident::nccl, which brings trident::cuda"
#endif

namespace trident {

//! The library's version as numbers, for run-time checks and reports.
//!
//!   std::printf("trident %s\n", trident::version_string);
inline constexpr int version_major = TRIDENT_VERSION_MAJOR;
inline constexpr int version_minor = TRIDENT_VERSION_MINOR;
inline constexpr int version_patch = TRIDENT_VERSION_PATCH;
inline constexpr const char* version_string = TRIDENT_VERSION_STRING;

//! Which optional backends this translation unit was compiled with.
inline constexpr bool has_cuda = TRIDENT_HAS_CUDA != 0;
inline constexpr bool has_nccl = TRIDENT_HAS_NCCL != 0;
inline constexpr bool has_mpi = TRIDENT_HAS_MPI != 0;

}  // namespace trident
