// trident/nn/cuda/norm.cuh — LayerNorm and RMSNorm over the last dimension on the GPU.
// trident-requires: nvcc
//
// Synopsis (namespace trident::nn::cuda; device memory as device_span, work on `stream`)
//   struct layer_norm { std::size_t hidden; float eps = 1e-5f;
//     void forward(stream, rows, x, gamma, beta, y, mean, rstd) const   y = (x - mean) rstd gamma + beta
//                                                                       (y float, or bf16: rounded)
//     std::size_t backward_scratch_size(rows) const
//     void backward(stream, rows, x, gamma, mean, rstd, dy, dx, dgamma, dbeta[, scratch[, residual]]) const }
//                                                            (dx = residual + the input gradient)
//   struct rms_norm { std::size_t hidden; float eps = 1e-6f;
//     void forward(stream, rows, x, gamma, y, rrms) const                 y = x rrms gamma
//     std::size_t backward_scratch_size(rows) const
//     void backward(stream, rows, x, gamma, rrms, dy, dx, dgamma[, scratch[, residual]]) const }
//
// nn::layer_norm's and nn::rms_norm's contracts (nn/norm.hpp: torch.nn.LayerNorm, biased variance, the row
// statistics saved for backward, dx overwritten, dgamma and dbeta accumulated) and its shape
// checks. A warp per row; the row sums run in double over a fixed tree (the host sums in index
// order, so the statistics agree to rounding, not bit for bit); the parameter gradients sum the
// rows in double, 8 x 128 threads per tile of 8 columns and a fixed tree, or with a scratch in
// chunks of 256 rows added in order (the host sums in row order in float: equal to rounding).
// Deterministic, no atomics.
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
#include "trident/core/half.hpp"
#include "trident/nn/cuda/layers.cuh"
#include "trident/nn/norm.hpp"

