// trident/optim/optimizers.hpp — element-wise optimizers (SGD, Adam, AdamW) over flat fp32 shards.
//
// Synopsis
//   namespace trident::optim
//     struct sgd   { struct options; options opt; state_count = 1 (momentum buffer);     step(...) }
//     struct adam  { struct options; options opt; state_count = 2 (exp_avg, exp_avg_sq); step(...) }
//     struct adamw { same as adam, weight decay decoupled (default 1e-2) }
//     adam_amsgrad, adamw_amsgrad         amsgrad=True: state_count = 3 (+ max_exp_avg_sq)
//       (all four are basic_adam<Decoupled, AMSGrad>)
//     concept optimizer<O>                 how a type opts in (see below)
//     concept elementwise_optimizer<O>     + visit_update: what the CUDA step (optim/cuda/step.cuh) needs
//     concept deferrable_optimizer<O>      + static dispatch(options, t, f), host and device: what a
//                                          deferred step (step number and decision in device memory) needs
//     struct deferred_decision             where such a step reads apply, step number and multiplier
//     struct grad_stats { double sum_squares; bool finite; }
//     grad_stats gradient_stats(std::span<const Grad> grads, float multiplier = 1)
//     float clip_multiplier(double global_norm, float max_norm)
//
// Hyperparameters are checked once per step, with torch.optim's ranges (lr, eps, weight_decay,
// momentum >= 0; betas in [0, 1); every value finite): a NaN or negative lr is a usage_error
// naming it, not NaN parameters.
//
//   o.step(params, grads, state, step_number, grad_multiplier = 1, working_copy = {})
//     (grads may also be any contiguous range, e.g. a std::vector<float>)
//     params        std::span<float>                 fp32 values updated in place (master weights)
//     grads         std::span<const Grad>            Grad = float, fp16 or bf16
//     state         std::array<std::span<float>, O::state_count>, each params.size() long
//     step_number   1 on the first step (bias corrections, SGD's first momentum step)
//     grad_multiplier  applied to every gradient first (in float): mixed precision's unscale and
//                   global-norm clipping fused into the step, no extra pass over the gradients
//     working_copy  empty, or params.size() elements: the updated params rounded to Working
//                   (fp16/bf16 working weights of mixed precision)
//
// The update rules are PyTorch's formulas (torch/optim/sgd.py `_single_tensor_sgd`, adam.py
// `_single_tensor_adam`, adamw.py `_single_tensor_adamw`, amsgrad included): per-step scalars
// (bias corrections, step size) are computed in double as Python does and rounded to float once;
// the element-wise arithmetic is float. Where our rounding differs from torch's CPU kernels (as
// recorded from torch itself, tests/fixtures/README.md): torch fuses `add(x, alpha=a)`, `lerp_`
// (the first moment) and `addcmul_` (the second) into fused multiply-adds, one rounding each,
// where we round the multiply and the add separately; torch's float32 sqrt on the CPU is not
// always correctly rounded (1 ulp off for ~18% of inputs), ours is. `addcdiv_` is unfused in both.
// Over 200 steps the results stay within 1e-5 relative of torch's float32 for Adam, AdamW and
// AMSGrad, 1e-4 for SGD (optim.schedule). We keep separate roundings so that the CUDA kernel,
// where FMA is a choice too, gives the same bits as the host. The same element functions run on the host and in the CUDA kernels
// (optim/cuda/step.cuh), where every operation is an explicitly rounded intrinsic (no FMA
// contraction), so host and device agree bitwise (NaN payloads aside). On x86-64 the host step
// runs AVX-512 or AVX2 code chosen at run time (optim/host_simd.hpp), compiled without FMA
// contraction whatever the flags; the portable tiles below, which run elsewhere, agree bitwise
// unless the compiler contracts them into FMA (g++ does in GNU mode with -mfma or -march=native)
// — within an ulp or two then.
//
// The host step splits the elements, above 2^18 of them, over up to hardware_concurrency
// threads of the program's thread_pool (exec/thread_pool.hpp) in contiguous ranges. Each range
// is one fused pass (every array read and written once per element) on the AVX-512 / AVX2 path
// when the CPU has it (__builtin_cpu_supports, asked once), else tiles of 1024 elements
// (fixed-length loops that g++ -O2 vectorises at SSE width). Each element's arithmetic is the
// same whatever the split and the path, so results are bitwise identical for any thread count,
// call chunking or CPU.
//
// Opting in (concept optimizer): a type O with
//   typename O::options; an `opt` member of that type;
//   static constexpr std::size_t state_count (fp32 state values per parameter);
//   a const member `step` with the signature above, for float, fp16 and bf16 gradients.
// elementwise_optimizer adds `visit_update(step_number, f)`, which calls f with an element
// functor (trivially copyable, TRIDENT_HOST_DEVICE operator()(p, g, s0, s1)); the CUDA step is
// one kernel over that functor.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ranges>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/core/error.hpp"
#include "trident/core/half.hpp"
#include "trident/core/memory_space.hpp"
#include "trident/exec/thread_pool.hpp"
#include "trident/optim/host_simd.hpp"

