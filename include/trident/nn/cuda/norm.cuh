// trident/nn/cuda/norm.cuh — LayerNorm and RMSNorm over the last dimension on the GPU.
// trident-requires: nvcc
//
// Synopsis (namespace trident::nn::cuda; device memory as device_span, work on `stream`)
//   struct layer_norm { std::size_t hidden; float eps = 1e-5f;
//     void forward(stream, rows, x, gamma, beta, y, mean, rstd) const   y = (x - mean) rstd gamma + beta
//     void backward(stream, rows, x, gamma, mean, rstd, dy, dx, dgamma, dbeta) const }
//   struct rms_norm { std::size_t hidden; float eps = 1e-6f;
//     void forward(stream, rows, x, gamma, y, rrms) const                 y = x rrms gamma
//     void backward(stream, rows, x, gamma, rrms, dy, dx, dgamma) const }
//
// nn::layer_norm's and nn::rms_norm's contracts (nn/norm.hpp: torch.nn.LayerNorm, biased variance, the row
// statistics saved for backward, dx overwritten, dgamma and dbeta accumulated) and its shape
// checks. One block per row; the row sums run in double over a fixed tree (the host sums in
// index order, so the statistics agree to rounding, not bit for bit); the parameter gradients
// sum the rows in double, 8 x 128 threads per tile of 8 columns and a fixed tree (the host sums
// in row order in float: equal to rounding). Deterministic, no atomics.
// The float element arithmetic is the host's, with explicit rounding (__fmul_rn, __fadd_rn) so
// that nvcc does not contract it into FMAs (the double expressions may contract: within
// tolerance). backward's dx must not alias dy (the parameter gradients read dy after dx is
// written), as on the host.
#pragma once

#if !defined(__CUDACC__)
#error "trident/nn/cuda/norm.cuh is for CUDA translation units: compile this file with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/error.hpp"
#include "trident/nn/cuda/layers.cuh"
#include "trident/nn/norm.hpp"

