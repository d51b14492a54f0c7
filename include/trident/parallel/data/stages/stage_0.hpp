#pragma once
// ZeRO stage 0: plain data parallelism (DDP). Every rank keeps everything; gradients are
// all-reduced bucket by bucket, and gradient accumulation may skip the reduction of all but the
// last micro-batch (set_gradient_sync(false), DDP's no_sync).
namespace trident::zero {

//! Nothing sharded: parameters, gradients, master weights and optimizer states on every rank.
//!
//!   trident::zero::zero_optimizer<trident::zero::stage_0{}, trident::optim::adamw, trident::local_comm> ddp(...);
struct stage_0 {
  static constexpr int number = 0;
  static constexpr bool shards_optimizer_state = false;
  static constexpr bool shards_gradients = false;
  static constexpr bool shards_parameters = false;
};

}  // namespace trident::zero