// The tiles' square roots: std::sqrt may set errno, which keeps g++ from vectorising it (and
// no per-function option lifts that in a header), so the full tiles take the SIMD square root,
// which is IEEE correctly rounded like sqrtf, hence bitwise the same. Not under nvcc: its
// device pass must not see host intrinsics; there the host step simply runs scalar sqrt.
#if !defined(__CUDACC__) && (defined(__SSE2__) || defined(_M_X64))
#include <immintrin.h>
#define TRIDENT_DETAIL_SQRT_SSE 1
#elif !defined(__CUDACC__) && defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define TRIDENT_DETAIL_SQRT_NEON 1
#endif

// "no loop-carried dependence": lets g++ vectorise the tile loops without alias versioning.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define TRIDENT_DETAIL_IVDEP _Pragma("GCC ivdep")
#else
#define TRIDENT_DETAIL_IVDEP
#endif

#if defined(__GNUC__) || defined(__clang__)
#define TRIDENT_DETAIL_RESTRICT __restrict__
#else
#define TRIDENT_DETAIL_RESTRICT __restrict
#endif

namespace trident::optim {

namespace detail {

// Explicitly rounded float operations: plain operators on the host; on the device the _rn
// intrinsics, which nvcc never contracts into FMA, so a kernel rounds exactly like the host.
TRIDENT_HOST_DEVICE inline float add_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TRIDENT_HOST_DEVICE inline float mul_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TRIDENT_HOST_DEVICE inline float div_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
TRIDENT_HOST_DEVICE inline float sqrt_rn(float a) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// ---- element functors: one parameter's update, shared by the host tiles and the CUDA kernel ----

//! SGD, as torch/optim/sgd.py `_single_tensor_sgd`:
//!   d_p = grad;  if weight_decay: d_p = d_p.add(param, alpha=weight_decay)
//!   if momentum: buf = clone(d_p) on the first step, else buf.mul_(momentum).add_(d_p, alpha=1 - dampening)
//!                d_p = d_p.add(buf, alpha=momentum) if nesterov else buf
//!   param.add_(d_p, alpha=-lr)
//! (the first step's buffer is the gradient itself: no dampening on it, as in PyTorch).
template <bool WeightDecay, bool Momentum, bool First, bool Nesterov>
struct sgd_update {
  static constexpr std::size_t states = Momentum ? 1 : 0;
  static constexpr bool uses_sqrt = false;
  float neg_lr;
  float weight_decay;
  float momentum;
  float one_minus_dampening;

  TRIDENT_HOST_DEVICE void operator()(float& p, float g, float& buf, float& /*unused*/) const noexcept {
    float d_p = g;
    if constexpr (WeightDecay) d_p = add_rn(d_p, mul_rn(weight_decay, p));
    if constexpr (Momentum) {
      if constexpr (First) buf = d_p;
      else buf = add_rn(mul_rn(buf, momentum), mul_rn(one_minus_dampening, d_p));
      if constexpr (Nesterov) d_p = add_rn(d_p, mul_rn(momentum, buf));
      else d_p = buf;
    }
    p = add_rn(p, mul_rn(neg_lr, d_p));
  }
};

//! Adam / AdamW, as torch/optim/adam.py `_single_tensor_adam` (non-capturable branch) and
//! adamw.py `_single_tensor_adamw`:
//!   AdamW: param.mul_(1 - lr * weight_decay)                  (Decoupled)
//!   Adam:  grad = grad.add(param, alpha=weight_decay)          (L2)
//!   exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
//!   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//!   bias_correction1 = 1 - beta1 ** step;  bias_correction2 = 1 - beta2 ** step
//!   step_size = lr / bias_correction1;     bias_correction2_sqrt = math.sqrt(bias_correction2)
//!   denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
//!   param.addcdiv_(exp_avg, denom, value=-step_size)
//! Split in two around the square root so that the host tiles can vectorise it (see above).
template <bool L2, bool Decoupled>
struct adam_update {
  static constexpr std::size_t states = 2;
  static constexpr bool uses_sqrt = true;
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float weight_decay;  // L2 coefficient (Adam)
  float decay;         // 1 - lr * weight_decay (AdamW)
  float neg_step_size;
  float bias_correction2_sqrt;
  float eps;

