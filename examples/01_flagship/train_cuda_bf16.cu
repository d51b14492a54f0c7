// flagship::cuda::train_on_gpus (train_cuda.hpp) in bf16: mixed_precision<bf16>'s instantiations
// of the GPU trainer, compiled once (apart from fp32's train_cuda.cu, so that the two compile in
// parallel; the template's definition is the same in both).
#include "train_cuda.hpp"

#include "gpt_cuda.cuh"

namespace flagship::cuda {

template <class Precision>
std::vector<step_report> train_on_gpus(trident::nccl_comm& world, const train_options& o,
                                       const std::function<void(const step_report&)>& on_step) {
  return train_cuda<Precision>(world, o, on_step);
}

template std::vector<step_report> train_on_gpus<trident::mixed_precision<trident::bf16>>(
    trident::nccl_comm&, const train_options&, const std::function<void(const step_report&)>&);

}  // namespace flagship::cuda
