#pragma once
// Gradients on the wire in 16 bits: PyTorch DDP's fp16_compress_hook and bf16_compress_hook.
//
//   compress::cast<fp16>, compress::cast<bf16>   halve the bytes of an fp32 all-reduce
//
// As PyTorch does it (torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py): the bucket
// is cast to the 16-bit type, divided by the world size in that type (for avg), all-reduced
// with sum in it (each addition rounded to it, as NCCL does), and cast back. Gradients already
// in that type are all-reduced as they are.
//
//   auto r = std::make_shared<trident::compress::cast<trident::bf16>>();
//   zero.reduce_gradients_with(r);
//
// On device memory (nccl_comm) the same arithmetic runs in two kernels around NCCL's all-reduce:
// include <trident/compress/cuda/cast.cuh> (nvcc), which specialises cast_engine<cuda_space>.
#include <cstddef>
#include <memory>
#include <type_traits>
#include <vector>

#include "trident/compress/reducer.hpp"

namespace trident::compress {

//! Where cast<Half> runs for a memory space that the host cannot read: specialised in
//! compress/cuda/cast.cuh for cuda_space. all_reduce<Half>(comm, bucket, scratch) keeps its
//! Half buffer in `scratch` (one per bucket index, kept by the reducer).
template <memory_space Space>
struct cast_engine;

template <class Half>
  requires std::is_same_v<Half, fp16> || std::is_same_v<Half, bf16>
struct cast {
  template <class Comm, class T>
  void all_reduce(Comm& comm, const bucket_view<T, typename Comm::space>& b) {
    using space = typename Comm::space;
    if constexpr (std::is_same_v<T, Half>) {
      space_span<T, space> data = b.data;
      comm.all_reduce(data, b.op);
    } else if constexpr (!space::host_accessible) {
      static_assert(requires { sizeof(cast_engine<space>); },
                    "trident::compress::cast on device memory: include <trident/compress/cuda/cast.cuh> (compiled by nvcc)");
      if (device_scratch_.size() <= b.index) device_scratch_.resize(b.index + 1);
      cast_engine<space>::template all_reduce<Half>(comm, b, device_scratch_[b.index]);
    } else {
      const std::size_t n = b.data.size();
      std::vector<Half> h(n);
      const float ranks = static_cast<float>(comm.size());
      for (std::size_t i = 0; i < n; ++i) {
        h[i] = static_cast<Half>(static_cast<float>(b.data.data()[i]));
        if (b.op == reduce_op::avg) h[i] = static_cast<Half>(static_cast<float>(h[i]) / ranks);
      }
      comm.all_reduce(h, reduce_op::sum);
      for (std::size_t i = 0; i < n; ++i) b.data.data()[i] = static_cast<T>(static_cast<float>(h[i]));
    }
  }

 private:
  std::vector<std::shared_ptr<void>> device_scratch_;  // per bucket index: the engine's Half buffer
};

}  // namespace trident::compress