  //! Everything before the square root: weight decay and the two moments.
  TRIDENT_HOST_DEVICE void moments(float& p, float g, float& m, float& v) const noexcept {
    if constexpr (Decoupled) p = mul_rn(p, decay);
    if constexpr (L2) g = add_rn(g, mul_rn(weight_decay, p));
    m = add_rn(mul_rn(m, beta1), mul_rn(one_minus_beta1, g));
    v = add_rn(mul_rn(v, beta2), mul_rn(mul_rn(one_minus_beta2, g), g));
  }
  //! The parameter update, given sqrt(exp_avg_sq).
  TRIDENT_HOST_DEVICE void apply(float& p, float m, float sqrt_v) const noexcept {
    const float denom = add_rn(div_rn(sqrt_v, bias_correction2_sqrt), eps);
    p = add_rn(p, mul_rn(neg_step_size, div_rn(m, denom)));
  }
  TRIDENT_HOST_DEVICE void operator()(float& p, float g, float& m, float& v) const noexcept {
    moments(p, g, m, v);
    apply(p, m, sqrt_rn(v));
  }
};

//! AMSGrad (torch.optim.Adam / AdamW with amsgrad=True): the same moments, then
//!   torch.maximum(max_exp_avg_sqs[i], exp_avg_sq, out=max_exp_avg_sqs[i])
//!   denom = (max_exp_avg_sqs[i].sqrt() / bias_correction2_sqrt).add_(eps)
//! A third state, the running maximum of exp_avg_sq (zeroed before the first step); a NaN in
//! either operand gives NaN, as torch.maximum does. The host runs it element by element (no
//! SIMD path: it is not the common case), the CUDA kernel as every other functor.
template <bool L2, bool Decoupled>
struct amsgrad_update : adam_update<L2, Decoupled> {
  static constexpr std::size_t states = 3;

  TRIDENT_HOST_DEVICE void operator()(float& p, float g, float& m, float& v, float& v_max) const noexcept {
    this->moments(p, g, m, v);
    if (!(v_max != v_max)) v_max = (v != v || v > v_max) ? v : v_max;
    this->apply(p, m, sqrt_rn(v_max));
  }
};

// lr * weight_decay rounded before 1 - it, on the device too, where nvcc would contract the two
// into a fused multiply-add (one rounding) and differ from the host.
TRIDENT_HOST_DEVICE inline double mul_rn_double(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// TRIDENT_HOST_DEVICE: a deferred step (optim/cuda/step.cuh, cuda::step_deferred) builds the
// update inside the kernel from a step number kept in device memory. The device's pow is not
// glibc's (both within an ulp of the true double), so the float scalars can differ from the
// host's in rare last bits there.
TRIDENT_EXEC_CHECK_DISABLE
template <bool L2, bool Decoupled, bool AMSGrad = false, class Options, class F>
TRIDENT_HOST_DEVICE decltype(auto) visit_adam(const Options& o, std::int64_t step_number, F&& f) {
  // Python computes these scalars in double; the kernels receive them rounded to float.
  const double t = static_cast<double>(step_number);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(o.beta1), t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(o.beta2), t);
  const double lr = o.lr;
  std::conditional_t<AMSGrad, amsgrad_update<L2, Decoupled>, adam_update<L2, Decoupled>> u{};
  u.beta1 = o.beta1;
  u.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(o.beta1));
  u.beta2 = o.beta2;
  u.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(o.beta2));
  u.weight_decay = o.weight_decay;
  u.decay = static_cast<float>(1.0 - mul_rn_double(lr, static_cast<double>(o.weight_decay)));
  u.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  u.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  u.eps = o.eps;
  return std::forward<F>(f)(u);
}

// ---- argument checks ---------------------------------------------------------------------------

//! torch.optim's ranges, written so that NaN fails every one of them (a NaN lr trained to NaN
//! parameters without a word): a finite value in [low, high), or [low, high] when `closed`.
inline void check_option(const char* who, const char* name, double value, double low, double high, bool closed) {
  const bool ok = std::isfinite(value) && value >= low && (closed ? value <= high : value < high);
  TRIDENT_EXPECT(ok, who, ": ", name, " = ", value, " is out of range; expected a finite value in [", low, ", ", high,
                 closed ? "]" : ")");
}
template <class Options>
void check_adam_options(const char* who, const Options& o) {
  constexpr double inf = std::numeric_limits<double>::max();
  check_option(who, "lr", o.lr, 0, inf, true);
  check_option(who, "beta1", o.beta1, 0, 1, false);
  check_option(who, "beta2", o.beta2, 0, 1, false);
  check_option(who, "eps", o.eps, 0, inf, true);
  check_option(who, "weight_decay", o.weight_decay, 0, inf, true);
}

using trident::detail::overlaps;  // core/memory_space.hpp

