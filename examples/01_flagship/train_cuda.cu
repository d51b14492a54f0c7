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

}  // namespace flagship::cuda
