// trident/optim/host_simd.hpp — the host optimizer step in AVX-512 or AVX2, chosen at run time.
//
// Synopsis (internal: used by optim/optimizers.hpp's host step)
//   namespace trident::optim::detail
//     enum class host_isa { portable, avx2, avx512 }
//     host_isa detected_host_isa()            what this CPU runs, asked once and cached
//     host_isa active_host_isa()              detected, unless forced (tests, benchmarks)
//     bool force_host_isa(host_isa)           false (and nothing changes) for one the CPU lacks
//     void unforce_host_isa()
//     bool simd_range(isa, u, p, g, s0, s1, working, n, multiplier)
//                                             one fused pass over n elements with the update
//                                             functor u; false when isa is portable (the caller
//                                             then runs its tiles)
//
// Why: the build targets plain x86-64 (SSE2), so the portable tiles run at SSE width and in
// several passes; PyTorch's fused CPU AdamW runs AVX2 or AVX-512. Functions compiled for a
// wider target (__attribute__((target))) and chosen by __builtin_cpu_supports keep one binary
// for every x86-64 machine.
//
// Bitwise the same as the element functors (and so as the CUDA kernel): the vector formulas
// below mirror sgd_update / adam_update operation for operation, each a separate IEEE-rounded
// vector mul, add, div or sqrt. FMA contraction is switched off for them (GCC contracts vector
// a * b + c into vfmadd under -ffp-contract=fast, the GNU-mode default, whenever the target has
// FMA, which AVX-512F implies); fp16 stores use F16C / AVX-512F's vcvtps2ph with round-to-
// nearest-even, which rounds exactly like trident::fp16 (NaNs included); bf16 stores round with
// integer operations as trident::bf16 does (AVX512_BF16's vcvtneps2bf16 flushes subnormals to
// zero, trident::bf16 does not). tests/optim/test_host_simd.cpp checks every path bitwise.
//
// Not under nvcc (its device pass must not see host intrinsics) and not off x86-64: there
// simd_range always declines and the portable tiles run.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "trident/core/half.hpp"

#if !defined(__CUDACC__) && (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define TRIDENT_DETAIL_HOST_SIMD 1
#endif

