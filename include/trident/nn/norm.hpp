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

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>

#include "trident/core/error.hpp"
#include "trident/optim/host_simd.hpp"

// No FMA contraction (as nn/gemm.hpp and nn/activation.hpp): LayerNorm's AVX2 and AVX-512
// clones then round every element as the portable code does (nn.host checks the bits).
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
__attribute__((always_inline)) inline double lane_sum(std::size_t n, Term term) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (std::size_t k = 0; k < 8; ++k) lane[k] += term(j + k);
  for (; j < n; ++j) lane[j % 8] += term(j);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// Two such sums in one pass. (Both always inlined, so that they run in the caller's AVX2 or
// AVX-512 clone.)
template <class Term>
__attribute__((always_inline)) inline void lane_sum2(std::size_t n, Term term, double& first, double& second) {
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

// LayerNorm's element loops in chunks of 16 through local arrays (fixed trip counts and no
// aliasing, which GCC's -O2 cost model needs to vectorise them), compiled for AVX2 and AVX-512F
// as well and chosen at run time as nn/gemm.hpp's kernels are; the remainder of a row (hidden
// not a multiple of 16) runs the same formula one element at a time. Unvectorised, forward and
// backward were 6.5% of the flagship's CPU step.
inline constexpr std::size_t norm_chunk = 16;

struct layer_norm_rows {
  std::size_t rows, hidden;
  float eps;
  const float* x;
  const float* gamma;
  const float* beta;  // may be null
  const float* dy;
  float* y;  // forward: y; backward: dx
  float* mean;  // forward writes the row statistics
  float* rstd;
  const float* saved_mean;  // backward reads them
  const float* saved_rstd;
  float* dgamma;
  float* dbeta;  // may be null

  __attribute__((always_inline)) void forward() const {
    constexpr std::size_t w = norm_chunk;
    const std::size_t full = hidden / w * w;
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row = x + r * hidden;
      const double mu = lane_sum(hidden, [&](std::size_t j) { return static_cast<double>(row[j]); }) /
                        static_cast<double>(hidden);
      const double var = lane_sum(hidden, [&](std::size_t j) { return (row[j] - mu) * (row[j] - mu); }) /
                         static_cast<double>(hidden);
      const float m = mean[r] = static_cast<float>(mu);
      const float s = rstd[r] = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
      float* out = y + r * hidden;
      for (std::size_t j = 0; j < full; j += w) {
        float xc[w], gc[w], bc[w];
        std::copy_n(row + j, w, xc);
        std::copy_n(gamma + j, w, gc);
        if (beta != nullptr)
          std::copy_n(beta + j, w, bc);
        else
          std::fill_n(bc, w, 0.0f);
        for (std::size_t k = 0; k < w; ++k) xc[k] = (xc[k] - m) * s * gc[k] + bc[k];
        std::copy_n(xc, w, out + j);
      }
      for (std::size_t j = full; j < hidden; ++j) out[j] = (row[j] - m) * s * gamma[j] + (beta != nullptr ? beta[j] : 0.0f);
    }
  }

  __attribute__((always_inline)) void backward() const {
    constexpr std::size_t w = norm_chunk;
    const std::size_t full = hidden / w * w;
    const double n = static_cast<double>(hidden);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row = x + r * hidden;
      const float* grow = dy + r * hidden;
      const float m = saved_mean[r], s = saved_rstd[r];
      double sum_g = 0, sum_gx = 0;
      lane_sum2(
          hidden,
          [&](std::size_t j, double& g_term, double& gx_term) {
            const double xhat = static_cast<double>((row[j] - m) * s);
            g_term = static_cast<double>(grow[j]) * gamma[j];
            gx_term = g_term * xhat;
          },
          sum_g, sum_gx);
      const double mean_g = sum_g / n, mean_gx = sum_gx / n;
      float* out = y + r * hidden;
      for (std::size_t j = 0; j < full; j += w) {
        float xc[w], gyc[w], gac[w], dgc[w], dbc[w];
        std::copy_n(row + j, w, xc);
        std::copy_n(grow + j, w, gyc);
        std::copy_n(gamma + j, w, gac);
        std::copy_n(dgamma + j, w, dgc);
        for (std::size_t k = 0; k < w; ++k) {
          const float xhat = (xc[k] - m) * s;
          const double g = static_cast<double>(gyc[k]) * gac[k];
          xc[k] = static_cast<float>(s * (g - mean_g - xhat * mean_gx));
          dgc[k] += gyc[k] * xhat;
        }
        std::copy_n(xc, w, out + j);
        std::copy_n(dgc, w, dgamma + j);
        if (dbeta != nullptr) {
          std::copy_n(dbeta + j, w, dbc);
          for (std::size_t k = 0; k < w; ++k) dbc[k] += gyc[k];
          std::copy_n(dbc, w, dbeta + j);
        }
      }
      for (std::size_t j = full; j < hidden; ++j) {
        const float xhat = (row[j] - m) * s;
        const double g = static_cast<double>(grow[j]) * gamma[j];
        out[j] = static_cast<float>(s * (g - mean_g - xhat * mean_gx));
        dgamma[j] += grow[j] * xhat;
        if (dbeta != nullptr) dbeta[j] += grow[j];
      }
    }
  }
};

