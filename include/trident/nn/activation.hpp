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
// and device evaluate the same formulas (tanhf may differ by an ulp or two between libm and CUDA).
#pragma once

#include <cmath>
#include <cstddef>
#include <span>

#include "trident/core/config.hpp"
#include "trident/core/error.hpp"

namespace trident::nn {

namespace detail {

inline void check_elementwise(const char* who, std::size_t x, std::size_t y) {
  TRIDENT_EXPECT(x == y, who, ": input has ", x, " elements, output ", y, "; expected the same shape");
}

template <class Act>
void activation_forward(const char* who, std::span<const float> x, std::span<float> y) {
  check_elementwise(who, x.size(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = Act::value(x[i]);
}

template <class Act>
void activation_backward(const char* who, std::span<const float> x, std::span<const float> dy, std::span<float> dx) {
  check_elementwise(who, x.size(), dy.size());
  check_elementwise(who, x.size(), dx.size());
  for (std::size_t i = 0; i < x.size(); ++i) dx[i] = Act::grad(x[i], dy[i]);
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
    return 0.5f * x * (1.0f + tanhf(inner));
  }
  TRIDENT_HOST_DEVICE static float grad(float x, float dy) noexcept {
    const float x_sq = x * x;
    const float inner = beta * (x + kappa * x_sq * x);
    const float t = tanhf(inner);
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