namespace trident::nn::cuda {

namespace detail {

template <class = void>  // a template so that several translation units may include this header
__global__ void layer_norm_forward_kernel(device_span<const float> x, device_span<const float> gamma,
                                          device_span<const float> beta, device_span<float> y, device_span<float> mean,
                                          device_span<float> rstd, std::size_t hidden, float eps) {
  __shared__ double shared[block_size];
  const std::size_t r = blockIdx.x;
  const float* row = x.data() + r * hidden;
  double sum = 0;
  for (std::size_t j = threadIdx.x; j < hidden; j += block_size) sum += row[j];
  const double mu = block_reduce(sum, shared, add_op{}) / static_cast<double>(hidden);
  double var = 0;
  for (std::size_t j = threadIdx.x; j < hidden; j += block_size) var += (row[j] - mu) * (row[j] - mu);
  var = block_reduce(var, shared, add_op{}) / static_cast<double>(hidden);
  const float m = static_cast<float>(mu);
  const float s = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
  float* out = y.data() + r * hidden;
  for (std::size_t j = threadIdx.x; j < hidden; j += block_size) {
    const float xhat = __fmul_rn(__fsub_rn(row[j], m), s);
    out[j] = __fadd_rn(__fmul_rn(xhat, gamma[j]), beta.empty() ? 0.0f : beta[j]);
  }
}

// dx for one row per block: rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma, in double.
template <class = void>  // a template so that several translation units may include this header
__global__ void layer_norm_dx_kernel(device_span<const float> x, device_span<const float> gamma,
                                     device_span<const float> mean, device_span<const float> rstd,
                                     device_span<const float> dy, device_span<float> dx, std::size_t hidden) {
  __shared__ double shared[block_size];
  const std::size_t r = blockIdx.x;
  const float* row = x.data() + r * hidden;
  const float* grow = dy.data() + r * hidden;
  const float m = mean[r], s = rstd[r];
  double sum_g = 0, sum_gx = 0;
  for (std::size_t j = threadIdx.x; j < hidden; j += block_size) {
    const double xhat = static_cast<double>(__fmul_rn(__fsub_rn(row[j], m), s));
    const double g = static_cast<double>(grow[j]) * gamma[j];
    sum_g += g;
    sum_gx += g * xhat;
  }
  const double n = static_cast<double>(hidden);
  const double mean_g = block_reduce(sum_g, shared, add_op{}) / n;
  const double mean_gx = block_reduce(sum_gx, shared, add_op{}) / n;
  float* out = dx.data() + r * hidden;
  for (std::size_t j = threadIdx.x; j < hidden; j += block_size) {
    const float xhat = __fmul_rn(__fsub_rn(row[j], m), s);
    const double g = static_cast<double>(grow[j]) * gamma[j];
    out[j] = static_cast<float>(s * (g - mean_g - xhat * mean_gx));
  }
}

// The parameter gradients' column sums: layers.cuh's column-sum tiles (param_tile columns x
// param_rows rows of threads, double partial sums, then param_tree's fixed tree).

// dgamma[j] += sum over rows of dy xhat, dbeta[j] += sum of dy.
template <class = void>  // a template so that several translation units may include this header
__global__ void layer_norm_params_kernel(device_span<const float> x, device_span<const float> mean,
                                         device_span<const float> rstd, device_span<const float> dy,
                                         device_span<float> dgamma, device_span<float> dbeta, std::size_t rows,
                                         std::size_t hidden) {
  __shared__ double sg[param_rows][param_tile + 1], sb[param_rows][param_tile + 1];
  const std::size_t j = blockIdx.x * std::size_t{param_tile} + threadIdx.x;
  double g = 0, b = 0;
  if (j < hidden)
    for (std::size_t r = threadIdx.y; r < rows; r += param_rows) {
      const double d = dy[r * hidden + j];
      g += d * static_cast<double>(__fmul_rn(__fsub_rn(x[r * hidden + j], mean[r]), rstd[r]));
      b += d;
    }
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  param_tree(sg);
  param_tree(sb);
  if (threadIdx.y == 0 && j < hidden) {
    dgamma[j] = static_cast<float>(static_cast<double>(dgamma[j]) + sg[0][threadIdx.x]);
    if (!dbeta.empty()) dbeta[j] = static_cast<float>(static_cast<double>(dbeta[j]) + sb[0][threadIdx.x]);
  }
}

template <class = void>  // a template so that several translation units may include this header
__global__ void rms_norm_forward_kernel(device_span<const float> x, device_span<const float> gamma, device_span<float> y,
                                        device_span<float> rrms, std::size_t hidden, float eps) {
  __shared__ double shared[block_size];
  const std::size_t r = blockIdx.x;
  const float* row = x.data() + r * hidden;
  double sum = 0;
  for (std::size_t j = threadIdx.x; j < hidden; j += block_size) sum += static_cast<double>(row[j]) * row[j];
  sum = block_reduce(sum, shared, add_op{});
  const float s = static_cast<float>(1.0 / sqrt(sum / static_cast<double>(hidden) + static_cast<double>(eps)));
  if (threadIdx.x == 0) rrms[r] = s;
  float* out = y.data() + r * hidden;
  for (std::size_t j = threadIdx.x; j < hidden; j += block_size) out[j] = __fmul_rn(__fmul_rn(row[j], s), gamma[j]);
}

// dx = rrms (g - xhat mean(g xhat)), g = dy gamma, xhat = x rrms, in double (one block per row).
template <class = void>  // a template so that several translation units may include this header
__global__ void rms_norm_dx_kernel(device_span<const float> x, device_span<const float> gamma, device_span<const float> rrms,
                                   device_span<const float> dy, device_span<float> dx, std::size_t hidden) {
  __shared__ double shared[block_size];
  const std::size_t r = blockIdx.x;
  const float* row = x.data() + r * hidden;
  const float* grow = dy.data() + r * hidden;
  const float s = rrms[r];
  double sum_gx = 0;
  for (std::size_t j = threadIdx.x; j < hidden; j += block_size)
    sum_gx += static_cast<double>(grow[j]) * gamma[j] * (static_cast<double>(row[j]) * s);
  const double mean_gx = block_reduce(sum_gx, shared, add_op{}) / static_cast<double>(hidden);
  float* out = dx.data() + r * hidden;
  for (std::size_t j = threadIdx.x; j < hidden; j += block_size) {
    const float xhat = __fmul_rn(row[j], s);
    out[j] = static_cast<float>(s * (static_cast<double>(grow[j]) * gamma[j] - xhat * mean_gx));
  }
}

// dgamma[j] += sum over rows of dy xhat (param_tree's tiles, as layer_norm_params_kernel).
template <class = void>  // a template so that several translation units may include this header
__global__ void rms_norm_params_kernel(device_span<const float> x, device_span<const float> rrms, device_span<const float> dy,
                                       device_span<float> dgamma, std::size_t rows, std::size_t hidden) {
  __shared__ double sg[param_rows][param_tile + 1];
  const std::size_t j = blockIdx.x * std::size_t{param_tile} + threadIdx.x;
  double g = 0;
  if (j < hidden)
    for (std::size_t r = threadIdx.y; r < rows; r += param_rows)
      g += static_cast<double>(dy[r * hidden + j]) * static_cast<double>(__fmul_rn(x[r * hidden + j], rrms[r]));
  sg[threadIdx.y][threadIdx.x] = g;
  param_tree(sg);
  if (threadIdx.y == 0 && j < hidden) dgamma[j] = static_cast<float>(static_cast<double>(dgamma[j]) + sg[0][threadIdx.x]);
}

inline unsigned row_grid(const char* who, std::size_t rows) {
  TRIDENT_EXPECT(rows <= 0x7fffffffu, who, ": ", rows, " rows exceed the grid's limit");
  return static_cast<unsigned>(rows);
}

}  // namespace detail

//! torch.nn.LayerNorm(hidden, eps=eps) on the GPU: nn::layer_norm's contract (see the header).
//!
//!   trident::nn::cuda::layer_norm ln{.hidden = 768};
//!   ln.forward(stream, rows, x, gamma, beta, y, mean, rstd);
//!   ln.backward(stream, rows, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
struct layer_norm {
  std::size_t hidden = 0;
  float eps = 1e-5f;

