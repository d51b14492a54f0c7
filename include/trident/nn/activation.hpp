// trident/nn/activation.hpp — element-wise activations on the host: ReLU and GELU (tanh).
//
// Synopsis
//   struct relu, struct gelu      (an Activation)
//     static float value(float x)                       f(x)            TRIDENT_HOST_DEVICE
//     static float grad(float x, float dy)              dy * f'(x)      TRIDENT_HOST_DEVICE
//     static void forward(std::span<const float> x, std::span<float> y)
//     static void backward(std::span<const float> x, std::span<const float> dy, std::span<float> dx)
//
// backward takes forward's *input* x. y may alias x and dx may alias dy (element i only reads
// element i). The element functions are shared with the CUDA kernels in nn/cuda/layers.cuh, so host
// and device evaluate the same formulas (tanh differs by a few ulps: ours on the host, CUDA's
// tanhf on the device).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "trident/core/config.hpp"
#include "trident/core/error.hpp"
#include "trident/optim/host_simd.hpp"

// No FMA contraction (as nn/gemm.hpp and the optimizer's host step): the AVX2 and AVX-512 clones
// below then compute every element with the same roundings as the portable code, so the paths
// agree bit for bit (nn.host checks it).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__) && !defined(__CUDACC__)
// Clang fuses a * b + c within one expression by default ("on"); off up to the pop, as for GCC.
#pragma float_control(push)
#pragma clang fp contract(off)
#endif

namespace trident::nn {

namespace detail {

inline void check_elementwise(const char* who, std::size_t x, std::size_t y) {
  TRIDENT_EXPECT(x == y, who, ": input has ", x, " elements, output ", y, "; expected the same shape");
}

// tanh for float without a libm call (on the host), so that GELU's loops stay in registers and
// can vectorise; glibc's tanhf was 16% of the flagship's CPU step. |z| < 0.4: the odd Taylor
// series to z^13 (the rest is below 2e-9 relative); above: 1 - 2 / (exp(2|z|) + 1), with exp
// by Cody-Waite reduction to |r| <= ln(2)/2 and a degree-7 Taylor polynomial (2^n from the
// exponent bits); |z| >= 9.1 gives +-1, as tanhf rounds it. Over [-10, 10] within 8.7e-8 of
// tanh, 1.8e-7 relative (nn.host checks 2e-7 and 5e-7); NaN stays NaN. On the device CUDA's tanhf.
// x where c, else y, by masking bits: every operand is computed anyway, so GCC vectorises the
// loop around it even under -ftrapping-math (its default), which keeps it from turning a ?: whose
// arms it has sunk into branches (the division in one of them might trap) into a blend.
inline float pick(bool c, float x, float y) noexcept {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<std::uint32_t>(x) & mask) | (std::bit_cast<std::uint32_t>(y) & ~mask));
}

// exp(x) for x in [-87, 88] (finite, not NaN): Cody-Waite reduction x = n ln 2 + r, |r| <=
// ln(2)/2, a degree-7 Taylor polynomial for e^r (truncation below 6e-9 relative) and 2^n from
// the exponent bits. Host only, shared by tanh_float and the attention's softmax.
inline float exp_reduced(float x) noexcept {
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;      // ln 2 in two parts
  const float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
                  r * (1.0f / 720 + r * (1.0f / 5040)))))));
  return p * std::bit_cast<float>(static_cast<std::uint32_t>(static_cast<int>(n) + 127) << 23);
}

//! exp(x) for x <= 0, as a softmax needs it (x = score - row max), without a libm call so that
//! the softmax's loops vectorise: within 1.1e-7 relative of exp (nn.host checks 2e-7); below -87
//! it gives 0 (e^-87 = 1.6e-38, which a sum holding the maximum's term 1 cannot see); -inf
//! gives 0 and NaN stays NaN.
inline float exp_nonpositive(float x) noexcept {
  const bool normal = x > -87.0f;
  const float e = exp_reduced(pick(normal, x, -87.0f));
  return pick(x != x, x, pick(normal, e, 0.0f));
}