namespace trident::optim::detail {

// The element functors (optimizers.hpp); the vector formulas mirror them.
template <bool WeightDecay, bool Momentum, bool First, bool Nesterov>
struct sgd_update;
template <bool L2, bool Decoupled>
struct adam_update;

enum class host_isa : int { portable = 0, avx2 = 1, avx512 = 2 };

//! The widest path this CPU (and its OS, which must save the wide registers: libgcc's
//! __builtin_cpu_supports checks XCR0) runs. Asked once: the answer cannot change.
inline host_isa detected_host_isa() noexcept {
  static const host_isa isa = [] {
#if defined(TRIDENT_DETAIL_HOST_SIMD)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return host_isa::avx512;
    // F16C (fp16 loads and stores) came with or before AVX2 on every x86 CPU, but ask anyway;
    // through cpuid (leaf 1, ecx bit 29): not every compiler's __builtin_cpu_supports knows it.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
    if (__builtin_cpu_supports("avx2") && f16c) return host_isa::avx2;
#endif
    return host_isa::portable;
  }();
  return isa;
}

inline std::atomic<int>& forced_host_isa() noexcept {
  static std::atomic<int> forced{-1};  // -1: not forced
  return forced;
}

//! For tests and benchmarks: run `isa` instead of the widest path (every path gives the same
//! bits). Refused for a path this CPU cannot run.
inline bool force_host_isa(host_isa isa) noexcept {
  if (static_cast<int>(isa) > static_cast<int>(detected_host_isa())) return false;
  forced_host_isa().store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}
inline void unforce_host_isa() noexcept { forced_host_isa().store(-1, std::memory_order_relaxed); }

inline host_isa active_host_isa() noexcept {
  const int forced = forced_host_isa().load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<host_isa>(forced) : detected_host_isa();
}

#if defined(TRIDENT_DETAIL_HOST_SIMD)

#define TRIDENT_DETAIL_SIMD_RESTRICT __restrict__

// GCC: no FMA contraction in anything defined up to the pop (code inlined into the kernels,
// the element functors of the scalar head and tail included, takes the kernels' setting).
// Checked: no vfmadd in the kernels with -std=gnu++20 -march=native. Clang contracts only
// within one source expression by default ("on"), and every formula below is one operation per
// statement; TRIDENT_DETAIL_NO_CONTRACT says so to it explicitly. (An explicit clang
// -ffp-contract=fast overrides every pragma and is not supported: it fuses the portable code too.)
#if defined(__clang__)
#define TRIDENT_DETAIL_NO_CONTRACT _Pragma("clang fp contract(off)")
#else
#define TRIDENT_DETAIL_NO_CONTRACT
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() (`__m512 __Y = __Y;`), which its
// -Wmaybe-uninitialized reports once inlined (GCC PR 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// ---- the formulas, for any GCC vector of floats (__m256, __m512) -------------------------------
// Written with the vector extension's operators (scalar operands are broadcast), not
// intrinsics, so that one template serves both widths and needs no target of its own: it is
// always inlined into a kernel compiled for the wide target. Operands in the functors' order.

template <class V, bool WD, bool M, bool First, bool N>
__attribute__((always_inline)) inline void vector_update(const sgd_update<WD, M, First, N>& u, V& p, const V& g, V& buf) noexcept {
  TRIDENT_DETAIL_NO_CONTRACT
  V d_p = g;
  if constexpr (WD) {
    const V decay = u.weight_decay * p;
    d_p = d_p + decay;
  }
  if constexpr (M) {
    if constexpr (First) {
      buf = d_p;
    } else {
      const V kept = buf * u.momentum;
      const V added = u.one_minus_dampening * d_p;
      buf = kept + added;
    }
    if constexpr (N) {
      const V ahead = u.momentum * buf;
      d_p = d_p + ahead;
    } else {
      d_p = buf;
    }
  }
  const V delta = u.neg_lr * d_p;
  p = p + delta;
}

template <class V, bool L2, bool Decoupled>
__attribute__((always_inline)) inline void vector_moments(const adam_update<L2, Decoupled>& u, V& p, const V& grad, V& m,
                                                          V& v) noexcept {
  TRIDENT_DETAIL_NO_CONTRACT
  V g = grad;
  if constexpr (Decoupled) p = p * u.decay;
  if constexpr (L2) {
    const V decay = u.weight_decay * p;
    g = g + decay;
  }
  const V m_kept = m * u.beta1;
  const V m_added = u.one_minus_beta1 * g;
  m = m_kept + m_added;
  const V v_kept = v * u.beta2;
  const V scaled = u.one_minus_beta2 * g;
  const V v_added = scaled * g;
  v = v_kept + v_added;
}

template <class V, bool L2, bool Decoupled>
__attribute__((always_inline)) inline void vector_apply(const adam_update<L2, Decoupled>& u, V& p, const V& m,
                                                        const V& sqrt_v) noexcept {
  TRIDENT_DETAIL_NO_CONTRACT
  const V corrected = sqrt_v / u.bias_correction2_sqrt;
  const V denom = corrected + u.eps;
  const V ratio = m / denom;
  const V delta = u.neg_step_size * ratio;
  p = p + delta;
}

// ---- AVX-512F: 16 floats a vector ----------------------------------------------------------------

__attribute__((target("avx512f"), always_inline)) inline __m512 load16(const float* x) noexcept {
  return _mm512_loadu_ps(x);
}
__attribute__((target("avx512f"), always_inline)) inline __m512 load16(const trident::fp16* x) noexcept {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}
__attribute__((target("avx512f"), always_inline)) inline __m512 load16(const trident::bf16* x) noexcept {
  // bf16 is the top half of a float: widening and shifting is the exact conversion.
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

__attribute__((target("avx512f"), always_inline)) inline void store16(float* out, __m512 x) noexcept {
  _mm512_storeu_ps(out, x);
}
__attribute__((target("avx512f"), always_inline)) inline void store16(trident::fp16* out, __m512 x) noexcept {
  // Immediate rounding mode 0: nearest even, whatever MXCSR says; subnormal halves are produced
  // (not flushed) and a NaN keeps its sign and top payload bits and becomes quiet, as fp16(float).
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("avx512f"), always_inline)) inline void store16(trident::bf16* out, __m512 x) noexcept {
  // detail::float_to_bf16_bits lane by lane: (x + 0x7fff + lsb) >> 16, NaN -> (x >> 16) | 0x40.
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i high = _mm512_srli_epi32(bits, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet)));
}
__attribute__((target("avx512f"), always_inline)) inline __m512 vector_sqrt(__m512 x) noexcept { return _mm512_sqrt_ps(x); }