//! Shared by the host and the CUDA step: sizes, step number and no overlap between the arrays
//! written (the kernels assume none: restrict).
template <class Grad, class Working, std::size_t States>
void check_step(const char* who, const float* params, std::size_t n, const Grad* grads, std::size_t grads_size,
                const std::array<float*, States>& state, const std::array<std::size_t, States>& state_sizes,
                std::size_t used_states, const Working* working, std::size_t working_size, std::int64_t step_number) {
  TRIDENT_EXPECT(grads_size == n, who, ": ", n, " parameters but ", grads_size, " gradients");
  for (std::size_t s = 0; s < used_states; ++s)
    TRIDENT_EXPECT(state_sizes[s] == n, who, ": state ", s, " has ", state_sizes[s], " elements, expected ", n,
                   " (one per parameter)");
  TRIDENT_EXPECT(working_size == 0 || working_size == n, who, ": the working copy has ", working_size,
                 " elements, expected 0 (none) or ", n);
  TRIDENT_EXPECT(step_number >= 1, who, ": step_number is 1-based (1 on the first step), got ", step_number);
  const std::size_t bytes = n * sizeof(float);
  for (std::size_t s = 0; s < used_states; ++s) {
    TRIDENT_EXPECT(!overlaps(params, bytes, state[s], bytes), who, ": state ", s, " overlaps the parameters");
    TRIDENT_EXPECT(!overlaps(grads, n * sizeof(Grad), state[s], bytes), who, ": state ", s, " overlaps the gradients");
    for (std::size_t r = s + 1; r < used_states; ++r)
      TRIDENT_EXPECT(!overlaps(state[r], bytes, state[s], bytes), who, ": states ", s, " and ", r, " overlap");
  }
  TRIDENT_EXPECT(!overlaps(params, bytes, grads, n * sizeof(Grad)), who, ": the gradients overlap the parameters");
  if (working_size != 0) {
    TRIDENT_EXPECT(!overlaps(params, bytes, working, n * sizeof(Working)), who,
                   ": the working copy overlaps the parameters");
    TRIDENT_EXPECT(!overlaps(grads, n * sizeof(Grad), working, n * sizeof(Working)), who,
                   ": the working copy overlaps the gradients");
  }
}

template <class T>
inline constexpr bool is_grad_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, trident::fp16> || std::is_same_v<T, trident::bf16>;

// ---- host execution: tiles and threads ---------------------------------------------------------

inline constexpr std::size_t tile_size = 1024;
inline constexpr std::size_t parallel_threshold = std::size_t{1} << 18;
inline constexpr std::size_t min_per_thread = std::size_t{1} << 16;

//! How many threads the host step uses for n elements: 1 below parallel_threshold, else up to
//! hardware_concurrency, at least min_per_thread elements each.
inline unsigned worker_count(std::size_t n) noexcept {
  if (n < parallel_threshold) return 1;
  const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(hw, n / min_per_thread)));
}

//! fn(begin, end) over contiguous ranges covering [0, n), each starting on a multiple of
//! `granule`, on the program's thread pool (the calling thread included). fn must not throw.
template <class Fn>
void parallel_ranges(std::size_t n, std::size_t granule, const Fn& fn) {
  const unsigned workers = worker_count(n);
  if (workers <= 1) {
    if (n != 0) fn(std::size_t{0}, n);
    return;
  }
  const std::size_t granules = (n + granule - 1) / granule;
  const std::size_t per = (granules + workers - 1) / workers * granule;
  // The ranges are fixed by n alone, so which thread runs one changes nothing in the result.
  // The program's pool runs them: no thread is started per step.
  thread_pool::shared().parallel_for(workers, [&](std::size_t w) {
    const std::size_t begin = std::min(n, w * per);
    const std::size_t end = std::min(n, begin + per);
    if (begin < end) fn(begin, end);
  });
}

template <class Grad>
void load_grads(float* TRIDENT_DETAIL_RESTRICT out, const Grad* TRIDENT_DETAIL_RESTRICT in, std::size_t len,
                float multiplier) noexcept {
  if (len == tile_size) {
    for (std::size_t i = 0; i < tile_size; ++i) out[i] = static_cast<float>(in[i]) * multiplier;
  } else {
    for (std::size_t i = 0; i < len; ++i) out[i] = static_cast<float>(in[i]) * multiplier;
  }
}

template <class Working>
void store_working(Working* TRIDENT_DETAIL_RESTRICT out, const float* TRIDENT_DETAIL_RESTRICT in, std::size_t len) noexcept {
  for (std::size_t i = 0; i < len; ++i) out[i] = Working(in[i]);
}

inline void sqrt_tile(float* TRIDENT_DETAIL_RESTRICT out, const float* TRIDENT_DETAIL_RESTRICT in) noexcept {
#if defined(TRIDENT_DETAIL_SQRT_SSE)
  for (std::size_t i = 0; i < tile_size; i += 4) _mm_storeu_ps(out + i, _mm_sqrt_ps(_mm_loadu_ps(in + i)));
#elif defined(TRIDENT_DETAIL_SQRT_NEON)
  for (std::size_t i = 0; i < tile_size; i += 4) vst1q_f32(out + i, vsqrtq_f32(vld1q_f32(in + i)));
#else
  for (std::size_t i = 0; i < tile_size; ++i) out[i] = std::sqrt(in[i]);
#endif
}

