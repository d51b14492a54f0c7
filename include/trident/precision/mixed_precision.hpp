#pragma once
// Mixed precision as a type: which element type the working weights and gradients use, and how
// the loss is scaled so small fp16 gradients do not flush to zero.
//
//   struct dynamic_loss_scaler   DeepSpeed's: start at 2^16, halve on overflow (after
//                                `hysteresis` overflows), double after `window` clean steps
//   struct static_loss_scaler    a fixed scale; overflowing steps are still skipped
//   template <class Half> struct mixed_precision
//                                Half = fp16 (dynamic scaler by default), bf16 or float (no
//                                scaling: the range of fp32); fp32 master weights and
//                                optimizer states whenever Half is not float
//
// A scaler opts in to `loss_scaler` with scale() and update(bool overflow) -> bool applied.
#include <algorithm>
#include <concepts>
#include <cstdint>
#include <type_traits>

#include "trident/core/error.hpp"
#include "trident/core/half.hpp"

namespace trident {

template <class S>
concept loss_scaler = requires(S& s, const S& cs, bool overflow) {
  { cs.scale() } -> std::convertible_to<float>;
  { s.update(overflow) } -> std::same_as<bool>;
};

//! DeepSpeed's dynamic loss scaler (runtime/fp16/loss_scaler.py, DynamicLossScaler), same
//! defaults and semantics. update(overflow) is called once per step with the overflow verdict
//! agreed by all ranks; it returns whether the step is applied (false: skip it).
//!
//!   trident::dynamic_loss_scaler scaler;          // 65536
//!   loss_gradient *= scaler.scale();                     // before backward
//!   bool apply = scaler.update(any_rank_overflowed);     // after the gradients are checked
struct dynamic_loss_scaler {
  struct options {
    float initial_scale = 65536.0f;  // 2^16
    float factor = 2.0f;
    std::int64_t window = 1000;      // clean steps before the scale grows
    int hysteresis = 2;              // overflows tolerated before the scale shrinks
    float min_scale = 1.0f;
    bool consecutive_hysteresis = false;  // refill the hysteresis on every clean step
  };

  dynamic_loss_scaler() : dynamic_loss_scaler(options{}) {}
  explicit dynamic_loss_scaler(options o) : opt_(o), scale_(o.initial_scale), hysteresis_(o.hysteresis) {
    TRIDENT_EXPECT(o.initial_scale > 0 && o.factor > 1 && o.window >= 1 && o.hysteresis >= 1 && o.min_scale > 0,
                   "dynamic_loss_scaler: expected initial_scale > 0, factor > 1, window >= 1, hysteresis >= 1 and "
                   "min_scale > 0");
  }

  float scale() const noexcept { return scale_; }
  int hysteresis_left() const noexcept { return hysteresis_; }

  bool update(bool overflow) noexcept {
    if (overflow) {
      if (opt_.hysteresis == 1 || hysteresis_ == 1) scale_ = std::max(scale_ / opt_.factor, opt_.min_scale);
      else --hysteresis_;
      last_overflow_ = iteration_;
    } else {
      if (opt_.consecutive_hysteresis) hysteresis_ = opt_.hysteresis;
      if ((iteration_ - last_overflow_) % opt_.window == 0) {
        if (!opt_.consecutive_hysteresis) hysteresis_ = opt_.hysteresis;
        scale_ *= opt_.factor;
      }
    }
    ++iteration_;
    return !overflow;
  }

 private:
  options opt_;
  float scale_;
  int hysteresis_;
  std::int64_t iteration_ = 0;
  std::int64_t last_overflow_ = -1;
};

//! A fixed loss scale (1 = no scaling). Steps with non-finite gradients are still skipped.
struct static_loss_scaler {
  float value = 1.0f;
  float scale() const noexcept { return value; }
  bool update(bool overflow) noexcept { return !overflow; }
};

static_assert(loss_scaler<dynamic_loss_scaler> && loss_scaler<static_loss_scaler>);

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

}  // namespace trident