// ---- AVX2 + F16C: 8 floats a vector ----------------------------------------------------------------

__attribute__((target("avx2,f16c"), always_inline)) inline __m256 load8(const float* x) noexcept {
  return _mm256_loadu_ps(x);
}
__attribute__((target("avx2,f16c"), always_inline)) inline __m256 load8(const trident::fp16* x) noexcept {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
}
__attribute__((target("avx2,f16c"), always_inline)) inline __m256 load8(const trident::bf16* x) noexcept {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

__attribute__((target("avx2,f16c"), always_inline)) inline void store8(float* out, __m256 x) noexcept {
  _mm256_storeu_ps(out, x);
}
__attribute__((target("avx2,f16c"), always_inline)) inline void store8(trident::fp16* out, __m256 x) noexcept {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("avx2,f16c"), always_inline)) inline void store8(trident::bf16* out, __m256 x) noexcept {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i high = _mm256_srli_epi32(bits, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  const __m256i lanes = _mm256_blendv_epi8(rounded, quiet, nan);  // every lane <= 0xffff: packus keeps it
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm_packus_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1)));
}
__attribute__((target("avx2,f16c"), always_inline)) inline __m256 vector_sqrt(__m256 x) noexcept { return _mm256_sqrt_ps(x); }

// ---- the kernels: one pass, every array read and written once ------------------------------------

//! Elements the vector loop does not take (the head until params are aligned, the tail): the
//! element functor itself, which the vector formulas equal bitwise.
template <class Update, class Grad, class Working>
__attribute__((always_inline)) inline void scalar_elements(const Update& u, float* p, const Grad* g, float* s0, float* s1,
                                                           Working* working, std::size_t begin, std::size_t end,
                                                           float multiplier) noexcept {
  float unused0 = 0, unused1 = 0;
  for (std::size_t i = begin; i < end; ++i) {
    u(p[i], static_cast<float>(g[i]) * multiplier, Update::states >= 1 ? s0[i] : unused0,
      Update::states >= 2 ? s1[i] : unused1);
    if (working != nullptr) working[i] = Working(p[i]);
  }
}

//! Elements from `at` to where params reach an `align`-byte boundary (or n): aligned vector
//! loads and stores of params and states (allocated alike) split no cache line.
inline std::size_t aligned_start(const float* p, std::size_t n, std::size_t align) noexcept {
  const std::size_t misaligned = reinterpret_cast<std::uintptr_t>(p) % align;
  if (misaligned == 0 || misaligned % sizeof(float) != 0) return 0;
  const std::size_t head = (align - misaligned) / sizeof(float);
  return head < n ? head : n;
}

template <class Update, class Grad, class Working, bool HasWorking>
__attribute__((target("avx512f"))) inline void avx512_range(const Update& u, float* TRIDENT_DETAIL_SIMD_RESTRICT p,
                                                            const Grad* TRIDENT_DETAIL_SIMD_RESTRICT g,
                                                            float* TRIDENT_DETAIL_SIMD_RESTRICT s0,
                                                            float* TRIDENT_DETAIL_SIMD_RESTRICT s1,
                                                            Working* TRIDENT_DETAIL_SIMD_RESTRICT working, std::size_t n,
                                                            float multiplier) noexcept {
  constexpr std::size_t width = 16;
  const std::size_t head = aligned_start(p, n, 64);
  scalar_elements(u, p, g, s0, s1, HasWorking ? working : nullptr, 0, head, multiplier);
  const __m512 mult = _mm512_set1_ps(multiplier);
  std::size_t i = head;
  for (; i + width <= n; i += width) {
    const __m512 grad = _mm512_mul_ps(load16(g + i), mult);
    __m512 param = _mm512_loadu_ps(p + i);
    __m512 a = Update::states >= 1 ? _mm512_loadu_ps(s0 + i) : _mm512_setzero_ps();
    __m512 b = Update::states >= 2 ? _mm512_loadu_ps(s1 + i) : _mm512_setzero_ps();
    if constexpr (Update::uses_sqrt) {
      vector_moments(u, param, grad, a, b);
      vector_apply(u, param, a, vector_sqrt(b));
    } else {
      vector_update(u, param, grad, a);
    }
    _mm512_storeu_ps(p + i, param);
    if constexpr (Update::states >= 1) _mm512_storeu_ps(s0 + i, a);
    if constexpr (Update::states >= 2) _mm512_storeu_ps(s1 + i, b);
    if constexpr (HasWorking) store16(working + i, param);
  }
  scalar_elements(u, p, g, s0, s1, HasWorking ? working : nullptr, i, n, multiplier);
}