namespace trident::nn::cuda {

namespace detail {

// The row kernels run a warp per row (norm_warps rows per block): the row sums reduce over the
// lanes by __shfl_xor_sync, with no barrier, where a block per row of 256 threads paid eight
// __syncthreads per sum for rows of a few hundred floats. The butterfly gives every lane the
// same bits (each step adds the same two values on both partners), and the same bits every run.
inline constexpr unsigned norm_warps = 8;

__device__ inline double warp_sum(double v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

inline unsigned warp_row_grid(const char* who, std::size_t rows) {
  const std::size_t blocks = (rows + norm_warps - 1) / norm_warps;
  TRIDENT_EXPECT(blocks <= 0x7fffffffu, who, ": ", rows, " rows exceed the grid's limit");
  return static_cast<unsigned>(blocks);
}

// Out: float, or bf16 (the float value rounded as bf16's constructor rounds).
template <class Out>
__global__ void layer_norm_forward_kernel(device_span<const float> x, device_span<const float> gamma,
                                          device_span<const float> beta, device_span<Out> y, device_span<float> mean,
                                          device_span<float> rstd, std::size_t rows, std::size_t hidden, float eps) {
  const std::size_t r = blockIdx.x * std::size_t{norm_warps} + threadIdx.x / 32;
  if (r >= rows) return;  // the whole warp: no barriers below
  const unsigned lane = threadIdx.x % 32;
  const float* row = x.data() + r * hidden;
  double sum = 0;
  for (std::size_t j = lane; j < hidden; j += 32) sum += row[j];
  const double mu = warp_sum(sum) / static_cast<double>(hidden);
  double var = 0;
  for (std::size_t j = lane; j < hidden; j += 32) var += (row[j] - mu) * (row[j] - mu);
  var = warp_sum(var) / static_cast<double>(hidden);
  const float m = static_cast<float>(mu);
  const float s = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
  Out* out = y.data() + r * hidden;
  for (std::size_t j = lane; j < hidden; j += 32) {
    const float xhat = __fmul_rn(__fsub_rn(row[j], m), s);
    out[j] = Out(__fadd_rn(__fmul_rn(xhat, gamma[j]), beta.empty() ? 0.0f : beta[j]));
  }
}

// dx for one row per warp: rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma, in double.
template <class = void>  // a template so that several translation units may include this header
__global__ void layer_norm_dx_kernel(device_span<const float> x, device_span<const float> gamma,
                                     device_span<const float> mean, device_span<const float> rstd,
                                     device_span<const float> dy, device_span<float> dx, device_span<const float> residual,
                                     std::size_t rows, std::size_t hidden) {
  const std::size_t r = blockIdx.x * std::size_t{norm_warps} + threadIdx.x / 32;
  if (r >= rows) return;
  const unsigned lane = threadIdx.x % 32;
  const float* row = x.data() + r * hidden;
  const float* grow = dy.data() + r * hidden;
  const float* rest = residual.empty() ? nullptr : residual.data() + r * hidden;
  const float m = mean[r], s = rstd[r];
  double sum_g = 0, sum_gx = 0;
  for (std::size_t j = lane; j < hidden; j += 32) {
    const double xhat = static_cast<double>(__fmul_rn(__fsub_rn(row[j], m), s));
    const double g = static_cast<double>(grow[j]) * gamma[j];
    sum_g += g;
    sum_gx += g * xhat;
  }
  const double n = static_cast<double>(hidden);
  const double mean_g = warp_sum(sum_g) / n;
  const double mean_gx = warp_sum(sum_gx) / n;
  float* out = dx.data() + r * hidden;
  for (std::size_t j = lane; j < hidden; j += 32) {
    const float xhat = __fmul_rn(__fsub_rn(row[j], m), s);
    const double g = static_cast<double>(grow[j]) * gamma[j];
    const float v = static_cast<float>(s * (g - mean_g - xhat * mean_gx));
    out[j] = rest == nullptr ? v : __fadd_rn(rest[j], v);
  }
}

template <class = void>  // a template so that several translation units may include this header
__global__ void rms_norm_forward_kernel(device_span<const float> x, device_span<const float> gamma, device_span<float> y,
                                        device_span<float> rrms, std::size_t rows, std::size_t hidden, float eps) {
  const std::size_t r = blockIdx.x * std::size_t{norm_warps} + threadIdx.x / 32;
  if (r >= rows) return;
  const unsigned lane = threadIdx.x % 32;
  const float* row = x.data() + r * hidden;
  double sum = 0;
  for (std::size_t j = lane; j < hidden; j += 32) sum += static_cast<double>(row[j]) * row[j];
  sum = warp_sum(sum);
  const float s = static_cast<float>(1.0 / sqrt(sum / static_cast<double>(hidden) + static_cast<double>(eps)));
  if (lane == 0) rrms[r] = s;
  float* out = y.data() + r * hidden;
  for (std::size_t j = lane; j < hidden; j += 32) out[j] = __fmul_rn(__fmul_rn(row[j], s), gamma[j]);
}

// dx = rrms (g - xhat mean(g xhat)), g = dy gamma, xhat = x rrms, in double (one warp per row).
template <class = void>  // a template so that several translation units may include this header
__global__ void rms_norm_dx_kernel(device_span<const float> x, device_span<const float> gamma, device_span<const float> rrms,
                                   device_span<const float> dy, device_span<float> dx, device_span<const float> residual,
                                   std::size_t rows, std::size_t hidden) {
  const std::size_t r = blockIdx.x * std::size_t{norm_warps} + threadIdx.x / 32;
  if (r >= rows) return;
  const unsigned lane = threadIdx.x % 32;
  const float* row = x.data() + r * hidden;
  const float* grow = dy.data() + r * hidden;
  const float* rest = residual.empty() ? nullptr : residual.data() + r * hidden;
  const float s = rrms[r];
  double sum_gx = 0;
  for (std::size_t j = lane; j < hidden; j += 32)
    sum_gx += static_cast<double>(grow[j]) * gamma[j] * (static_cast<double>(row[j]) * s);
  const double mean_gx = warp_sum(sum_gx) / static_cast<double>(hidden);
  float* out = dx.data() + r * hidden;
  for (std::size_t j = lane; j < hidden; j += 32) {
    const float xhat = __fmul_rn(row[j], s);
    const float v = static_cast<float>(s * (static_cast<double>(grow[j]) * gamma[j] - xhat * mean_gx));
    out[j] = rest == nullptr ? v : __fadd_rn(rest[j], v);
  }
}

// The parameter gradients with a scratch (backward_scratch_size): the rows cut into chunks of
// norm_chunk_rows, a block per (32 columns, chunk) whose 8 rows of threads each read a warp's
// 128 contiguous bytes per row, their double sums combined over a fixed tree and stored per
// chunk; then one thread per column adds the chunks in order. Thousands of blocks instead of
// hidden / 8 (96 for GPT-2's 768: most of an H100's 132 multiprocessors held one block each).
inline constexpr unsigned norm_param_cols = 32, norm_param_rows = 8, norm_chunk_rows = 256;

inline std::size_t norm_chunks(std::size_t rows) { return (rows + norm_chunk_rows - 1) / norm_chunk_rows; }

// Centered: LayerNorm's xhat = (x - mean) rstd and both sums (dgamma's, then dbeta's); else
// RMSNorm's xhat = x rrms (`rstd`) and dgamma's alone (`mean` unused).
template <bool Centered>
__global__ void norm_params_partial_kernel(device_span<const float> x, device_span<const float> mean,
                                           device_span<const float> rstd, device_span<const float> dy,
                                           device_span<double> partial, std::size_t rows, std::size_t hidden) {
  __shared__ double sg[norm_param_rows][norm_param_cols + 1], sb[norm_param_rows][norm_param_cols + 1];
  const std::size_t j = blockIdx.x * std::size_t{norm_param_cols} + threadIdx.x, chunk = blockIdx.y;
  const std::size_t first = chunk * norm_chunk_rows, last = first + norm_chunk_rows < rows ? first + norm_chunk_rows : rows;
  double g = 0, b = 0;
  if (j < hidden)
    for (std::size_t r = first + threadIdx.y; r < last; r += norm_param_rows) {
      const double d = dy[r * hidden + j];
      const float v = x[r * hidden + j];
      const float xhat = Centered ? __fmul_rn(__fsub_rn(v, mean[r]), rstd[r]) : __fmul_rn(v, rstd[r]);
      g += d * static_cast<double>(xhat);
      if constexpr (Centered) b += d;
    }
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  for (unsigned half = norm_param_rows / 2; half > 0; half /= 2) {
    if (threadIdx.y < half) {
      sg[threadIdx.y][threadIdx.x] += sg[threadIdx.y + half][threadIdx.x];
      if constexpr (Centered) sb[threadIdx.y][threadIdx.x] += sb[threadIdx.y + half][threadIdx.x];
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && j < hidden) {
    const std::size_t chunks = gridDim.y;
    partial[chunk * hidden + j] = sg[0][threadIdx.x];
    if constexpr (Centered) partial[(chunks + chunk) * hidden + j] = sb[0][threadIdx.x];
  }
}

// dgamma[j] += the chunks' sums in chunk order; dbeta[j] likewise when given (LayerNorm's).
template <class = void>  // a template so that several translation units may include this header
__global__ void norm_params_finish_kernel(device_span<const double> partial, device_span<float> dgamma, device_span<float> dbeta,
                                          std::size_t chunks, std::size_t hidden) {
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < hidden; j += std::size_t{gridDim.x} * blockDim.x) {
    double g = 0;
    for (std::size_t c = 0; c < chunks; ++c) g += partial[c * hidden + j];
    dgamma[j] = static_cast<float>(static_cast<double>(dgamma[j]) + g);
    if (dbeta.empty()) continue;
    double b = 0;
    for (std::size_t c = 0; c < chunks; ++c) b += partial[(chunks + c) * hidden + j];
    dbeta[j] = static_cast<float>(static_cast<double>(dbeta[j]) + b);
  }
}

// The chunked parameter sums on `stream`; false when they cannot run (no scratch, or more chunks
// than the grid's y limit: 16.7 M rows), and the caller runs the kernel without a scratch.
template <bool Centered>
bool norm_params_chunked(cudaStream_t stream, std::size_t rows, std::size_t hidden, device_span<const float> x,
                         device_span<const float> mean, device_span<const float> rstd, device_span<const float> dy,
                         device_span<float> dgamma, device_span<float> dbeta, device_span<double> scratch) {
  const std::size_t chunks = norm_chunks(rows), tiles = (hidden + norm_param_cols - 1) / norm_param_cols;
  if (scratch.empty() || chunks > 65535 || tiles > 0x7fffffffu) return false;  // (the scratch-less kernel checks its grid)
  norm_params_partial_kernel<Centered><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)),
                                         dim3(norm_param_cols, norm_param_rows), 0, stream>>>(x, mean, rstd, dy, scratch, rows,
                                                                                              hidden);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
  norm_params_finish_kernel<><<<grid_for(hidden), block_size, 0, stream>>>(scratch, dgamma, dbeta, chunks, hidden);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
  return true;
}

// The parameter gradients without a scratch: layers.cuh's column-sum tiles (param_tile columns x
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


}  // namespace detail

