// trident/optim/schedule.hpp — learning-rate schedules: small value types mapping the optimizer
// step number (1 on the first step) to the learning rate that step uses.
//
// Synopsis
//   concept lr_schedule<S>            s(step) -> double, step >= 1
//   DeepSpeed's (deepspeed/runtime/lr_schedules.py), as its engine drives them:
//     struct warmup_lr                WarmupLR: min_lr -> max_lr over warmup_steps (log or linear),
//                                     then max_lr
//     struct warmup_decay_lr          WarmupDecayLR: the same warm-up, then linear decay to 0 at
//                                     total_steps
//     struct warmup_cosine_lr         WarmupCosineLR: ratio warmup_min_ratio -> 1 over warmup_steps,
//                                     then cosine down to cos_min_ratio at total_steps, times lr
//   PyTorch's (torch.optim.lr_scheduler), stepped once after every optimizer step:
//     struct constant_lr              ConstantLR with factor 1 (or no scheduler)
//     struct linear_warmup_lr         LinearLR(start_factor, end_factor = 1, warmup_steps)
//     struct constant_factor_lr       ConstantLR(factor, total_iters): lr x factor, then lr
//     struct warmup_cosine_decay_lr   SequentialLR([LinearLR warm-up, CosineAnnealingLR(T_max, eta_min)])
//     struct warmup_linear_decay_lr   SequentialLR([LinearLR warm-up, LinearLR(1, end_factor, decay_steps)])
//   template <optimizer Opt, lr_schedule S> struct scheduled
//                                     an optimizer whose lr follows S (use it wherever Opt goes,
//                                     e.g. zero_optimizer<2, scheduled<adamw, warmup_cosine_lr>, ...>)
//
// Where DeepSpeed and PyTorch differ (each type follows its own library; the traces in
// tests/fixtures/lr_schedules.txt were recorded from both):
//   * DeepSpeed's schedulers set the lr for "iteration -1" when they are made and the engine
//     steps them after each optimizer step, so optimizer step k uses the value of iteration
//     k - 2: the first step runs at the starting value (warmup_min_lr; for WarmupCosineLR lr x 0,
//     i.e. no update at all), and the warm-up reaches its top one step later than it names.
//     PyTorch's step k uses the value of epoch k - 1, starting at the start factor.
//   * DeepSpeed warms up logarithmically by default (log(i + 1) / log(warmup_steps)) and treats
//     warmup_steps < 2 as 2; PyTorch warms up linearly.
//   * DeepSpeed's decays reach their floor at total_steps, counted from the start of training,
//     and stay there; PyTorch's linear decay at warmup_steps + decay_steps, while its cosine
//     (CosineAnnealingLR) is periodic and rises again after decay_steps. DeepSpeed's cosine
//     floor is a ratio of lr (cos_min_ratio); PyTorch's is an absolute eta_min.
//   * PyTorch computes each lr from the previous one (its "chainable" form), so its values can
//     differ from these closed forms in the last few bits (relative 1e-15).
// All arithmetic is in double, like Python's; an optimizer whose lr is a float rounds it once.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <numbers>
#include <tuple>
#include <utility>

#include "trident/core/error.hpp"

namespace trident::optim {

//! A type opts in with a const call operator from the 1-based optimizer step to the lr.
template <class S>
concept lr_schedule = std::copy_constructible<S> && requires(const S& s, std::int64_t step) {
  { s(step) } -> std::convertible_to<double>;
};

enum class warmup_kind { log, linear };

namespace detail {

inline void check_step_number(const char* who, std::int64_t step) {
  TRIDENT_EXPECT(step >= 1, who, ": the step number is 1-based (1 on the first optimizer step), got ", step);
}
inline void check_lr(const char* who, const char* name, double value) {
  TRIDENT_EXPECT(std::isfinite(value) && value >= 0, who, ": ", name, " must be finite and >= 0, got ", value);
}

// DeepSpeed's warm-up fraction at iteration i (0 <= i < warmup_steps, warmup_steps >= 2).
inline double deepspeed_warmup_gamma(warmup_kind kind, std::int64_t i, std::int64_t warmup_steps) {
  if (kind == warmup_kind::log) return (1.0 / std::log(static_cast<double>(warmup_steps))) * std::log(static_cast<double>(i + 1));
  return static_cast<double>(i) / static_cast<double>(warmup_steps);
}

}  // namespace detail

//! A constant learning rate.
//!
//!   trident::optim::scheduled<trident::optim::adamw, trident::optim::constant_lr> opt{{}, {3e-4}};
struct constant_lr {
  double lr = 1e-3;
  double operator()(std::int64_t step) const {
    detail::check_step_number("constant_lr", step);
    detail::check_lr("constant_lr", "lr", lr);
    return lr;
  }
};

//! DeepSpeed's WarmupLR: from min_lr to max_lr over warmup_steps iterations, logarithmically
//! (default) or linearly, then max_lr. Step k uses iteration k - 2 (see the header comment).
//!
//!   trident::optim::warmup_lr s{.min_lr = 0, .max_lr = 1e-3, .warmup_steps = 1000};
struct warmup_lr {
  double min_lr = 0.0;
  double max_lr = 1e-3;
  std::int64_t warmup_steps = 1000;
  warmup_kind kind = warmup_kind::log;

