// trident/trident.hpp — the umbrella header: every public host header that compiles in this build.
//
// Always: core, launch (launcher variables, file rendezvous), the communicator front-end with the
// thread backend and the process grid, the model description, mixed precision, the optimizers,
// the reference layers, ZeRO, the tensor-parallel layers and the safetensors format. With trident::cuda linked, the host parts of CUDA (select_device,
// cuBLAS); with trident::mpi / trident::nccl, those communicators. Kernels (`*/cuda/*.cuh`) are
// never included from here: include them from .cu files.
//
//   #include <trident/trident.hpp>
//   trident::local_world::run(2, [](trident::local_comm& comm) { ... });
#pragma once

#include "trident/core/buffer.hpp"
#include "trident/core/config.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/dtype.hpp"
#include "trident/core/error.hpp"
#include "trident/core/half.hpp"
#include "trident/core/memory_ledger.hpp"
#include "trident/core/memory_space.hpp"
#include "trident/core/space_span.hpp"

#include "trident/exec/cuda/stream.hpp"
#include "trident/exec/thread_pool.hpp"

#include "trident/launch/device.hpp"
#include "trident/launch/launch_env.hpp"
#include "trident/launch/rendezvous.hpp"

#include "trident/comm/communicator.hpp"
#include "trident/comm/hierarchical.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/process_grid.hpp"
#include "trident/comm/slow_link.hpp"
#if TRIDENT_HAS_MPI
#include "trident/comm/mpi.hpp"
#endif
#if TRIDENT_HAS_NCCL
#include "trident/comm/nccl.hpp"
#endif

#include "trident/model/flat_layout.hpp"
#include "trident/model/init.hpp"
#include "trident/model/sharding.hpp"
#include "trident/precision/loss_scaler.hpp"
#include "trident/precision/mixed_precision.hpp"
#include "trident/optim/optimizers.hpp"
#include "trident/optim/schedule.hpp"

#include "trident/nn/activation.hpp"
#include "trident/nn/attention.hpp"
#include "trident/nn/cuda/cublas.hpp"
#include "trident/nn/flash_attention.hpp"
#include "trident/nn/flash_bf16.hpp"
#include "trident/nn/gemm.hpp"
#include "trident/nn/linear.hpp"
#include "trident/nn/loss.hpp"
#include "trident/nn/norm.hpp"
#include "trident/nn/recompute.hpp"

#include "trident/data/token_shards.hpp"

#include "trident/compress/cast.hpp"
#include "trident/compress/onebit.hpp"
#include "trident/compress/powersgd.hpp"
#include "trident/compress/reducer.hpp"
#include "trident/offload/nvme.hpp"
#include "trident/offload/store.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"
#include "trident/parallel/local_sgd/diloco.hpp"
#include "trident/parallel/ps/parameter_server.hpp"
#include "trident/parallel/pipeline/partition.hpp"
#include "trident/parallel/pipeline/pipeline.hpp"
#include "trident/parallel/pipeline/schedule.hpp"
#include "trident/parallel/pipeline/simulator.hpp"
#include "trident/parallel/tensor/block.hpp"
#include "trident/parallel/tensor/linear.hpp"
#include "trident/parallel/tensor/regions.hpp"
#include "trident/parallel/tensor/vocab.hpp"

// checkpoint/zero.hpp is left out: it needs <xxhash.h> (docs/ARCHITECTURE.md, Dependencies).
#include "trident/checkpoint/safetensors.hpp"