TRIDENT_HOST_DEVICE inline float tanh_float(float z) noexcept {
#if defined(__CUDA_ARCH__)
  return tanhf(z);
#else
  const float a = pick(std::fabs(z) < 9.1f, std::fabs(z), 9.1f);
  const float a2 = a * a;
  const float small =
      a * (1.0f + a2 * (-1.0f / 3 + a2 * (2.0f / 15 + a2 * (-17.0f / 315 + a2 * (62.0f / 2835 +
      a2 * (-1382.0f / 155925 + a2 * (21844.0f / 6081075)))))));
  const float e = exp_reduced(2.0f * a);                             // 0 <= 2a <= 18.2
  const float large = 1.0f - 2.0f / (e + 1.0f);
  const float t = pick(a < 0.4f, small, large);
  return pick(z != z, z, std::copysign(t, z));
#endif
}

// The loops run in chunks of a fixed length through a local array: GCC's -O2 vectorises only
// loops whose trip count is a known multiple of the vector width and that need no run-time alias
// check (its "very cheap" cost model); y may alias x, and a local chunk aliases nothing.
inline constexpr std::size_t elementwise_chunk = 64;

template <class Act>
__attribute__((always_inline)) inline void forward_chunk(const float* x, float* y) {
  float v[elementwise_chunk];
  std::copy_n(x, elementwise_chunk, v);
  for (std::size_t j = 0; j < elementwise_chunk; ++j) v[j] = Act::value(v[j]);
  std::copy_n(v, elementwise_chunk, y);
}
template <class Act>
__attribute__((always_inline)) inline void backward_chunk(const float* x, const float* dy, float* dx) {
  float v[elementwise_chunk], g[elementwise_chunk];
  std::copy_n(x, elementwise_chunk, v);
  std::copy_n(dy, elementwise_chunk, g);
  for (std::size_t j = 0; j < elementwise_chunk; ++j) v[j] = Act::grad(v[j], g[j]);
  std::copy_n(v, elementwise_chunk, dx);
}

#if defined(TRIDENT_DETAIL_HOST_SIMD)
// The same chunks compiled for wider vectors, chosen at run time as nn/gemm.hpp's kernels are.
template <class Act>
__attribute__((target("avx2"))) void forward_chunks_avx2(const float* x, float* y, std::size_t chunks) {
  for (std::size_t c = 0; c < chunks; ++c) forward_chunk<Act>(x + c * elementwise_chunk, y + c * elementwise_chunk);
}
template <class Act>
__attribute__((target("avx512f"))) void forward_chunks_avx512(const float* x, float* y, std::size_t chunks) {
  for (std::size_t c = 0; c < chunks; ++c) forward_chunk<Act>(x + c * elementwise_chunk, y + c * elementwise_chunk);
}
template <class Act>
__attribute__((target("avx2"))) void backward_chunks_avx2(const float* x, const float* dy, float* dx, std::size_t chunks) {
  for (std::size_t c = 0; c < chunks; ++c)
    backward_chunk<Act>(x + c * elementwise_chunk, dy + c * elementwise_chunk, dx + c * elementwise_chunk);
}
template <class Act>
__attribute__((target("avx512f"))) void backward_chunks_avx512(const float* x, const float* dy, float* dx, std::size_t chunks) {
  for (std::size_t c = 0; c < chunks; ++c)
    backward_chunk<Act>(x + c * elementwise_chunk, dy + c * elementwise_chunk, dx + c * elementwise_chunk);
}
#endif

template <class Act>
void activation_forward(const char* who, std::span<const float> x, std::span<float> y) {
  check_elementwise(who, x.size(), y.size());
  const std::size_t chunks = x.size() / elementwise_chunk;
  bool done = false;
#if defined(TRIDENT_DETAIL_HOST_SIMD)
  switch (trident::optim::detail::active_host_isa()) {
    case trident::optim::detail::host_isa::avx512: forward_chunks_avx512<Act>(x.data(), y.data(), chunks); done = true; break;
    case trident::optim::detail::host_isa::avx2: forward_chunks_avx2<Act>(x.data(), y.data(), chunks); done = true; break;
    default: break;
  }
#endif
  if (!done)
    for (std::size_t c = 0; c < chunks; ++c) forward_chunk<Act>(x.data() + c * elementwise_chunk, y.data() + c * elementwise_chunk);
  for (std::size_t i = chunks * elementwise_chunk; i < x.size(); ++i) y[i] = Act::value(x[i]);
}

