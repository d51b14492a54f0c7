// flagship::cuda::train_on_gpus (train_cuda.hpp): the GPU trainer's instantiations, compiled once.
#include "train_cuda.hpp"

#include "gpt_cuda.cuh"

namespace flagship::cuda {

std::vector<step_report> train_on_gpus(trident::nccl_comm& world, const train_options& o,
                                       const std::function<void(const step_report&)>& on_step) {
  return train_cuda(world, o, on_step);
}

}  // namespace flagship::cuda