//! One tile: fixed-length loops when full (what -O2 vectorises), the same element code otherwise.
template <class Update>
void update_tile(const Update& u, float* TRIDENT_DETAIL_RESTRICT p, const float* TRIDENT_DETAIL_RESTRICT g,
                 float* TRIDENT_DETAIL_RESTRICT s0, float* TRIDENT_DETAIL_RESTRICT s1, float* TRIDENT_DETAIL_RESTRICT s2,
                 std::size_t len) noexcept {
  if constexpr (Update::states >= 3) {
    for (std::size_t i = 0; i < len; ++i) u(p[i], g[i], s0[i], s1[i], s2[i]);
  } else if (len == tile_size) {
    if constexpr (Update::uses_sqrt) {
      alignas(64) float root[tile_size];
      TRIDENT_DETAIL_IVDEP
      for (std::size_t i = 0; i < tile_size; ++i) u.moments(p[i], g[i], s0[i], s1[i]);
      sqrt_tile(root, s1);
      TRIDENT_DETAIL_IVDEP
      for (std::size_t i = 0; i < tile_size; ++i) u.apply(p[i], s0[i], root[i]);
    } else {
      TRIDENT_DETAIL_IVDEP
      for (std::size_t i = 0; i < tile_size; ++i) u(p[i], g[i], s0[i], s1[i]);
    }
  } else {
    for (std::size_t i = 0; i < len; ++i) u(p[i], g[i], s0[i], s1[i]);
  }
}

template <class Update, class Grad, class Working>
void host_step(const Update& u, float* params, const Grad* grads, float* s0, float* s1, float* s2, Working* working,
               std::size_t n, float multiplier) {
  const host_isa isa = active_host_isa();
  parallel_ranges(n, tile_size, [&](std::size_t begin, std::size_t end) {
    // AVX-512 / AVX2 when the CPU has them: one fused pass over the range (host_simd.hpp), for
    // the functors of up to two states it mirrors.
    if constexpr (Update::states <= 2) {
      if (simd_range(isa, u, params + begin, grads + begin, Update::states >= 1 ? s0 + begin : nullptr,
                     Update::states >= 2 ? s1 + begin : nullptr, working != nullptr ? working + begin : nullptr,
                     end - begin, multiplier))
        return;
    }
    alignas(64) float g[tile_size];
    alignas(64) float unused[tile_size];  // stands for the states an update does not have; never touched
    for (std::size_t at = begin; at < end; at += tile_size) {
      const std::size_t len = std::min(tile_size, end - at);
      load_grads(g, grads + at, len, multiplier);
      float* a = Update::states >= 1 ? s0 + at : unused;
      float* b = Update::states >= 2 ? s1 + at : unused;
      float* c = Update::states >= 3 ? s2 + at : unused;
      update_tile(u, params + at, g, a, b, c, len);
      if (working != nullptr) store_working(working + at, params + at, len);
    }
  });
}

template <class Update, class Grad, class Working, std::size_t S>
void run_host_step(const char* who, const Update& u, std::span<float> params, std::span<const Grad> grads,
                   const std::array<std::span<float>, S>& state, std::int64_t step_number, float multiplier,
                   std::span<Working> working) {
  static_assert(is_grad_type_v<Grad>, "optimizer step: gradients must be float, trident::fp16 or trident::bf16");
  static_assert(is_grad_type_v<Working>, "optimizer step: the working copy must be float, trident::fp16 or trident::bf16");
  std::array<float*, S> pointers{};
  std::array<std::size_t, S> sizes{};
  for (std::size_t s = 0; s < S; ++s) {
    pointers[s] = state[s].data();
    sizes[s] = state[s].size();
  }
  check_step(who, params.data(), params.size(), grads.data(), grads.size(), pointers, sizes, Update::states,
             working.data(), working.size(), step_number);
  // State I of the functor, or nothing when it has fewer (never indexing past the array).
  auto state_at = [&]<std::size_t I>() -> float* {
    if constexpr (I < S && I < Update::states) return pointers[I];
    else return nullptr;
  };
  host_step(u, params.data(), grads.data(), state_at.template operator()<0>(), state_at.template operator()<1>(),
            state_at.template operator()<2>(), working.empty() ? nullptr : working.data(), params.size(), multiplier);
}

}  // namespace detail

//! Stochastic gradient descent with optional (Nesterov) momentum, dampening and L2 weight decay,
//! exactly torch.optim.SGD. The one state is the momentum buffer; it is written on the first
//! step (step_number == 1) without being read, so it need not be zeroed, and it may be empty
//! when momentum is 0.
//!
//!   trident::optim::sgd o{{.lr = 0.1f, .momentum = 0.9f, .nesterov = true}};
//!   o.step(params, std::span<const float>(grads), {momentum_buffer}, step_number);
struct sgd {
  struct options {
    float lr = 1e-2f;
    float momentum = 0;
    float dampening = 0;
    float weight_decay = 0;
    bool nesterov = false;
  };
  static constexpr std::size_t state_count = 1;  // momentum buffer

