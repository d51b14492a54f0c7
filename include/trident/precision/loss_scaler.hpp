// trident/precision/loss_scaler.hpp — loss scaling for fp16 training: how big the loss is made
// before backward so small gradients do not flush to zero, and when a step is skipped.
//
// Synopsis
//   concept loss_scaler<S>         scale() -> convertible to double, update(bool overflow) -> bool
//   struct dynamic_loss_scaler      DeepSpeed's DynamicLossScaler, step for step
//     struct options                initial_scale 2^16, factor 2, window 1000, hysteresis 2,
//                                   min_scale 1, consecutive_hysteresis false,
//                                   raise_error_at_min_scale true, max_scale 2^127
//   struct static_loss_scaler       a fixed scale; overflowing steps are still skipped
//   class loss_scale_error          overflow at the minimum scale (DeepSpeed raises there too)
//   struct loss_scaler_state        what a checkpoint saves of a scaler (restorable_loss_scaler)
//
// A type opts in to `loss_scaler` with a const scale() (the factor the loss is multiplied by
// before backward) and update(overflow), called once per step with the overflow verdict agreed
// by every rank, returning whether the step is applied (false: skip it).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <source_location>
#include <string_view>

#include "trident/core/error.hpp"

namespace trident {

template <class S>
concept loss_scaler = requires(S& s, const S& cs, bool overflow) {
  { cs.scale() } -> std::convertible_to<double>;
  { s.update(overflow) } -> std::same_as<bool>;
};

//! What a checkpoint keeps of a loss scaler, so that a resumed run scales and skips exactly as
//! an uninterrupted one (DeepSpeed saves the same four values: cur_scale, cur_hysteresis,
//! cur_iter, last_overflow_iter).
struct loss_scaler_state {
  double scale = 1.0;
  int hysteresis = 0;
  std::int64_t iteration = 0;
  std::int64_t last_overflow = -1;
};

//! A loss scaler whose state a checkpoint can save and restore: state() and restore(s), which
//! checks what it is given. Both scalers below opt in.
template <class S>
concept restorable_loss_scaler = loss_scaler<S> && requires(S& s, const S& cs, const loss_scaler_state& st) {
  { cs.state() } -> std::same_as<loss_scaler_state>;
  s.restore(st);
};

//! The loss overflowed although its scale is already at the minimum: training cannot go on by
//! lowering the scale any more (the loss or the model itself produces inf/NaN).
class loss_scale_error : public error {
 public:
  explicit loss_scale_error(std::string_view message, std::string_view operation = {},
                            std::source_location where = std::source_location::current())
      : error("trident loss scale error", message, operation, where) {}
};

//! DeepSpeed's dynamic loss scaler (deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler,
//! as in DeepSpeed 0.17.1 and later), step for step: the same scale, hysteresis and skipped steps
//! for every overflow pattern (tests/precision checks traces recorded from DeepSpeed itself):
//!
//!   overflow:  if hysteresis == 1 (or it is used up): scale = max(scale / factor, min_scale),
//!              or raise loss_scale_error when the scale already is min_scale (and
//!              raise_error_at_min_scale); otherwise hysteresis -= 1. The step is skipped.
//!   clean:     with consecutive_hysteresis, hysteresis is refilled. The scale grows by factor
//!              when the clean steps since the last overflow, not counting the first one, are a
//!              positive multiple of `window` (so first after window + 1 clean steps; before
//!              0.17.1 DeepSpeed grew one step earlier), refilling the hysteresis too.
//!
//! One difference, on purpose: DeepSpeed's scale is a Python float that keeps doubling through
//! long clean stretches until it is inf, and never comes back (inf / 2 is inf). Here it stops at
//! `max_scale` (2^127, the largest power of two a float holds), so scale() is always finite.
//!
//!   trident::dynamic_loss_scaler scaler;                 // 65536
//!   loss_gradient *= scaler.scale();                     // before backward
//!   bool apply = scaler.update(any_rank_overflowed);     // after the gradients are checked
struct dynamic_loss_scaler {
  struct options {
    double initial_scale = 65536.0;  // 2^16: DeepSpeed's fp16 initial_scale_power default
    double factor = 2.0;
    std::int64_t window = 1000;      // clean steps before the scale grows
    int hysteresis = 2;              // overflows tolerated before the scale shrinks (delayed_shift)
    double min_scale = 1.0;
    bool consecutive_hysteresis = false;  // refill the hysteresis on every clean step
    bool raise_error_at_min_scale = true;
    double max_scale = 0x1p127;  // not in DeepSpeed: keeps the scale finite
  };