  double operator()(std::int64_t step) const { return min_lr + (max_lr - min_lr) * gamma(step); }

 protected:
  std::int64_t iteration(const char* who, std::int64_t step) const {
    detail::check_step_number(who, step);
    detail::check_lr(who, "min_lr", min_lr);
    detail::check_lr(who, "max_lr", max_lr);
    TRIDENT_EXPECT(warmup_steps >= 0, who, ": warmup_steps must be >= 0, got ", warmup_steps);
    return step - 2;
  }
  std::int64_t effective_warmup() const noexcept { return std::max<std::int64_t>(2, warmup_steps); }
  double gamma(std::int64_t step) const {
    const std::int64_t i = iteration("warmup_lr", step);
    if (i < 0) return 0.0;  // the value set when the scheduler is made: min_lr
    if (i < effective_warmup()) return detail::deepspeed_warmup_gamma(kind, i, effective_warmup());
    return 1.0;
  }
};

//! DeepSpeed's WarmupDecayLR: WarmupLR's warm-up, then a linear decay that reaches 0 at
//! total_steps (iterations counted from the start of training).
struct warmup_decay_lr : warmup_lr {
  std::int64_t total_steps = 10000;

  double operator()(std::int64_t step) const {
    const std::int64_t i = iteration("warmup_decay_lr", step);
    TRIDENT_EXPECT(total_steps >= 1, "warmup_decay_lr: total_steps must be >= 1, got ", total_steps);
    double g = 0.0;
    if (i < 0) g = 0.0;
    else if (i < effective_warmup()) g = detail::deepspeed_warmup_gamma(kind, i, effective_warmup());
    else
      g = std::max(0.0, static_cast<double>(total_steps - i) /
                            std::max(1.0, static_cast<double>(total_steps - effective_warmup())));
    return min_lr + (max_lr - min_lr) * g;
  }
};

//! DeepSpeed's WarmupCosineLR: lr times a ratio that rises from warmup_min_ratio to 1 over
//! warmup_steps (log or linear), then follows a cosine down to cos_min_ratio at total_steps and
//! stays there. The scheduler is made at "iteration -1", whose ratio is 0: the first optimizer
//! step runs with lr 0, as in DeepSpeed.
struct warmup_cosine_lr {
  double lr = 1e-3;  // the optimizer's lr when the scheduler is made (DeepSpeed's org_lrs)
  std::int64_t total_steps = 10000;
  double warmup_min_ratio = 0.0;
  std::int64_t warmup_steps = 1000;
  double cos_min_ratio = 1e-4;
  warmup_kind kind = warmup_kind::log;

  double operator()(std::int64_t step) const { return lr * ratio(step); }

  double ratio(std::int64_t step) const {
    detail::check_step_number("warmup_cosine_lr", step);
    detail::check_lr("warmup_cosine_lr", "lr", lr);
    TRIDENT_EXPECT(warmup_steps >= 1, "warmup_cosine_lr: warmup_steps must be >= 1, got ", warmup_steps);
    TRIDENT_EXPECT(total_steps >= 0, "warmup_cosine_lr: total_steps must be >= 0, got ", total_steps);
    TRIDENT_EXPECT(warmup_min_ratio >= 0 && warmup_min_ratio <= 1, "warmup_cosine_lr: warmup_min_ratio must be in [0, 1], got ",
                   warmup_min_ratio);
    TRIDENT_EXPECT(cos_min_ratio >= 0 && cos_min_ratio <= 1, "warmup_cosine_lr: cos_min_ratio must be in [0, 1], got ",
                   cos_min_ratio);
    const std::int64_t i = step - 2;
    if (i < 0) return 0.0;
    const std::int64_t warm = std::max<std::int64_t>(2, warmup_steps);
    if (i < warm) return warmup_min_ratio + detail::deepspeed_warmup_gamma(kind, i, warm) * (1.0 - warmup_min_ratio);
    const double real_last = static_cast<double>(i - warm + 1);
    const double real_total = static_cast<double>(std::max<std::int64_t>(1, total_steps - warm));
    const double progress = std::min(1.0, real_last / real_total);
    const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    return std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * cosine);
  }
};