template <class Act>
void activation_backward(const char* who, std::span<const float> x, std::span<const float> dy, std::span<float> dx) {
  check_elementwise(who, x.size(), dy.size());
  check_elementwise(who, x.size(), dx.size());
  const std::size_t chunks = x.size() / elementwise_chunk;
  bool done = false;
#if defined(TRIDENT_DETAIL_HOST_SIMD)
  switch (trident::optim::detail::active_host_isa()) {
    case trident::optim::detail::host_isa::avx512:
      backward_chunks_avx512<Act>(x.data(), dy.data(), dx.data(), chunks);
      done = true;
      break;
    case trident::optim::detail::host_isa::avx2:
      backward_chunks_avx2<Act>(x.data(), dy.data(), dx.data(), chunks);
      done = true;
      break;
    default: break;
  }
#endif
  if (!done)
    for (std::size_t c = 0; c < chunks; ++c)
      backward_chunk<Act>(x.data() + c * elementwise_chunk, dy.data() + c * elementwise_chunk, dx.data() + c * elementwise_chunk);
  for (std::size_t i = chunks * elementwise_chunk; i < x.size(); ++i) dx[i] = Act::grad(x[i], dy[i]);
}

}  // namespace detail

//! max(x, 0), as torch.nn.functional.relu; the gradient at 0 is 0, as PyTorch's.
//!
//!   trident::nn::relu::forward(h, h);              // in place
//!   trident::nn::relu::backward(h_pre, dh, dh);    // h_pre: the input to the ReLU
struct relu {
  TRIDENT_HOST_DEVICE static float value(float x) noexcept { return x > 0.0f ? x : 0.0f; }
  TRIDENT_HOST_DEVICE static float grad(float x, float dy) noexcept { return x > 0.0f ? dy : 0.0f; }

  static void forward(std::span<const float> x, std::span<float> y) {
    detail::activation_forward<relu>("relu::forward", x, y);
  }
  static void backward(std::span<const float> x, std::span<const float> dy, std::span<float> dx) {
    detail::activation_backward<relu>("relu::backward", x, dy, dx);
  }
};

//! GELU with the tanh approximation, torch.nn.functional.gelu(x, approximate='tanh'):
//!   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//! and its derivative written as ATen's GeluBackward (aten/src/ATen/native/cpu/Activation.cpp).
//! Checked against torch's own output, tests/fixtures/torch_layers.txt: y and dx within 1e-6 of
//! torch's float32 results on [-8, 8] (normwise; both are float32 formulas, and 1 - tanh^2
//! cancels near saturation: torch is 6.4e-7 from its float64 result, we 3.7e-7).
//!
//!   trident::nn::gelu::forward(pre, post);
//!   trident::nn::gelu::backward(pre, dpost, dpre);
struct gelu {
  static constexpr float beta = 0.7978845608028654f;  // sqrt(2 / pi)
  static constexpr float kappa = 0.044715f;

  TRIDENT_HOST_DEVICE static float value(float x) noexcept {
    const float inner = beta * (x + kappa * x * x * x);
    return 0.5f * x * (1.0f + detail::tanh_float(inner));
  }
  TRIDENT_HOST_DEVICE static float grad(float x, float dy) noexcept {
    const float x_sq = x * x;
    const float inner = beta * (x + kappa * x_sq * x);
    const float t = detail::tanh_float(inner);
    const float left = 0.5f * x;
    const float right = 1.0f + t;
    const float left_derivative = 0.5f * right;
    const float right_derivative = left * (1.0f - t * t) * beta * (1.0f + 3.0f * kappa * x_sq);
    return dy * (left_derivative + right_derivative);
  }

  static void forward(std::span<const float> x, std::span<float> y) {
    detail::activation_forward<gelu>("gelu::forward", x, y);
  }
  static void backward(std::span<const float> x, std::span<const float> dy, std::span<float> dx) {
    detail::activation_backward<gelu>("gelu::backward", x, dy, dx);
  }
};

}  // namespace trident::nn

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC pop_options
#elif defined(__clang__) && !defined(__CUDACC__)
#pragma float_control(pop)
#endif