template <class Update, class Grad, class Working, bool HasWorking>
__attribute__((target("avx2,f16c"))) inline void avx2_range(const Update& u, float* TRIDENT_DETAIL_SIMD_RESTRICT p,
                                                            const Grad* TRIDENT_DETAIL_SIMD_RESTRICT g,
                                                            float* TRIDENT_DETAIL_SIMD_RESTRICT s0,
                                                            float* TRIDENT_DETAIL_SIMD_RESTRICT s1,
                                                            Working* TRIDENT_DETAIL_SIMD_RESTRICT working, std::size_t n,
                                                            float multiplier) noexcept {
  constexpr std::size_t width = 8;
  const std::size_t head = aligned_start(p, n, 32);
  scalar_elements(u, p, g, s0, s1, HasWorking ? working : nullptr, 0, head, multiplier);
  const __m256 mult = _mm256_set1_ps(multiplier);
  std::size_t i = head;
  for (; i + width <= n; i += width) {
    const __m256 grad = _mm256_mul_ps(load8(g + i), mult);
    __m256 param = _mm256_loadu_ps(p + i);
    __m256 a = Update::states >= 1 ? _mm256_loadu_ps(s0 + i) : _mm256_setzero_ps();
    __m256 b = Update::states >= 2 ? _mm256_loadu_ps(s1 + i) : _mm256_setzero_ps();
    if constexpr (Update::uses_sqrt) {
      vector_moments(u, param, grad, a, b);
      vector_apply(u, param, a, vector_sqrt(b));
    } else {
      vector_update(u, param, grad, a);
    }
    _mm256_storeu_ps(p + i, param);
    if constexpr (Update::states >= 1) _mm256_storeu_ps(s0 + i, a);
    if constexpr (Update::states >= 2) _mm256_storeu_ps(s1 + i, b);
    if constexpr (HasWorking) store8(working + i, param);
  }
  scalar_elements(u, p, g, s0, s1, HasWorking ? working : nullptr, i, n, multiplier);
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
#undef TRIDENT_DETAIL_NO_CONTRACT
#undef TRIDENT_DETAIL_SIMD_RESTRICT

#endif  // TRIDENT_DETAIL_HOST_SIMD

//! One fused pass over n elements on the `isa` path; false (nothing done) for the portable one.
//! s0 / s1 may be null when Update has fewer states, working when there is no working copy.
template <class Update, class Grad, class Working>
bool simd_range(host_isa isa, const Update& u, float* p, const Grad* g, float* s0, float* s1, Working* working,
                std::size_t n, float multiplier) noexcept {
#if defined(TRIDENT_DETAIL_HOST_SIMD)
  if (isa == host_isa::avx512) {
    if (working != nullptr) avx512_range<Update, Grad, Working, true>(u, p, g, s0, s1, working, n, multiplier);
    else avx512_range<Update, Grad, Working, false>(u, p, g, s0, s1, working, n, multiplier);
    return true;
  }
  if (isa == host_isa::avx2) {
    if (working != nullptr) avx2_range<Update, Grad, Working, true>(u, p, g, s0, s1, working, n, multiplier);
    else avx2_range<Update, Grad, Working, false>(u, p, g, s0, s1, working, n, multiplier);
    return true;
  }
#else
  (void)isa, (void)u, (void)p, (void)g, (void)s0, (void)s1, (void)working, (void)n, (void)multiplier;
#endif
  return false;
}

}  // namespace trident::optim::detail
