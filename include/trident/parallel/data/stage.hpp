#pragma once
// What a ZeRO stage is, as a type (CUTLASS's dispatch policies): which of the training state a
// data-parallel rank keeps only a shard of. The stages themselves are one file each in stages/;
// zero_optimizer<Stage, ...> takes a stage type or its number and reads every decision from it.
//
//   concept zero_stage<S>        how a type opts in (below)
//   stage_policy_t<Stage>        the policy of a number (0..3) or of a policy object
//   stage_bytes(S, ...)          the stage's per-rank bytes per parameter (the ZeRO paper's table)
//
// Opting in: a type S with
//   static constexpr int number;                       0..3, for messages and reports
//   static constexpr bool shards_optimizer_state;      fp32 master weights and optimizer states
//   static constexpr bool shards_gradients;            gradients reduce-scattered, not all-reduced
//   static constexpr bool shards_parameters;           working weights gathered before use
// and each level implies the one before it (parameters => gradients => optimizer state): what
// zero_optimizer implements. A stage that breaks this fails with a static_assert naming it.
#include <concepts>
#include <cstddef>
#include <type_traits>

#include "trident/parallel/data/stages/stage_0.hpp"
#include "trident/parallel/data/stages/stage_1.hpp"
#include "trident/parallel/data/stages/stage_2.hpp"
#include "trident/parallel/data/stages/stage_3.hpp"

namespace trident::zero {

//! A ZeRO stage policy (see the top of this header for how a type opts in).
template <class S>
concept zero_stage = requires {
  { S::number } -> std::convertible_to<int>;
  { S::shards_optimizer_state } -> std::convertible_to<bool>;
  { S::shards_gradients } -> std::convertible_to<bool>;
  { S::shards_parameters } -> std::convertible_to<bool>;
} && (!S::shards_gradients || S::shards_optimizer_state) && (!S::shards_parameters || S::shards_gradients);

}  // namespace trident::zero

// In trident::detail, not trident::zero::detail: a nested detail would hide trident::detail from
// the code of namespace zero.
namespace trident::detail {
template <auto Stage>
struct stage_policy {
  using type = std::remove_cvref_t<decltype(Stage)>;
};
template <int N>
struct stage_by_number {
  static_assert(N >= 0 && N <= 3, "zero_optimizer<Stage, ...>: Stage must be 0, 1, 2 or 3 (the ZeRO stages), or a stage "
                                  "policy such as trident::zero::stage_2{}");
  using type = zero::stage_0;
};
template <> struct stage_by_number<1> { using type = zero::stage_1; };
template <> struct stage_by_number<2> { using type = zero::stage_2; };
template <> struct stage_by_number<3> { using type = zero::stage_3; };
template <auto Stage>
  requires std::integral<decltype(Stage)>
struct stage_policy<Stage> {
  using type = typename stage_by_number<static_cast<int>(Stage)>::type;
};
}  // namespace trident::detail

namespace trident::zero {

//! The policy type of a stage given as a number (zero_optimizer<2, ...>) or as a policy object
//! (zero_optimizer<zero::stage_2{}, ...>).
template <auto Stage>
using stage_policy_t = typename detail::stage_policy<Stage>::type;

//! Bytes per parameter that a rank of `ranks` holds under stage S, for `half_bytes` per working
//! weight and gradient, `master_bytes` per fp32 master weight (0 without mixed precision) and
//! `state_bytes` of optimizer state: the ZeRO paper's 2 + 2 + K split over what S shards.
//! Mixed-precision Adam (2, 4, 8): 16, 4 + 12/N, 2 + 14/N, 16/N for stages 0-3.
//!
//!   trident::zero::stage_bytes<trident::zero::stage_2>(2, 4, 8, 4);   // 5.5
template <zero_stage S>
constexpr double stage_bytes(double half_bytes, double master_bytes, double state_bytes, int ranks) noexcept {
  const double n = ranks;
  return (S::shards_parameters ? half_bytes / n : half_bytes) + (S::shards_gradients ? half_bytes / n : half_bytes) +
         (S::shards_optimizer_state ? (master_bytes + state_bytes) / n : master_bytes + state_bytes);
}

}  // namespace trident::zero
