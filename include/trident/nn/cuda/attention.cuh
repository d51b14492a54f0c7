// trident/nn/cuda/attention.cuh — the causal softmax attention core on the GPU.
// trident-requires: nvcc
//
// Synopsis (namespace trident::nn::cuda)
//   struct causal_attention { std::size_t seq, batch, heads, head_dim;
//     void forward(blas, stream, qkv, out, probs) const      out = softmax(q k^T / sqrt(d), causal) v
//     void probabilities(blas, stream, qkv, probs) const     the softmax alone, as forward makes it
//     void backward(blas, stream, qkv, probs, dout, dqkv, ds) const   ds: scratch, probs_size() }
//
// nn::causal_attention's contract and layouts (nn/attention.hpp: qkv [seq, batch, heads, 3,
// head_dim], out [seq, batch, heads, head_dim], probs [batch, heads, seq, seq], zero above the
// diagonal; dqkv overwritten). Every (batch, head)'s product is one problem of a cuBLAS strided
// batched SGEMM over the strided rows of qkv (a head's q, k and v sit 3 x head_dim apart from the
// next head's): scores, P v, and backward's dP = dout v^T, dq = dS k, dk = dS^T q, dv = P^T dout.
// The products run over whole [seq, seq] matrices (the masked half is multiplied by zeros: a
// kernel that skips it, FlashAttention's tiling, is the next step for speed). The softmax and
// backward's row sums run one block per row, in double over a fixed tree. Deterministic; each
// head computed the same way whatever the other heads are, so splitting heads over
// tensor-parallel ranks changes no bit.
#pragma once

#if !defined(__CUDACC__)
#error "trident/nn/cuda/attention.cuh is for CUDA translation units: compile this file with nvcc"
#endif

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/error.hpp"
#include "trident/nn/attention.hpp"
#include "trident/nn/cuda/cublas.hpp"
#include "trident/nn/cuda/layers.cuh"

namespace trident::nn::cuda {

namespace detail {

// Row i of one (batch, head)'s [seq, seq] scores, in place: softmax over columns 0..i, zeros after.
template <class = void>  // a template so that several translation units may include this header
__global__ void causal_softmax_kernel(device_span<float> probs, std::size_t seq) {
  __shared__ float fshared[block_size];
  __shared__ double dshared[block_size];
  const std::size_t row_index = blockIdx.x;  // (batch, head, i)
  const std::size_t i = row_index % seq;
  float* row = probs.data() + row_index * seq;
  float max = -INFINITY;
  for (std::size_t j = threadIdx.x; j <= i; j += block_size) max = row[j] > max ? row[j] : max;
  max = block_reduce(max, fshared, max_op{});
  double sum = 0;
  for (std::size_t j = threadIdx.x; j <= i; j += block_size) {
    const float e = expf(__fsub_rn(row[j], max));
    row[j] = e;
    sum += e;
  }
  const double inverse = 1.0 / block_reduce(sum, dshared, add_op{});
  for (std::size_t j = threadIdx.x; j < seq; j += block_size) row[j] = j <= i ? static_cast<float>(row[j] * inverse) : 0.0f;
}

// dS = P * (dP - rowsum(P * dP)) * scale on row i of one (batch, head), in place over dP.
template <class = void>  // a template so that several translation units may include this header
__global__ void causal_softmax_backward_kernel(device_span<const float> probs, device_span<float> ds, std::size_t seq,
                                               double scale) {
  __shared__ double dshared[block_size];
  const std::size_t row_index = blockIdx.x;
  const std::size_t i = row_index % seq;
  const float* p = probs.data() + row_index * seq;
  float* row = ds.data() + row_index * seq;
  double dot = 0;
  for (std::size_t j = threadIdx.x; j <= i; j += block_size) dot += static_cast<double>(p[j]) * row[j];
  dot = block_reduce(dot, dshared, add_op{});
  for (std::size_t j = threadIdx.x; j < seq; j += block_size)
    row[j] = j <= i ? static_cast<float>(static_cast<double>(p[j]) * (row[j] - dot) * scale) : 0.0f;
}

}  // namespace detail

//! Causal multi-head attention over `heads` heads of `head_dim` on the GPU (see the header).
//!
//!   trident::nn::cuda::causal_attention attn{.seq = 1024, .batch = 8, .heads = 12, .head_dim = 64};
//!   attn.forward(blas, stream, qkv, out, probs);
//!   attn.backward(blas, stream, qkv, probs, dout, dqkv, scratch);   // scratch: probs_size() floats
struct causal_attention {
  std::size_t seq = 0;
  std::size_t batch = 0;
  std::size_t heads = 0;
  std::size_t head_dim = 0;