  options opt;

  //! Calls f with this step's element update (a detail::sgd_update<...>); see the header comment.
  template <class F>
  decltype(auto) visit_update(std::int64_t step_number, F&& f) const {
    constexpr double inf = std::numeric_limits<double>::max();
    detail::check_option("sgd", "lr", opt.lr, 0, inf, true);
    detail::check_option("sgd", "momentum", opt.momentum, 0, inf, true);
    detail::check_option("sgd", "dampening", opt.dampening, -inf, inf, true);  // torch checks only the others
    detail::check_option("sgd", "weight_decay", opt.weight_decay, 0, inf, true);
    TRIDENT_EXPECT(!opt.nesterov || (opt.momentum > 0 && opt.dampening == 0),
                   "sgd: Nesterov momentum requires a momentum and zero dampening (as torch.optim.SGD)");
    return dispatch(opt, step_number, std::forward<F>(f));
  }

  //! visit_update without the checks, callable in device code: a deferred step
  //! (cuda::step_deferred) calls it in its kernel with the step number kept on the device.
  TRIDENT_EXEC_CHECK_DISABLE
  template <class F>
  TRIDENT_HOST_DEVICE static decltype(auto) dispatch(const options& o, std::int64_t step_number, F&& f) {
    if (o.momentum == 0) return with_decay<false, false, false>(o, std::forward<F>(f));
    if (step_number == 1) {
      if (o.nesterov) return with_decay<true, true, true>(o, std::forward<F>(f));
      return with_decay<true, true, false>(o, std::forward<F>(f));
    }
    if (o.nesterov) return with_decay<true, false, true>(o, std::forward<F>(f));
    return with_decay<true, false, false>(o, std::forward<F>(f));
  }

  //! One step over a flat shard; see the header comment for the arguments.
  template <class Grad, class Working = float>
  void step(std::span<float> params, std::span<const Grad> grads, std::array<std::span<float>, state_count> state,
            std::int64_t step_number, float grad_multiplier = 1.0f, std::span<Working> working_copy = {}) const {
    visit_update(step_number, [&](const auto& u) {
      detail::run_host_step("sgd::step", u, params, grads, state, step_number, grad_multiplier, working_copy);
    });
  }

 private:
  // dispatch's cases (plain functions rather than lambdas, so that nvcc's check above covers them).
  TRIDENT_EXEC_CHECK_DISABLE
  template <bool M, bool First, bool N, class F>
  TRIDENT_HOST_DEVICE static decltype(auto) with_decay(const options& o, F&& f) {
    if (o.weight_decay != 0) return call<true, M, First, N>(o, std::forward<F>(f));
    return call<false, M, First, N>(o, std::forward<F>(f));
  }
  TRIDENT_EXEC_CHECK_DISABLE
  template <bool WD, bool M, bool First, bool N, class F>
  TRIDENT_HOST_DEVICE static decltype(auto) call(const options& o, F&& f) {
    const float neg_lr = static_cast<float>(-static_cast<double>(o.lr));
    const float one_minus_dampening = static_cast<float>(1.0 - static_cast<double>(o.dampening));
    return std::forward<F>(f)(detail::sgd_update<WD, M, First, N>{neg_lr, o.weight_decay, o.momentum, one_minus_dampening});
  }

 public:

  //! The same for gradients in any contiguous range (a std::vector, a buffer): its element type
  //! is the gradient type.
  template <std::ranges::contiguous_range Grads, class Working = float>
  void step(std::span<float> params, const Grads& grads, std::array<std::span<float>, state_count> state,
            std::int64_t step_number, float grad_multiplier = 1.0f, std::span<Working> working_copy = {}) const {
    step(params, std::span<const std::ranges::range_value_t<Grads>>(grads), state, step_number, grad_multiplier, working_copy);
  }
};

//! Adam and AdamW, exactly torch.optim.Adam / torch.optim.AdamW, with or without AMSGrad:
//!   basic_adam<false, false>  adam            L2 weight decay added to the gradient (default 0)
//!   basic_adam<true,  false>  adamw           decoupled decay, param *= 1 - lr * weight_decay,
//!                                             then the Adam update (default 1e-2, as torch)
//!   basic_adam<false, true>   adam_amsgrad    amsgrad=True: a third state, the running maximum
//!   basic_adam<true,  true>   adamw_amsgrad   of exp_avg_sq, whose square root divides
//! AMSGrad is a type, not an option, because it changes state_count (structure at compile time).
//! States: exp_avg, exp_avg_sq (and max_exp_avg_sq), zeroed before the first step.
//!
//!   trident::optim::adam o{{.lr = 3e-4f}};
//!   o.step(params, std::span<const trident::bf16>(grads), {exp_avg, exp_avg_sq}, t, 1 / loss_scale);
//!   trident::optim::adamw_amsgrad a;  a.opt.lr = 3e-4f;
//!   a.step(master, grads, {exp_avg, exp_avg_sq, max_exp_avg_sq}, t, multiplier, std::span<trident::bf16>(working));
template <bool Decoupled, bool AMSGrad>
struct basic_adam {
  struct options {
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = Decoupled ? 1e-2f : 0.0f;  // AdamW: decoupled; Adam: L2, added to the gradient
  };
  static constexpr std::size_t state_count = AMSGrad ? 3 : 2;  // exp_avg, exp_avg_sq (, max_exp_avg_sq)
  static constexpr const char* name =
      Decoupled ? (AMSGrad ? "adamw_amsgrad" : "adamw") : (AMSGrad ? "adam_amsgrad" : "adam");
  static constexpr const char* step_name =
      Decoupled ? (AMSGrad ? "adamw_amsgrad::step" : "adamw::step") : (AMSGrad ? "adam_amsgrad::step" : "adam::step");

