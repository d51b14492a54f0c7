// flagship::cuda::train_on_gpus (train_cuda.hpp) in fp32: the GPU trainer's instantiations,
// compiled once (bf16's are train_cuda_bf16.cu, so that the two compile in parallel).
#include "train_cuda.hpp"

#include "gpt_cuda.cuh"

namespace flagship::cuda {

template <class Precision>
std::vector<step_report> train_on_gpus(trident::nccl_comm& world, const train_options& o,
                                       const std::function<void(const step_report&)>& on_step) {
  return train_cuda<Precision>(world, o, on_step);
}

template std::vector<step_report> train_on_gpus<trident::full_precision>(trident::nccl_comm&, const train_options&,
                                                                        const std::function<void(const step_report&)>&);

double gpu_gemm_flops(trident::nn::gemm_math math) {
  const std::size_t n = 4096;
  trident::buffer<float, trident::cuda_space> a(n * n, trident::mem_category::other), b(n * n, trident::mem_category::other),
      c(n * n, trident::mem_category::other);
  trident::fill_zero(a);
  trident::fill_zero(b);
  // bf16: the tensor cores' rate on bf16 operands in memory, without gemm_math::bf16's rounding
  // passes, which the model's time pays and its MFU therefore shows.
  const bool bf16 = math == trident::nn::gemm_math::bf16;
  trident::buffer<trident::bf16, trident::cuda_space> a16(bf16 ? n * n : 0, trident::mem_category::other),
      b16(bf16 ? n * n : 0, trident::mem_category::other);
  trident::fill_zero(a16);
  trident::fill_zero(b16);
  trident::nn::cublas_handle blas;
  if (!bf16) blas.set_math(math);
  namespace nn = trident::nn;
  auto once = [&] {
    if (bf16) nn::cuda::gemm(blas, nullptr, nn::op::n, nn::op::n, n, n, n, 1.0f, a16.data(), n, b16.data(), n, 0.0f, c.data(), n);
    else nn::cuda::gemm(blas, nullptr, nn::op::n, nn::op::n, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  once();  // cuBLAS's first call chooses and loads its kernel
  cudaEvent_t start = nullptr, stop = nullptr;
  TRIDENT_CUDA_CHECK(cudaEventCreate(&start));
  TRIDENT_CUDA_CHECK(cudaEventCreate(&stop));
  const int reps = 10;
  TRIDENT_CUDA_CHECK(cudaEventRecord(start, nullptr));
  for (int i = 0; i < reps; ++i) once();
  TRIDENT_CUDA_CHECK(cudaEventRecord(stop, nullptr));
  TRIDENT_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  TRIDENT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) * reps / (static_cast<double>(ms) * 1e-3);
}

}  // namespace flagship::cuda
