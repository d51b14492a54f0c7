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
// double over eight lanes in a fixed order (detail::lane_sum): deterministic. dx is overwritten;
// dgamma and dbeta accumulate (+=) over rows and calls, like every parameter gradient in nn/.
// Under sequence parallelism a norm
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

// The sum of term(j) for j in [0, n), in double, over eight lanes: lane k adds the terms j = k
// mod 8 in index order, and the lanes are added in a fixed tree. Deterministic (the same bits
// on every run and machine), and eight independent chains instead of one, so the CPU overlaps
// the additions (a single chain in index order was latency-bound: LayerNorm was 7.5% of the
// flagship's CPU step).
template <class Term>
inline double lane_sum(std::size_t n, Term term) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (std::size_t k = 0; k < 8; ++k) lane[k] += term(j + k);
  for (; j < n; ++j) lane[j % 8] += term(j);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// Two such sums in one pass.
template <class Term>
inline void lane_sum2(std::size_t n, Term term, double& first, double& second) {
  double a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const auto add = [&](std::size_t j, std::size_t k) {
    double x = 0, y = 0;
    term(j, x, y);
    a[k] += x;
    b[k] += y;
  };
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (std::size_t k = 0; k < 8; ++k) add(j + k, k);
  for (; j < n; ++j) add(j, j % 8);
  first = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  second = ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
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
      const double mu = detail::lane_sum(hidden, [&](std::size_t j) { return static_cast<double>(row[j]); }) /
                        static_cast<double>(hidden);
      const double var = detail::lane_sum(hidden, [&](std::size_t j) { return (row[j] - mu) * (row[j] - mu); }) /
                         static_cast<double>(hidden);
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
      detail::lane_sum2(
          hidden,
          [&](std::size_t j, double& g_term, double& gx_term) {
            const double xhat = static_cast<double>((row[j] - mean[r]) * rstd[r]);
            g_term = static_cast<double>(grow[j]) * gamma[j];
            gx_term = g_term * xhat;
          },
          sum_g, sum_gx);
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
      const double sum = detail::lane_sum(hidden, [&](std::size_t j) { return static_cast<double>(row[j]) * row[j]; });
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
      const double sum_gx = detail::lane_sum(hidden, [&](std::size_t j) {
        return static_cast<double>(grow[j]) * gamma[j] * (static_cast<double>(row[j]) * rrms[r]);
      });
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