  options opt;

  //! Calls f with this step's element update (a detail::adam_update or amsgrad_update).
  template <class F>
  decltype(auto) visit_update(std::int64_t step_number, F&& f) const {
    detail::check_adam_options(name, opt);
    return dispatch(opt, step_number, std::forward<F>(f));
  }

  //! visit_update without the checks, callable in device code (see sgd::dispatch).
  TRIDENT_EXEC_CHECK_DISABLE
  template <class F>
  TRIDENT_HOST_DEVICE static decltype(auto) dispatch(const options& o, std::int64_t step_number, F&& f) {
    if (o.weight_decay != 0) return detail::visit_adam<!Decoupled, Decoupled, AMSGrad>(o, step_number, std::forward<F>(f));
    return detail::visit_adam<false, false, AMSGrad>(o, step_number, std::forward<F>(f));
  }

  //! One step over a flat shard; see the header comment for the arguments.
  template <class Grad, class Working = float>
  void step(std::span<float> params, std::span<const Grad> grads, std::array<std::span<float>, state_count> state,
            std::int64_t step_number, float grad_multiplier = 1.0f, std::span<Working> working_copy = {}) const {
    visit_update(step_number, [&](const auto& u) {
      detail::run_host_step(step_name, u, params, grads, state, step_number, grad_multiplier, working_copy);
    });
  }

  //! The same for gradients in any contiguous range (a std::vector, a buffer): its element type
  //! is the gradient type.
  template <std::ranges::contiguous_range Grads, class Working = float>
  void step(std::span<float> params, const Grads& grads, std::array<std::span<float>, state_count> state,
            std::int64_t step_number, float grad_multiplier = 1.0f, std::span<Working> working_copy = {}) const {
    step(params, std::span<const std::ranges::range_value_t<Grads>>(grads), state, step_number, grad_multiplier, working_copy);
  }
};

using adam = basic_adam<false, false>;
using adamw = basic_adam<true, false>;
using adam_amsgrad = basic_adam<false, true>;
using adamw_amsgrad = basic_adam<true, true>;

//! A type usable by zero_optimizer: options, state_count fp32 states per parameter, and a host
//! step for float, fp16 and bf16 gradients (see the header comment).
//!
//!   static_assert(trident::optim::optimizer<trident::optim::adamw>);
template <class O>
concept optimizer =
    std::copy_constructible<O> &&
    requires(const O& o, std::span<float> p, std::array<std::span<float>, O::state_count> s, std::int64_t t, float m) {
      typename O::options;
      { o.opt } -> std::convertible_to<const typename O::options&>;
      o.step(p, std::span<const float>{}, s, t, m);
      o.step(p, std::span<const trident::fp16>{}, s, t, m, std::span<trident::fp16>{});
      o.step(p, std::span<const trident::bf16>{}, s, t, m, std::span<trident::bf16>{});
    };

namespace detail {
struct update_sink {
  template <class Update>
  void operator()(const Update&) const noexcept {}
};
}  // namespace detail

//! An optimizer whose update is element-wise and exposed as a functor: what cuda::step runs.
template <class O>
concept elementwise_optimizer = optimizer<O> && requires(const O& o, std::int64_t t, detail::update_sink sink) {
  o.visit_update(t, sink);
};

static_assert(elementwise_optimizer<sgd> && elementwise_optimizer<adam> && elementwise_optimizer<adamw> &&
              elementwise_optimizer<adam_amsgrad> && elementwise_optimizer<adamw_amsgrad>);

//! Where a deferred step (cuda::step_deferred, zero_optimizer::step_async) finds what the host
//! would otherwise pass it: three doubles in memory, written by the work that decided the step.
struct deferred_decision {
  static constexpr std::size_t apply = 0;        // 0: skip the step (nothing is written)
  static constexpr std::size_t step_number = 1;  // 1 on the first step, as step()'s argument
  static constexpr std::size_t multiplier = 2;   // the gradient multiplier (a float's value)
  static constexpr std::size_t size = 3;
};