//! PyTorch's LinearLR(start_factor, end_factor = 1, total_iters = warmup_steps) stepped after
//! every optimizer step: step k uses lr x (start + (1 - start) x min(k - 1, warmup_steps) /
//! warmup_steps).
struct linear_warmup_lr {
  double lr = 1e-3;
  double start_factor = 1.0 / 3.0;  // PyTorch's default
  std::int64_t warmup_steps = 5;    // PyTorch's default total_iters
  double end_factor = 1.0;

  double operator()(std::int64_t step) const { return lr * factor(step); }
  double factor(std::int64_t step) const {
    detail::check_step_number("linear_warmup_lr", step);
    detail::check_lr("linear_warmup_lr", "lr", lr);
    TRIDENT_EXPECT(start_factor > 0 && start_factor <= 1, "linear_warmup_lr: start_factor must be in (0, 1], got ",
                   start_factor);
    TRIDENT_EXPECT(end_factor >= 0 && end_factor <= 1, "linear_warmup_lr: end_factor must be in [0, 1], got ", end_factor);
    TRIDENT_EXPECT(warmup_steps >= 1, "linear_warmup_lr: warmup_steps must be >= 1, got ", warmup_steps);
    const auto e = std::min(step - 1, warmup_steps);
    return start_factor + (end_factor - start_factor) * static_cast<double>(e) / static_cast<double>(warmup_steps);
  }
};

//! PyTorch's ConstantLR(factor, total_iters): lr x factor for the first total_iters steps, then lr.
struct constant_factor_lr {
  double lr = 1e-3;
  double factor = 1.0 / 3.0;       // PyTorch's default
  std::int64_t total_iters = 5;    // PyTorch's default

  double operator()(std::int64_t step) const {
    detail::check_step_number("constant_factor_lr", step);
    detail::check_lr("constant_factor_lr", "lr", lr);
    TRIDENT_EXPECT(factor >= 0 && factor <= 1, "constant_factor_lr: factor must be in [0, 1], got ", factor);
    TRIDENT_EXPECT(total_iters >= 0, "constant_factor_lr: total_iters must be >= 0, got ", total_iters);
    return step - 1 < total_iters ? lr * factor : lr;
  }
};

namespace detail {
// PyTorch's SequentialLR([warm-up, decay], milestones=[warmup_steps]): the warm-up while
// step - 1 < warmup_steps, then decay(t) with t = step - 1 - warmup_steps (its epoch from 0).
template <class Decay>
double torch_sequential(const char* who, const linear_warmup_lr& warmup, std::int64_t decay_steps, std::int64_t step,
                        Decay decay) {
  check_step_number(who, step);
  check_lr(who, "lr", warmup.lr);  // the decay's start: checked in the decay as in the warm-up
  TRIDENT_EXPECT(warmup.warmup_steps >= 0, who, ": warmup_steps must be >= 0, got ", warmup.warmup_steps);
  TRIDENT_EXPECT(decay_steps >= 1, who, ": decay_steps must be >= 1, got ", decay_steps);
  if (step - 1 < warmup.warmup_steps) return warmup(step);
  return decay(static_cast<double>(step - 1 - warmup.warmup_steps));
}
}  // namespace detail

//! PyTorch's SequentialLR of a LinearLR warm-up (warmup_steps) and a CosineAnnealingLR(T_max =
//! decay_steps, eta_min): step k uses the warm-up while k - 1 < warmup_steps, then
//! eta_min + (lr - eta_min)(1 + cos(pi t / decay_steps)) / 2 with t = k - 1 - warmup_steps
//! (which, like PyTorch's, rises again after decay_steps: a cosine period, not a floor).
struct warmup_cosine_decay_lr {
  double lr = 1e-3;
  double start_factor = 1.0 / 3.0;
  std::int64_t warmup_steps = 5;
  std::int64_t decay_steps = 1000;
  double eta_min = 0.0;