  dynamic_loss_scaler() : dynamic_loss_scaler(options{}) {}
  explicit dynamic_loss_scaler(options o) : opt_(o), scale_(o.initial_scale), hysteresis_(o.hysteresis) {
    auto finite_positive = [](double x) { return std::isfinite(x) && x > 0; };
    TRIDENT_EXPECT(finite_positive(o.initial_scale), "dynamic_loss_scaler: initial_scale must be positive and finite, got ",
                   o.initial_scale);
    TRIDENT_EXPECT(std::isfinite(o.factor) && o.factor > 1, "dynamic_loss_scaler: factor must be finite and > 1, got ", o.factor);
    TRIDENT_EXPECT(o.window >= 1, "dynamic_loss_scaler: window must be >= 1, got ", o.window);
    TRIDENT_EXPECT(o.hysteresis >= 1, "dynamic_loss_scaler: hysteresis must be >= 1, got ", o.hysteresis);
    TRIDENT_EXPECT(finite_positive(o.min_scale), "dynamic_loss_scaler: min_scale must be positive and finite, got ", o.min_scale);
    TRIDENT_EXPECT(finite_positive(o.max_scale) && o.max_scale <= 0x1p127 && o.max_scale >= o.min_scale,
                   "dynamic_loss_scaler: max_scale must be in [min_scale, 2^127], got ", o.max_scale);
    TRIDENT_EXPECT(o.initial_scale >= o.min_scale && o.initial_scale <= o.max_scale, "dynamic_loss_scaler: initial_scale ",
                   o.initial_scale, " is outside [min_scale, max_scale] = [", o.min_scale, ", ", o.max_scale, "]");
  }

  //! The factor the loss is multiplied by before backward (exact: a power of the factor times
  //! the initial scale, as in DeepSpeed's Python float).
  double scale() const noexcept { return scale_; }
  //! Overflows still tolerated before the scale shrinks (DeepSpeed's cur_hysteresis).
  int hysteresis_left() const noexcept { return hysteresis_; }
  //! Steps seen so far (DeepSpeed's cur_iter).
  std::int64_t iteration() const noexcept { return iteration_; }
  const options& settings() const noexcept { return opt_; }

  //! The state a checkpoint saves; restore() puts it back (the options stay this scaler's own).
  loss_scaler_state state() const noexcept { return {scale_, hysteresis_, iteration_, last_overflow_}; }
  void restore(const loss_scaler_state& s) {
    TRIDENT_EXPECT(std::isfinite(s.scale) && s.scale >= opt_.min_scale && s.scale <= opt_.max_scale,
                   "dynamic_loss_scaler::restore: scale ", s.scale, " is outside [min_scale, max_scale] = [", opt_.min_scale,
                   ", ", opt_.max_scale, "]");
    TRIDENT_EXPECT(s.hysteresis >= 1 && s.hysteresis <= opt_.hysteresis, "dynamic_loss_scaler::restore: hysteresis ",
                   s.hysteresis, " is outside [1, ", opt_.hysteresis, "]");
    TRIDENT_EXPECT(s.iteration >= 0 && s.last_overflow >= -1 && s.last_overflow < s.iteration,
                   "dynamic_loss_scaler::restore: expected 0 <= iteration and -1 <= last_overflow < iteration, got iteration ",
                   s.iteration, " and last_overflow ", s.last_overflow);
    scale_ = s.scale;
    hysteresis_ = s.hysteresis;
    iteration_ = s.iteration;
    last_overflow_ = s.last_overflow;
  }

  //! Takes this step's overflow verdict (the same on every rank) and returns whether the step
  //! is applied. Throws loss_scale_error on an overflow at min_scale when
  //! raise_error_at_min_scale is set (the state is left as it was, as in DeepSpeed).
  bool update(bool overflow) {
    if (overflow) {
      if (opt_.hysteresis == 1 || hysteresis_ == 1) {
        if (scale_ == opt_.min_scale && opt_.raise_error_at_min_scale) {
          throw loss_scale_error(detail::concat("the gradients overflowed at step ", iteration_,
                                                " although the loss scale is already at its minimum (", opt_.min_scale,
                                                "); the loss or the model produces inf/NaN by itself. Set "
                                                "raise_error_at_min_scale = false to keep skipping steps instead"),
                                 "dynamic_loss_scaler::update");
        }
        scale_ = std::max(scale_ / opt_.factor, opt_.min_scale);
      } else {
        --hysteresis_;
      }
      last_overflow_ = iteration_;
    } else {
      if (opt_.consecutive_hysteresis) hysteresis_ = opt_.hysteresis;
      const std::int64_t stable = iteration_ - last_overflow_ - 1;
      if (stable > 0 && stable % opt_.window == 0) {
        if (!opt_.consecutive_hysteresis) hysteresis_ = opt_.hysteresis;
        scale_ = std::min(scale_ * opt_.factor, opt_.max_scale);
      }
    }
    ++iteration_;
    return !overflow;
  }

 private:
  options opt_;
  double scale_;
  int hysteresis_;
  std::int64_t iteration_ = 0;
  std::int64_t last_overflow_ = -1;
};

//! A fixed loss scale (1 = no scaling). Steps with non-finite gradients are still skipped.
struct static_loss_scaler {
  double value = 1.0;
  double scale() const noexcept { return value; }
  bool update(bool overflow) noexcept { return !overflow; }
  loss_scaler_state state() const noexcept { return {value, 0, 0, -1}; }
  //! The scale is the configuration itself: a checkpoint of another scale is refused, not adopted.
  void restore(const loss_scaler_state& s) const {
    TRIDENT_EXPECT(s.scale == value, "static_loss_scaler::restore: the checkpoint was saved with a loss scale of ", s.scale,
                   ", this scaler's is ", value, "; a static scale is configuration, so set it to match");
  }
};

static_assert(restorable_loss_scaler<dynamic_loss_scaler> && restorable_loss_scaler<static_loss_scaler>);

}  // namespace trident
