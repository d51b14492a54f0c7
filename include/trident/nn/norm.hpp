// trident/nn/norm.hpp — LayerNorm and RMSNorm over the last dimension, on the host.
//
// Synopsis
//   struct layer_norm { std::size_t hidden; float eps = 1e-5f;
//     void forward(rows, x, gamma, beta, y, mean, rstd) const   y = (x - mean) * rstd * gamma + beta
//     void backward(rows, x, gamma, mean, rstd, dy, dx, dgamma, dbeta) const }
//   struct rms_norm { std::size_t hidden; float eps = 1e-6f;
//     void forward(rows, x, gamma, y, rrms) const               y = x * rrms * gamma
//     void backward(rows, x, gamma, rrms, dy, dx, dgamma) const }
//
// torch.nn.LayerNorm(hidden, eps) (biased variance) and torch.nn.RMSNorm(hidden, eps) on
// x [rows, hidden]. forward saves each row's statistics (mean and 1/sqrt(var + eps); or
// 1/sqrt(mean(x^2) + eps)), which backward takes back, as autograd saves them. Row sums run in
// double in index order: deterministic. dx is overwritten; dgamma and dbeta accumulate (+=)
// over rows and calls, like every parameter gradient in nn/. Under sequence parallelism a norm
// runs on a rank's rows only, and its dgamma/dbeta are partial sums that the caller reduces
// over the tensor group (parallel/tensor/block.hpp does).
//
// Checked against torch's own output, tests/fixtures/torch_layers.txt (tests/nn/
// test_nn_reference.cpp): y, mean, rstd, dx, dgamma and dbeta within 3e-7 of torch's float32
// results (normwise), which is torch's own float32 rounding: torch's float32 results are as far
// from its float64 ones, and ours are within 1.1e-7 of those. torch.nn.RMSNorm's default eps
// (None) is finfo(float32).eps = 1.19e-7, not our 1e-6: pass eps to both.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>

#include "trident/core/error.hpp"

namespace trident::nn {

namespace detail {

inline void check_norm(const char* who, std::size_t rows, std::size_t hidden, std::size_t x, std::size_t gamma,
                       std::size_t y, std::size_t stats) {
  TRIDENT_EXPECT(hidden > 0, who, ": hidden size 0");
  TRIDENT_EXPECT(x == rows * hidden, who, ": x has ", x, " elements, expected [rows=", rows, ", hidden=", hidden, "] = ",
                 rows * hidden);
  TRIDENT_EXPECT(gamma == hidden, who, ": gamma has ", gamma, " elements, expected [hidden=", hidden, "]");
  TRIDENT_EXPECT(y == rows * hidden, who, ": the output has ", y, " elements, expected [rows=", rows, ", hidden=", hidden,
                 "] = ", rows * hidden);
  TRIDENT_EXPECT(stats == rows, who, ": the row statistics have ", stats, " elements, expected [rows=", rows, "]");
}

}  // namespace detail

//! torch.nn.LayerNorm(hidden, eps=eps) with weight gamma and bias beta (beta may be empty).
//!
//!   trident::nn::layer_norm ln{.hidden = 768};
//!   ln.forward(rows, x, gamma, beta, y, mean, rstd);
//!   ln.backward(rows, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
struct layer_norm {
  std::size_t hidden = 0;
  float eps = 1e-5f;

  void forward(std::size_t rows, std::span<const float> x, std::span<const float> gamma, std::span<const float> beta,
               std::span<float> y, std::span<float> mean, std::span<float> rstd) const {
    detail::check_norm("layer_norm::forward", rows, hidden, x.size(), gamma.size(), y.size(), mean.size());
    TRIDENT_EXPECT(rstd.size() == rows, "layer_norm::forward: rstd has ", rstd.size(), " elements, expected ", rows);
    TRIDENT_EXPECT(beta.empty() || beta.size() == hidden, "layer_norm::forward: beta has ", beta.size(),
                   " elements, expected ", hidden, " (or none)");
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row = x.data() + r * hidden;
      double sum = 0;
      for (std::size_t j = 0; j < hidden; ++j) sum += row[j];
      const double mu = sum / static_cast<double>(hidden);
      double var = 0;
      for (std::size_t j = 0; j < hidden; ++j) var += (row[j] - mu) * (row[j] - mu);
      var /= static_cast<double>(hidden);
      mean[r] = static_cast<float>(mu);
      rstd[r] = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
      float* out = y.data() + r * hidden;
      for (std::size_t j = 0; j < hidden; ++j) {
        const float xhat = (row[j] - mean[r]) * rstd[r];
        out[j] = xhat * gamma[j] + (beta.empty() ? 0.0f : beta[j]);
      }
    }
  }