  double operator()(std::int64_t step) const {
    detail::check_lr("warmup_cosine_decay_lr", "eta_min", eta_min);
    return detail::torch_sequential("warmup_cosine_decay_lr", {lr, start_factor, warmup_steps, 1.0}, decay_steps, step,
                                    [&](double t) {
                                      return eta_min + (lr - eta_min) *
                                                           (1.0 + std::cos(std::numbers::pi * t / static_cast<double>(decay_steps))) / 2.0;
                                    });
  }
};

//! PyTorch's SequentialLR of a LinearLR warm-up and a LinearLR(1, end_factor, decay_steps)
//! decay: after the warm-up, lr x (1 + (end_factor - 1) x min(t, decay_steps) / decay_steps).
struct warmup_linear_decay_lr {
  double lr = 1e-3;
  double start_factor = 1.0 / 3.0;
  std::int64_t warmup_steps = 5;
  std::int64_t decay_steps = 1000;
  double end_factor = 0.0;

  double operator()(std::int64_t step) const {
    TRIDENT_EXPECT(end_factor >= 0 && end_factor <= 1, "warmup_linear_decay_lr: end_factor must be in [0, 1], got ",
                   end_factor);
    return detail::torch_sequential("warmup_linear_decay_lr", {lr, start_factor, warmup_steps, 1.0}, decay_steps, step,
                                    [&](double t) {
                                      return lr * (1.0 + (end_factor - 1.0) * std::min(t, static_cast<double>(decay_steps)) /
                                                             static_cast<double>(decay_steps));
                                    });
  }
};

static_assert(lr_schedule<constant_lr> && lr_schedule<constant_factor_lr> && lr_schedule<warmup_lr> && lr_schedule<warmup_decay_lr> &&
              lr_schedule<warmup_cosine_lr> && lr_schedule<linear_warmup_lr> && lr_schedule<warmup_cosine_decay_lr> &&
              lr_schedule<warmup_linear_decay_lr>);

//! An optimizer whose learning rate follows a schedule: each step sets opt.lr = schedule(step)
//! on a copy of the optimizer and runs it, so it goes wherever Opt goes (the host step, the
//! CUDA step through visit_update, zero_optimizer), and the step number that already drives
//! the bias corrections drives the schedule too.
//!
//!   using opt_t = trident::optim::scheduled<trident::optim::adamw, trident::optim::warmup_cosine_decay_lr>;
//!   opt_t opt{{.opt = {.weight_decay = 0.1f}}, {.lr = 6e-4, .warmup_steps = 700, .decay_steps = 19000}};
template <class Opt, lr_schedule Schedule>
struct scheduled : Opt {
  using options = typename Opt::options;
  static constexpr std::size_t state_count = Opt::state_count;
  Schedule schedule{};

  scheduled() = default;
  scheduled(Opt optimizer, Schedule s) : Opt(std::move(optimizer)), schedule(std::move(s)) {}

  //! The optimizer as it runs at `step` (its lr set from the schedule).
  Opt at(std::int64_t step) const {
    Opt o = static_cast<const Opt&>(*this);
    o.opt.lr = static_cast<decltype(o.opt.lr)>(schedule(step));
    return o;
  }
  template <class... Args>
  void step(Args&&... args) const {
    // step(params, grads, state, step_number, ...): the step number is the fourth argument.
    forward_step(std::forward_as_tuple(std::forward<Args>(args)...), std::index_sequence_for<Args...>{});
  }
  // Only where Opt has one (an optimizer without it, a plain host loop, stays usable).
  template <class F>
    requires requires(const Opt& o, std::int64_t t, F&& f) { o.visit_update(t, std::forward<F>(f)); }
  decltype(auto) visit_update(std::int64_t step_number, F&& f) const {
    return at(step_number).visit_update(step_number, std::forward<F>(f));
  }

 private:
  template <class Tuple, std::size_t... I>
  void forward_step(Tuple&& args, std::index_sequence<I...>) const {
    static_assert(sizeof...(I) >= 4, "scheduled::step: expected (params, grads, state, step_number, ...)");
    at(static_cast<std::int64_t>(std::get<3>(args))).step(std::get<I>(std::forward<Tuple>(args))...);
  }
};

}  // namespace trident::optim
