#pragma once
// trident/precision/mixed_precision.hpp — mixed precision as a type: which element type the
// working weights and gradients use, and how the loss is scaled (precision/loss_scaler.hpp) so
// small fp16 gradients do not flush to zero.
//
//   template <class Half, loss_scaler Scaler = ...> struct mixed_precision
//                                Half = fp16 (dynamic scaler by default), bf16 or float (no
//                                scaling: the range of fp32); fp32 master weights and
//                                optimizer states whenever Half is not float
//   using full_precision = mixed_precision<float>
//   concept precision_policy<P>    what zero_optimizer takes as its Precision: half_type (float,
//                                  fp16 or bf16), scaler_type (a loss_scaler), has_master
#include <concepts>
#include <type_traits>

#include "trident/core/half.hpp"
#include "trident/precision/loss_scaler.hpp"

namespace trident {

//! The precision policy of a zero_optimizer. Half is the type of the working weights and the
//! gradients (what forward and backward use and what is communicated); fp32 master weights and
//! optimizer states are kept whenever Half is narrower than float.
template <class Half, loss_scaler Scaler = std::conditional_t<std::is_same_v<Half, fp16>, dynamic_loss_scaler, static_loss_scaler>>
  requires std::same_as<Half, float> || std::same_as<Half, fp16> || std::same_as<Half, bf16>
struct mixed_precision {
  using half_type = Half;
  using scaler_type = Scaler;
  static constexpr bool has_master = !std::is_same_v<Half, float>;
};

//! No mixed precision: fp32 weights and gradients, no master copy, no loss scaling.
using full_precision = mixed_precision<float>;

//! A precision policy: what zero_optimizer (and later the tensor-parallel layers) take as
//! Precision. A type opts in with the three members of mixed_precision; writing
//! mixed_precision<Half, MyScaler> is the usual way.
template <class P>
concept precision_policy = requires {
  typename P::half_type;
  typename P::scaler_type;
  { P::has_master } -> std::convertible_to<bool>;
} && loss_scaler<typename P::scaler_type> &&
    (std::same_as<typename P::half_type, float> || std::same_as<typename P::half_type, fp16> ||
     std::same_as<typename P::half_type, bf16>);

static_assert(precision_policy<full_precision> && precision_policy<mixed_precision<bf16>> &&
              precision_policy<mixed_precision<fp16>>);

}  // namespace trident
