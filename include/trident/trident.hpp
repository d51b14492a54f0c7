// trident/trident.hpp — the umbrella header: everything that compiles in this build.
//
// Host-only builds get the host-safe headers; the NCCL and MPI vocabulary headers come in
// when their component target (trident::nccl, trident::mpi) is linked. CUDA kernels
// (trident/cuda/*.cuh) are never included from here: include them from .cu files.
//
//   #include <trident/trident.hpp>
//   trident::buffer<trident::bf16> w(1024, trident::mem_category::parameters);
#pragma once

#include "trident/core/buffer.hpp"
#include "trident/core/config.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/dtype.hpp"
#include "trident/core/error.hpp"
#include "trident/core/half.hpp"
#include "trident/core/memory_ledger.hpp"
#include "trident/core/memory_space.hpp"

#if TRIDENT_HAS_NCCL
#include "trident/comm/nccl_base.hpp"
#endif
#if TRIDENT_HAS_MPI
#include "trident/comm/mpi_base.hpp"
#endif
