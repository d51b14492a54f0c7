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
#include <type_traits>
#include <vector>

#include "trident/compress/reducer.hpp"

namespace trident::compress {

template <class Half>
  requires std::is_same_v<Half, fp16> || std::is_same_v<Half, bf16>
struct cast {
  template <class Comm, class T>
  void all_reduce(Comm& comm, const bucket_view<T, typename Comm::space>& b) {
    if constexpr (std::is_same_v<T, Half>) {
      space_span<T, typename Comm::space> data = b.data;
      comm.all_reduce(data, b.op);
    } else {
      static_assert(Comm::space::host_accessible, "trident::compress::cast works on host memory (thread ranks, MPI)");
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
};

}  // namespace trident::compress