//! torch.nn.LayerNorm(hidden, eps=eps) on the GPU: nn::layer_norm's contract (see the header).
//!
//!   trident::nn::cuda::layer_norm ln{.hidden = 768};
//!   ln.forward(stream, rows, x, gamma, beta, y, mean, rstd);
//!   ln.backward(stream, rows, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
//!   ln.backward(stream, rows, x, gamma, mean, rstd, dy, dx, dgamma, dbeta, scratch);  // faster, with
//!                                            // ln.backward_scratch_size(rows) doubles of scratch
struct layer_norm {
  std::size_t hidden = 0;
  float eps = 1e-5f;

  void forward(cudaStream_t stream, std::size_t rows, device_span<const float> x, device_span<const float> gamma,
               device_span<const float> beta, device_span<float> y, device_span<float> mean, device_span<float> rstd) const {
    launch_forward(stream, rows, x, gamma, beta, y, mean, rstd);
  }
  //! forward with y rounded to bf16 (as bf16's constructor rounds the float y): for a norm whose
  //! only reader is a GEMM on bf16 operands (gemm_math::bf16), which would round y the same way.
  void forward(cudaStream_t stream, std::size_t rows, device_span<const float> x, device_span<const float> gamma,
               device_span<const float> beta, device_span<bf16> y, device_span<float> mean, device_span<float> rstd) const {
    launch_forward(stream, rows, x, gamma, beta, y, mean, rstd);
  }