  std::size_t qkv_size() const noexcept { return host().qkv_size(); }
  std::size_t out_size() const noexcept { return host().out_size(); }
  std::size_t probs_size() const noexcept { return host().probs_size(); }

  void forward(blas_ref blas, cudaStream_t stream, device_span<const float> qkv, device_span<float> out,
               device_span<float> probs) const {
    check("cuda::causal_attention::forward", qkv.size(), out.size(), probs.size());
    probabilities(blas, stream, qkv, probs);
    // out_bh = P_bh v_bh: out's rows are [seq, batch, heads, head_dim], head (b, h) at column block b heads + h.
    gemm_strided_batched(blas, stream, op::n, op::n, seq, head_dim, seq, 1.0f, probs.data(), seq, seq * seq,
                         qkv.data() + 2 * head_dim, qkv_stride(), 3 * head_dim, 0.0f, out.data(), out_stride(), head_dim,
                         batch * heads);
  }

  //! probs [batch, heads, seq, seq] from qkv: forward's softmax, bit for bit (forward calls it).
  void probabilities(blas_ref blas, cudaStream_t stream, device_span<const float> qkv, device_span<float> probs) const {
    check("cuda::causal_attention::probabilities", qkv.size(), out_size(), probs.size());
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
    gemm_strided_batched(blas, stream, op::n, op::t, seq, seq, head_dim, scale, qkv.data(), qkv_stride(), 3 * head_dim,
                         qkv.data() + head_dim, qkv_stride(), 3 * head_dim, 0.0f, probs.data(), seq, seq * seq, batch * heads);
    detail::causal_softmax_kernel<><<<rows("cuda::causal_attention::probabilities"), detail::block_size, 0, stream>>>(probs,
                                                                                                                     seq);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }

  //! dqkv (overwritten) from dout, given forward's qkv and probs; ds is scratch of probs_size().
  void backward(blas_ref blas, cudaStream_t stream, device_span<const float> qkv, device_span<const float> probs,
                device_span<const float> dout, device_span<float> dqkv, device_span<float> ds) const {
    const char* who = "cuda::causal_attention::backward";
    check(who, qkv.size(), dout.size(), probs.size());
    TRIDENT_EXPECT(dqkv.size() == qkv.size(), who, ": dqkv has ", dqkv.size(), " elements, expected ", qkv.size());
    TRIDENT_EXPECT(ds.size() == probs.size(), who, ": the scratch ds has ", ds.size(), " elements, expected [batch=", batch,
                   ", heads=", heads, ", seq=", seq, ", seq] = ", probs_size());
    const std::size_t lq = qkv_stride(), lo = out_stride(), sq = 3 * head_dim, ss = seq * seq, count = batch * heads;
    const float* q = qkv.data();
    const float* k = qkv.data() + head_dim;
    const float* v = qkv.data() + 2 * head_dim;
    // dP = dout v^T, then dS = P * (dP - rowsum(P * dP)) / sqrt(head_dim) in place.
    gemm_strided_batched(blas, stream, op::n, op::t, seq, seq, head_dim, 1.0f, dout.data(), lo, head_dim, v, lq, sq, 0.0f,
                         ds.data(), seq, ss, count);
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    detail::causal_softmax_backward_kernel<><<<rows(who), detail::block_size, 0, stream>>>(probs, ds, seq, scale);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    // dq = dS k, dk = dS^T q, dv = P^T dout.
    gemm_strided_batched(blas, stream, op::n, op::n, seq, head_dim, seq, 1.0f, ds.data(), seq, ss, k, lq, sq, 0.0f, dqkv.data(),
                         lq, sq, count);
    gemm_strided_batched(blas, stream, op::t, op::n, seq, head_dim, seq, 1.0f, ds.data(), seq, ss, q, lq, sq, 0.0f,
                         dqkv.data() + head_dim, lq, sq, count);
    gemm_strided_batched(blas, stream, op::t, op::n, seq, head_dim, seq, 1.0f, probs.data(), seq, ss, dout.data(), lo, head_dim,
                         0.0f, dqkv.data() + 2 * head_dim, lq, sq, count);
  }

 private:
  nn::causal_attention host() const noexcept { return {seq, batch, heads, head_dim}; }
  std::size_t qkv_stride() const noexcept { return batch * heads * 3 * head_dim; }  // between positions
  std::size_t out_stride() const noexcept { return batch * heads * head_dim; }
  unsigned rows(const char* who) const {
    const std::size_t n = batch * heads * seq;
    TRIDENT_EXPECT(n <= 0x7fffffffu, who, ": ", n, " softmax rows exceed the grid's limit");
    return static_cast<unsigned>(n);
  }
  void check(const char* who, std::size_t qkv, std::size_t out, std::size_t probs) const {
    host().check(who, qkv, out, probs);
  }
};

}  // namespace trident::nn::cuda
