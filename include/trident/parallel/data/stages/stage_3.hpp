#pragma once
// ZeRO stage 3 (P_os+g+p, PyTorch's FSDP FULL_SHARD): as stage 2, and the working weights are
// sharded too: a bucket is all-gathered before its layer's forward and backward, released after,
// and the next one prefetched; buckets under the persistence threshold stay gathered.
namespace trident::zero {

//! Optimizer states, gradients and parameters sharded.
struct stage_3 {
  static constexpr int number = 3;
  static constexpr bool shards_optimizer_state = true;
  static constexpr bool shards_gradients = true;
  static constexpr bool shards_parameters = true;
};

}  // namespace trident::zero
