#pragma once
// flagship::cuda::train_on_gpus: gpt_cuda.cuh's train_cuda compiled once per precision, in
// train_cuda.cu (fp32) and train_cuda_bf16.cu (nvcc), for host code such as main.cpp that g++
// compiles (`--backend nccl`). Built into the library flagship_cuda when CUDA, NCCL and MPI are
// found (FLAGSHIP_HAS_CUDA=1 then).
#include <functional>
#include <vector>

#include "trainer.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/precision/mixed_precision.hpp"

namespace flagship::cuda {

//! Trains `o` on the GPUs of `world` in Precision (full_precision or mixed_precision<bf16>;
//! collective; the reports are the same on every rank). What the GPU path does not have yet
//! (fp16, sequence parallelism, full recomputation, stage counts other than 1, 2 and 4) is an
//! error that names it (gpt_cuda.cuh).
//!
//!   auto reports = flagship::cuda::train_on_gpus<trident::mixed_precision<trident::bf16>>(world, o);
template <class Precision = trident::full_precision>
std::vector<step_report> train_on_gpus(trident::nccl_comm& world, const train_options& o,
                                       const std::function<void(const step_report&)>& on_step = {});

//! This GPU's rate of large GEMMs (4096^3, float matrices) in `math`, FLOP/s: what the progress
//! line's MFU on GPUs is measured against, as measured_gemm_flops() is on CPUs (report.hpp).
double gpu_gemm_flops(trident::nn::gemm_math math);

extern template std::vector<step_report> train_on_gpus<trident::full_precision>(trident::nccl_comm&, const train_options&,
                                                                               const std::function<void(const step_report&)>&);
extern template std::vector<step_report> train_on_gpus<trident::mixed_precision<trident::bf16>>(
    trident::nccl_comm&, const train_options&, const std::function<void(const step_report&)>&);

}  // namespace flagship::cuda