  //! The doubles backward() takes as scratch for `rows` rows: the parameter gradients then sum
  //! over thousands of blocks (a partial sum per chunk of 256 rows) instead of hidden / 8. Norms
  //! run one at a time on a stream can share one, sized for their largest `rows`.
  std::size_t backward_scratch_size(std::size_t rows) const noexcept { return 2 * detail::norm_chunks(rows) * hidden; }

  //! dx overwritten; dgamma += sum of dy xhat, dbeta += sum of dy (dbeta may be empty). With a
  //! `scratch` of at least backward_scratch_size(rows) doubles (overwritten) the parameter
  //! gradients take the chunked path: the same sums in another order (in double, then rounded).
  //! With a `residual` ([rows, hidden]; it may be dx itself), dx = residual + the norm's input
  //! gradient, in one pass: a pre-norm block's residual branch, the bits of add_to after it.
  void backward(cudaStream_t stream, std::size_t rows, device_span<const float> x, device_span<const float> gamma,
                device_span<const float> mean, device_span<const float> rstd, device_span<const float> dy,
                device_span<float> dx, device_span<float> dgamma, device_span<float> dbeta,
                device_span<double> scratch = {}, device_span<const float> residual = {}) const {
    nn::detail::check_norm("cuda::layer_norm::backward", rows, hidden, x.size(), gamma.size(), dy.size(), mean.size());
    TRIDENT_EXPECT(rstd.size() == rows && dx.size() == x.size() && dgamma.size() == hidden &&
                       (dbeta.empty() || dbeta.size() == hidden),
                   "cuda::layer_norm::backward: expected rstd [", rows, "], dx [", rows, ", ", hidden, "], dgamma [", hidden,
                   "] and dbeta [", hidden, "] (or none); got ", rstd.size(), ", ", dx.size(), ", ", dgamma.size(), ", ",
                   dbeta.size());
    TRIDENT_EXPECT(scratch.empty() || scratch.size() >= backward_scratch_size(rows), "cuda::layer_norm::backward: the scratch has ",
                   scratch.size(), " doubles, expected at least backward_scratch_size(", rows, ") = ", backward_scratch_size(rows),
                   " (or none)");
    TRIDENT_EXPECT(residual.empty() || residual.size() == dx.size(), "cuda::layer_norm::backward: the residual has ",
                   residual.size(), " elements, expected [", rows, ", ", hidden, "] (or none)");
    if (rows == 0) return;
    const dim3 columns = detail::param_grid(hidden);  // checked before anything is queued
    detail::layer_norm_dx_kernel<><<<detail::warp_row_grid("cuda::layer_norm::backward", rows), detail::norm_warps * 32, 0,
                                     stream>>>(x, gamma, mean, rstd, dy, dx, residual, rows, hidden);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    if (detail::norm_params_chunked<true>(stream, rows, hidden, x, mean, rstd, dy, dgamma, dbeta,
                                          scratch))
      return;
    detail::layer_norm_params_kernel<><<<columns, dim3(detail::param_tile, detail::param_rows), 0, stream>>>(
        x, mean, rstd, dy, dgamma, dbeta, rows, hidden);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }

 private:
  template <class Out>
  void launch_forward(cudaStream_t stream, std::size_t rows, device_span<const float> x, device_span<const float> gamma,
                      device_span<const float> beta, device_span<Out> y, device_span<float> mean, device_span<float> rstd) const {
    nn::detail::check_norm("cuda::layer_norm::forward", rows, hidden, x.size(), gamma.size(), y.size(), mean.size());
    TRIDENT_EXPECT(rstd.size() == rows, "cuda::layer_norm::forward: rstd has ", rstd.size(), " elements, expected ", rows);
    TRIDENT_EXPECT(beta.empty() || beta.size() == hidden, "cuda::layer_norm::forward: beta has ", beta.size(),
                   " elements, expected ", hidden, " (or none)");
    if (rows == 0) return;
    detail::layer_norm_forward_kernel<Out><<<detail::warp_row_grid("cuda::layer_norm::forward", rows), detail::norm_warps * 32,
                                             0, stream>>>(x, gamma, beta, y, mean, rstd, rows, hidden, eps);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }
};

//! torch.nn.RMSNorm(hidden, eps=eps) on the GPU: nn::rms_norm's contract (see the header).
//!
//!   trident::nn::cuda::rms_norm norm{.hidden = 4096};
//!   norm.forward(stream, rows, x, gamma, y, rrms);
//!   norm.backward(stream, rows, x, gamma, rrms, dy, dx, dgamma);
//!   norm.backward(stream, rows, x, gamma, rrms, dy, dx, dgamma, scratch);  // norm.backward_scratch_size(rows) doubles
struct rms_norm {
  std::size_t hidden = 0;
  float eps = 1e-6f;

  void forward(cudaStream_t stream, std::size_t rows, device_span<const float> x, device_span<const float> gamma,
               device_span<float> y, device_span<float> rrms) const {
    nn::detail::check_norm("cuda::rms_norm::forward", rows, hidden, x.size(), gamma.size(), y.size(), rrms.size());
    if (rows == 0) return;
    detail::rms_norm_forward_kernel<><<<detail::warp_row_grid("cuda::rms_norm::forward", rows), detail::norm_warps * 32, 0,
                                        stream>>>(x, gamma, y, rrms, rows, hidden, eps);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }

  //! The doubles backward() takes as scratch for `rows` rows (as layer_norm's, dgamma's half).
  std::size_t backward_scratch_size(std::size_t rows) const noexcept { return detail::norm_chunks(rows) * hidden; }

  //! dx overwritten (must not alias dy); dgamma += sum of dy xhat; `scratch` and `residual` as
  //! layer_norm's.
  void backward(cudaStream_t stream, std::size_t rows, device_span<const float> x, device_span<const float> gamma,
                device_span<const float> rrms, device_span<const float> dy, device_span<float> dx, device_span<float> dgamma,
                device_span<double> scratch = {}, device_span<const float> residual = {}) const {
    nn::detail::check_norm("cuda::rms_norm::backward", rows, hidden, x.size(), gamma.size(), dy.size(), rrms.size());
    TRIDENT_EXPECT(dx.size() == x.size() && dgamma.size() == hidden, "cuda::rms_norm::backward: expected dx [", rows, ", ",
                   hidden, "] and dgamma [", hidden, "]; got ", dx.size(), " and ", dgamma.size());
    TRIDENT_EXPECT(scratch.empty() || scratch.size() >= backward_scratch_size(rows), "cuda::rms_norm::backward: the scratch has ",
                   scratch.size(), " doubles, expected at least backward_scratch_size(", rows, ") = ", backward_scratch_size(rows),
                   " (or none)");
    TRIDENT_EXPECT(residual.empty() || residual.size() == dx.size(), "cuda::rms_norm::backward: the residual has ",
                   residual.size(), " elements, expected [", rows, ", ", hidden, "] (or none)");
    if (rows == 0) return;
    const dim3 columns = detail::param_grid(hidden);  // checked before anything is queued
    detail::rms_norm_dx_kernel<><<<detail::warp_row_grid("cuda::rms_norm::backward", rows), detail::norm_warps * 32, 0,
                                   stream>>>(x, gamma, rrms, dy, dx, residual, rows, hidden);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    if (detail::norm_params_chunked<false>(stream, rows, hidden, x, {}, rrms, dy, dgamma, {}, scratch))
      return;
    detail::rms_norm_params_kernel<><<<columns, dim3(detail::param_tile, detail::param_rows), 0, stream>>>(
        x, rrms, dy, dgamma, rows, hidden);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace trident::nn::cuda
