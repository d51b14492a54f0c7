#pragma once
// flagship::cuda::train_on_gpus: gpt_cuda.cuh's train_cuda compiled once, in train_cuda.cu (nvcc),
// for host code such as main.cpp that g++ compiles (`--backend nccl`). Built into the library
// flagship_cuda when CUDA, NCCL and MPI are found (FLAGSHIP_HAS_CUDA=1 then).
#include <functional>
#include <vector>

#include "trainer.hpp"
#include "trident/comm/nccl.hpp"

namespace flagship::cuda {

//! Trains `o` on the GPUs of `world` (collective; the reports are the same on every rank). What
//! the GPU path does not have yet (bf16/fp16, sequence parallelism, full recomputation, stage
//! counts other than 1, 2 and 4) is an error that names it (gpt_cuda.cuh).
std::vector<step_report> train_on_gpus(trident::nccl_comm& world, const train_options& o,
                                       const std::function<void(const step_report&)>& on_step = {});

}  // namespace flagship::cuda