#if defined(TRIDENT_DETAIL_HOST_SIMD)
__attribute__((target("avx2"))) inline void layer_norm_forward_avx2(const layer_norm_rows& a) { a.forward(); }
__attribute__((target("avx512f"))) inline void layer_norm_forward_avx512(const layer_norm_rows& a) { a.forward(); }
__attribute__((target("avx2"))) inline void layer_norm_backward_avx2(const layer_norm_rows& a) { a.backward(); }
__attribute__((target("avx512f"))) inline void layer_norm_backward_avx512(const layer_norm_rows& a) { a.backward(); }
#endif

inline void layer_norm_forward(const layer_norm_rows& a) {
#if defined(TRIDENT_DETAIL_HOST_SIMD)
  switch (trident::optim::detail::active_host_isa()) {
    case trident::optim::detail::host_isa::avx512: return layer_norm_forward_avx512(a);
    case trident::optim::detail::host_isa::avx2: return layer_norm_forward_avx2(a);
    default: break;
  }
#endif
  a.forward();
}
inline void layer_norm_backward(const layer_norm_rows& a) {
#if defined(TRIDENT_DETAIL_HOST_SIMD)
  switch (trident::optim::detail::active_host_isa()) {
    case trident::optim::detail::host_isa::avx512: return layer_norm_backward_avx512(a);
    case trident::optim::detail::host_isa::avx2: return layer_norm_backward_avx2(a);
    default: break;
  }
#endif
  a.backward();
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
    detail::layer_norm_forward({.rows = rows, .hidden = hidden, .eps = eps, .x = x.data(), .gamma = gamma.data(),
                                .beta = beta.empty() ? nullptr : beta.data(), .dy = nullptr, .y = y.data(),
                                .mean = mean.data(), .rstd = rstd.data(), .saved_mean = nullptr, .saved_rstd = nullptr,
                                .dgamma = nullptr, .dbeta = nullptr});
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
    detail::layer_norm_backward({.rows = rows, .hidden = hidden, .eps = eps, .x = x.data(), .gamma = gamma.data(),
                                 .beta = nullptr, .dy = dy.data(), .y = dx.data(), .mean = nullptr, .rstd = nullptr,
                                 .saved_mean = mean.data(), .saved_rstd = rstd.data(), .dgamma = dgamma.data(),
                                 .dbeta = dbeta.empty() ? nullptr : dbeta.data()});
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

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC pop_options
#elif defined(__clang__) && !defined(__CUDACC__)
#pragma float_control(pop)
#endif
