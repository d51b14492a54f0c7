#pragma once
// ZeRO stage 1 (P_os in Rajbhandari et al. 2020): each rank keeps the fp32 master weights and
// optimizer states of its shard only, updates that shard, and all-gathers the new working weights
// after the step. Gradients are still all-reduced in full (so no_sync accumulation still works).
namespace trident::zero {

//! Optimizer states (and master weights) sharded.
struct stage_1 {
  static constexpr int number = 1;
  static constexpr bool shards_optimizer_state = true;
  static constexpr bool shards_gradients = false;
  static constexpr bool shards_parameters = false;
};

}  // namespace trident::zero