  //! dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy gamma (overwritten);
  //! dgamma += sum over rows of dy xhat, dbeta += sum of dy (dbeta may be empty).
  void backward(std::size_t rows, std::span<const float> x, std::span<const float> gamma, std::span<const float> mean,
                std::span<const float> rstd, std::span<const float> dy, std::span<float> dx, std::span<float> dgamma,
                std::span<float> dbeta) const {
    detail::check_norm("layer_norm::backward", rows, hidden, x.size(), gamma.size(), dy.size(), mean.size());
    TRIDENT_EXPECT(rstd.size() == rows && dx.size() == x.size() && dgamma.size() == hidden &&
                       (dbeta.empty() || dbeta.size() == hidden),
                   "layer_norm::backward: expected rstd [", rows, "], dx [", rows, ", ", hidden, "], dgamma [", hidden,
                   "] and dbeta [", hidden, "] (or none); got ", rstd.size(), ", ", dx.size(), ", ", dgamma.size(), ", ",
                   dbeta.size());
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row = x.data() + r * hidden;
      const float* grow = dy.data() + r * hidden;
      double sum_g = 0, sum_gx = 0;
      for (std::size_t j = 0; j < hidden; ++j) {
        const double xhat = static_cast<double>((row[j] - mean[r]) * rstd[r]);
        const double g = static_cast<double>(grow[j]) * gamma[j];
        sum_g += g;
        sum_gx += g * xhat;
      }
      const double n = static_cast<double>(hidden);
      float* out = dx.data() + r * hidden;
      for (std::size_t j = 0; j < hidden; ++j) {
        const float xhat = (row[j] - mean[r]) * rstd[r];
        const double g = static_cast<double>(grow[j]) * gamma[j];
        out[j] = static_cast<float>(rstd[r] * (g - sum_g / n - xhat * (sum_gx / n)));
        dgamma[j] += grow[j] * xhat;
        if (!dbeta.empty()) dbeta[j] += grow[j];
      }
    }
  }
};

//! torch.nn.RMSNorm(hidden, eps=eps) with weight gamma.
//!
//!   trident::nn::rms_norm norm{.hidden = 4096};
//!   norm.forward(rows, x, gamma, y, rrms);
//!   norm.backward(rows, x, gamma, rrms, dy, dx, dgamma);
struct rms_norm {
  std::size_t hidden = 0;
  float eps = 1e-6f;

  void forward(std::size_t rows, std::span<const float> x, std::span<const float> gamma, std::span<float> y,
               std::span<float> rrms) const {
    detail::check_norm("rms_norm::forward", rows, hidden, x.size(), gamma.size(), y.size(), rrms.size());
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row = x.data() + r * hidden;
      double sum = 0;
      for (std::size_t j = 0; j < hidden; ++j) sum += static_cast<double>(row[j]) * row[j];
      rrms[r] = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(hidden) + static_cast<double>(eps)));
      float* out = y.data() + r * hidden;
      for (std::size_t j = 0; j < hidden; ++j) out[j] = row[j] * rrms[r] * gamma[j];
    }
  }

  //! dx = rrms (g - xhat mean(g xhat)) with g = dy gamma, xhat = x rrms (overwritten);
  //! dgamma += sum over rows of dy xhat.
  void backward(std::size_t rows, std::span<const float> x, std::span<const float> gamma, std::span<const float> rrms,
                std::span<const float> dy, std::span<float> dx, std::span<float> dgamma) const {
    detail::check_norm("rms_norm::backward", rows, hidden, x.size(), gamma.size(), dy.size(), rrms.size());
    TRIDENT_EXPECT(dx.size() == x.size() && dgamma.size() == hidden, "rms_norm::backward: expected dx [", rows, ", ", hidden,
                   "] and dgamma [", hidden, "]; got ", dx.size(), " and ", dgamma.size());
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row = x.data() + r * hidden;
      const float* grow = dy.data() + r * hidden;
      double sum_gx = 0;
      for (std::size_t j = 0; j < hidden; ++j)
        sum_gx += static_cast<double>(grow[j]) * gamma[j] * (static_cast<double>(row[j]) * rrms[r]);
      const double mean_gx = sum_gx / static_cast<double>(hidden);
      float* out = dx.data() + r * hidden;
      for (std::size_t j = 0; j < hidden; ++j) {
        const float xhat = row[j] * rrms[r];
        out[j] = static_cast<float>(rrms[r] * (static_cast<double>(grow[j]) * gamma[j] - xhat * mean_gx));
        dgamma[j] += grow[j] * xhat;
      }
    }
  }
};

}  // namespace trident::nn