  void forward(cudaStream_t stream, std::size_t rows, device_span<const float> x, device_span<const float> gamma,
               device_span<const float> beta, device_span<float> y, device_span<float> mean, device_span<float> rstd) const {
    nn::detail::check_norm("cuda::layer_norm::forward", rows, hidden, x.size(), gamma.size(), y.size(), mean.size());
    TRIDENT_EXPECT(rstd.size() == rows, "cuda::layer_norm::forward: rstd has ", rstd.size(), " elements, expected ", rows);
    TRIDENT_EXPECT(beta.empty() || beta.size() == hidden, "cuda::layer_norm::forward: beta has ", beta.size(),
                   " elements, expected ", hidden, " (or none)");
    if (rows == 0) return;
    detail::layer_norm_forward_kernel<><<<detail::row_grid("cuda::layer_norm::forward", rows), detail::block_size, 0, stream>>>(
        x, gamma, beta, y, mean, rstd, hidden, eps);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }

  //! dx overwritten; dgamma += sum of dy xhat, dbeta += sum of dy (dbeta may be empty).
  void backward(cudaStream_t stream, std::size_t rows, device_span<const float> x, device_span<const float> gamma,
                device_span<const float> mean, device_span<const float> rstd, device_span<const float> dy,
                device_span<float> dx, device_span<float> dgamma, device_span<float> dbeta) const {
    nn::detail::check_norm("cuda::layer_norm::backward", rows, hidden, x.size(), gamma.size(), dy.size(), mean.size());
    TRIDENT_EXPECT(rstd.size() == rows && dx.size() == x.size() && dgamma.size() == hidden &&
                       (dbeta.empty() || dbeta.size() == hidden),
                   "cuda::layer_norm::backward: expected rstd [", rows, "], dx [", rows, ", ", hidden, "], dgamma [", hidden,
                   "] and dbeta [", hidden, "] (or none); got ", rstd.size(), ", ", dx.size(), ", ", dgamma.size(), ", ",
                   dbeta.size());
    if (rows == 0) return;
    detail::layer_norm_dx_kernel<><<<detail::row_grid("cuda::layer_norm::backward", rows), detail::block_size, 0, stream>>>(
        x, gamma, mean, rstd, dy, dx, hidden);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    detail::layer_norm_params_kernel<><<<detail::param_grid(hidden), dim3(detail::param_tile, detail::param_rows), 0, stream>>>(
        x, mean, rstd, dy, dgamma, dbeta, rows, hidden);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }
};

//! torch.nn.RMSNorm(hidden, eps=eps) on the GPU: nn::rms_norm's contract (see the header).
//!
//!   trident::nn::cuda::rms_norm norm{.hidden = 4096};
//!   norm.forward(stream, rows, x, gamma, y, rrms);
//!   norm.backward(stream, rows, x, gamma, rrms, dy, dx, dgamma);
struct rms_norm {
  std::size_t hidden = 0;
  float eps = 1e-6f;

  void forward(cudaStream_t stream, std::size_t rows, device_span<const float> x, device_span<const float> gamma,
               device_span<float> y, device_span<float> rrms) const {
    nn::detail::check_norm("cuda::rms_norm::forward", rows, hidden, x.size(), gamma.size(), y.size(), rrms.size());
    if (rows == 0) return;
    detail::rms_norm_forward_kernel<><<<detail::row_grid("cuda::rms_norm::forward", rows), detail::block_size, 0, stream>>>(
        x, gamma, y, rrms, hidden, eps);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }

  //! dx overwritten (must not alias dy); dgamma += sum of dy xhat.
  void backward(cudaStream_t stream, std::size_t rows, device_span<const float> x, device_span<const float> gamma,
                device_span<const float> rrms, device_span<const float> dy, device_span<float> dx,
                device_span<float> dgamma) const {
    nn::detail::check_norm("cuda::rms_norm::backward", rows, hidden, x.size(), gamma.size(), dy.size(), rrms.size());
    TRIDENT_EXPECT(dx.size() == x.size() && dgamma.size() == hidden, "cuda::rms_norm::backward: expected dx [", rows, ", ",
                   hidden, "] and dgamma [", hidden, "]; got ", dx.size(), " and ", dgamma.size());
    if (rows == 0) return;
    detail::rms_norm_dx_kernel<><<<detail::row_grid("cuda::rms_norm::backward", rows), detail::block_size, 0, stream>>>(
        x, gamma, rrms, dy, dx, hidden);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    detail::rms_norm_params_kernel<><<<detail::param_grid(hidden), dim3(detail::param_tile, detail::param_rows), 0, stream>>>(
        x, rrms, dy, dgamma, rows, hidden);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace trident::nn::cuda
