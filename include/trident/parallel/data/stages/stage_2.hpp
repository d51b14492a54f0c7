#pragma once
// ZeRO stage 2 (P_os+g): as stage 1, and each bucket's gradients are reduce-scattered the moment
// they are ready, so a rank keeps only its shard of the reduced gradients (and a bucket's
// communication buffer while it is in flight). Every micro-batch is reduced.
namespace trident::zero {

//! Optimizer states and gradients sharded.
struct stage_2 {
  static constexpr int number = 2;
  static constexpr bool shards_optimizer_state = true;
  static constexpr bool shards_gradients = true;
  static constexpr bool shards_parameters = false;
};

}  // namespace trident::zero