//! An elementwise optimizer whose update a kernel can build itself from a step number in device
//! memory: a static, unchecked `dispatch(options, step_number, f)` (TRIDENT_HOST_DEVICE) that
//! visit_update calls after its checks. What zero_optimizer::step_async needs.
template <class O>
concept deferrable_optimizer = elementwise_optimizer<O> && requires(const O& o, std::int64_t t, detail::update_sink sink) {
  O::dispatch(o.opt, t, sink);
};

static_assert(deferrable_optimizer<sgd> && deferrable_optimizer<adam> && deferrable_optimizer<adamw> &&
              deferrable_optimizer<adam_amsgrad> && deferrable_optimizer<adamw_amsgrad>);

//! One pass over a gradient shard: the sum of squares of the multiplied gradients (for global
//! norm clipping, summed over shards and ranks) and whether all of them are finite (the
//! overflow check of dynamic loss scaling).
struct grad_stats {
  double sum_squares = 0;
  bool finite = true;
};

namespace detail {

//! gradient_stats works in blocks of this many elements, each summed by 256 lanes (lane j takes
//! elements j, j + 256, ...) combined by a pairwise tree, and blocks added in order: a fixed
//! order, so the sum does not depend on the number of threads. (The CUDA path is CUB's
//! reduction, within about 1e-15 of this; optim/cuda/step.cuh.)
inline constexpr std::size_t stats_block = std::size_t{1} << 16;
inline constexpr std::size_t stats_lanes = 256;

template <class Grad>
double block_sum_squares(const Grad* g, std::size_t len, float multiplier) noexcept {
  alignas(64) double acc[stats_lanes] = {};
  std::size_t i = 0;
  for (; i + stats_lanes <= len; i += stats_lanes) {
    for (std::size_t j = 0; j < stats_lanes; ++j) {
      const double x = static_cast<float>(g[i + j]) * multiplier;
      acc[j] += x * x;
    }
  }
  for (std::size_t j = 0; i + j < len; ++j) {
    const double x = static_cast<float>(g[i + j]) * multiplier;
    acc[j] += x * x;
  }
  for (std::size_t width = stats_lanes / 2; width > 0; width /= 2)
    for (std::size_t j = 0; j < width; ++j) acc[j] += acc[j + width];
  return acc[0];
}

}  // namespace detail

//! Sum of squares (in double) and finiteness of `float(g) * multiplier` over the shard, in one
//! deterministic pass (fixed blocks and order, whatever the thread count). A non-finite element
//! makes the sum non-finite (squares in double cannot overflow), which is how `finite` is found.
//!
//!   auto s = trident::optim::gradient_stats(std::span<const trident::bf16>(grads), 1 / scale);
//!   if (!s.finite) skip_step();
template <class Grad>
grad_stats gradient_stats(std::span<const Grad> grads, float multiplier = 1.0f) {
  static_assert(detail::is_grad_type_v<Grad>, "gradient_stats: gradients must be float, trident::fp16 or trident::bf16");
  const std::size_t n = grads.size();
  const std::size_t blocks = (n + detail::stats_block - 1) / detail::stats_block;
  std::vector<double> partial(blocks, 0.0);
  detail::parallel_ranges(n, detail::stats_block, [&](std::size_t begin, std::size_t end) {
    for (std::size_t at = begin; at < end; at += detail::stats_block)
      partial[at / detail::stats_block] =
          detail::block_sum_squares(grads.data() + at, std::min(detail::stats_block, end - at), multiplier);
  });
  double total = 0;
  for (const double p : partial) total += p;
  return {total, std::isfinite(total)};
}

namespace detail {
// clip_multiplier without its check, callable in device code (a deferred step decides there).
// std::min and std::isnan are spelt out: nvcc takes neither in device code without flags.
TRIDENT_HOST_DEVICE inline float clip_coefficient(double global_norm, float max_norm) noexcept {
  const double coefficient = static_cast<double>(max_norm) / (global_norm + 1e-6);
  if (coefficient != coefficient) return static_cast<float>(coefficient);  // NaN
  return static_cast<float>(coefficient < 1.0 ? coefficient : 1.0);
}
}  // namespace detail

//! The factor that clips gradients to a global L2 norm, as torch.nn.utils.clip_grad_norm_:
//! min(1, max_norm / (global_norm + 1e-6)); NaN when the norm is NaN (as PyTorch, which then
//! multiplies the gradients by NaN). Pass it to step() inside grad_multiplier.
//!
//!   const float m = unscale * trident::optim::clip_multiplier(std::sqrt(total_sum_squares), 1.0f);
inline float clip_multiplier(double global_norm, float max_norm) {
  TRIDENT_EXPECT(max_norm > 0, "clip_multiplier: max_norm must be positive, got ", max_norm);
  return detail::clip_coefficient(global_norm, max_norm);
}

}  // namespace trident::optim
