// trident/nn/attention.hpp — the causal softmax attention core on the host.
//
// Synopsis
//   struct causal_attention { std::size_t seq, batch, heads, head_dim;
//     void forward(qkv, out, probs) const       out = softmax(q k^T / sqrt(head_dim), causal) v
//     void probabilities(qkv, probs) const      the softmax alone, as forward makes it (selective
//                                               recomputation reruns it in backward)
//     void backward(qkv, probs, dout, dqkv) const }
//
// Layouts are sequence-major, as Megatron-LM's: qkv [seq, batch, heads, 3, head_dim] (each
// head's query, key and value side by side, so that splitting a fused QKV projection's output
// features into t equal parts gives each tensor-parallel rank whole heads), out [seq, batch,
// heads, head_dim], probs [batch, heads, seq, seq] (the softmax, saved for backward as autograd
// does; above the diagonal it is 0). torch's scaled_dot_product_attention(q, k, v,
// is_causal=True) without dropout. dqkv is overwritten.
//
// The products (q k^T, P v and backward's four) are nn/gemm.hpp GEMMs per (batch, head) on the
// strided rows of qkv, in row blocks that stop at the causal diagonal; the softmax's and
// backward's row loops are vectorised (exp without libm, nn/activation.hpp's exp_nonpositive)
// and sum in double over 16 lanes in a fixed order. Deterministic, and each head computed the
// same way whatever the other heads are, so splitting heads over tensor-parallel ranks changes
// no bit.
//
// Checked against torch's own output, tests/fixtures/torch_layers.txt (tests/nn/
// test_nn_reference.cpp; q, k and v sliced from this qkv layout): out and dqkv within 1.05e-6 of
// torch's float32 results (normwise; the worst is a peaked softmax), which is torch's own float32
// rounding (an earlier version of this file that summed every product in double was as far).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/nn/activation.hpp"
#include "trident/nn/gemm.hpp"
#include "trident/optim/host_simd.hpp"

// No FMA contraction, as nn/activation.hpp: the AVX2 and AVX-512 clones of the softmax loops
// then round every element as the portable code does (nn.host checks the bits).
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

// The softmax's rows in chunks of 16 floats (one AVX-512 vector; the loops over a chunk have a
// fixed trip count, which GCC's -O2 cost model needs to vectorise them). Row sums in double over
// 16 lanes: lane k adds the elements j = k mod 16 in index order, the lanes meet in a fixed
// tree, so every path (portable, AVX2, AVX-512) and every run gives the same bits. One chain in
// index order with libm's exp per element was 8-9% of the flagship's CPU step.
inline constexpr std::size_t softmax_chunk = 16;

__attribute__((always_inline)) inline double lane_tree(const double* lane) {
  double l8[8];
  for (std::size_t k = 0; k < 8; ++k) l8[k] = lane[k] + lane[k + 8];
  return ((l8[0] + l8[4]) + (l8[2] + l8[6])) + ((l8[1] + l8[5]) + (l8[3] + l8[7]));
}

// row[0, n) = softmax(row[0, n)) and row[n, seq) = 0. The last, partial chunk runs through a
// local chunk padded with -inf, whose exp is 0 and adds nothing to its lane: the whole row is
// vectorised (a scalar tail was half of this function's time at seq = 128).
__attribute__((always_inline)) inline void softmax_row(float* row, std::size_t n, std::size_t seq) {
  constexpr std::size_t w = softmax_chunk;
  const std::size_t full = n / w * w, tail = n - full;
  float last[w];
  for (std::size_t k = 0; k < w; ++k) last[k] = k < tail ? row[full + k] : -INFINITY;
  float m[w];
  std::copy_n(last, w, m);
  for (std::size_t j = 0; j < full; j += w)
    for (std::size_t k = 0; k < w; ++k) m[k] = pick(row[j + k] > m[k], row[j + k], m[k]);
  float max = -INFINITY;  // the maximum of any order: the same bits whatever the lanes
  for (std::size_t k = 0; k < w; ++k) max = m[k] > max ? m[k] : max;
  double lane[w] = {};
  const auto exp_chunk = [&](float* x) __attribute__((always_inline)) {
    for (std::size_t k = 0; k < w; ++k) x[k] = exp_nonpositive(x[k] - max);
    for (std::size_t k = 0; k < w; ++k) lane[k] += static_cast<double>(x[k]);
  };
  for (std::size_t j = 0; j < full; j += w) exp_chunk(row + j);
  exp_chunk(last);
  const double inverse = 1.0 / lane_tree(lane);
  const auto scale_chunk = [&](float* x) __attribute__((always_inline)) {
    for (std::size_t k = 0; k < w; ++k) x[k] = static_cast<float>(static_cast<double>(x[k]) * inverse);
  };
  for (std::size_t j = 0; j < full; j += w) scale_chunk(row + j);
  scale_chunk(last);
  std::copy_n(last, tail, row + full);
  for (std::size_t j = n; j < seq; ++j) row[j] = 0.0f;
}

// dS = P * (dP - rowsum(P * dP)) * scale on row[0, n) (row holds dP), row[n, seq) = 0. Each
// chunk goes through local copies (p and row might alias for all GCC knows, locals do not); the
// partial one is padded with zeros, whose products add nothing.
__attribute__((always_inline)) inline void softmax_backward_row(const float* p, float* row, std::size_t n,
                                                                std::size_t seq, double scale) {
  constexpr std::size_t w = softmax_chunk;
  const std::size_t full = n / w * w, tail = n - full;
  float p_last[w], d_last[w];
  for (std::size_t k = 0; k < w; ++k) {
    p_last[k] = k < tail ? p[full + k] : 0.0f;
    d_last[k] = k < tail ? row[full + k] : 0.0f;
  }
  double lane[w] = {};
  const auto dot_chunk = [&](const float* pc, const float* dc) __attribute__((always_inline)) {
    for (std::size_t k = 0; k < w; ++k) lane[k] += static_cast<double>(pc[k]) * static_cast<double>(dc[k]);
  };
  for (std::size_t j = 0; j < full; j += w) {
    float pc[w], dc[w];
    std::copy_n(p + j, w, pc);
    std::copy_n(row + j, w, dc);
    dot_chunk(pc, dc);
  }
  dot_chunk(p_last, d_last);
  const double dot = lane_tree(lane);
  const auto ds_chunk = [&](const float* pc, float* dc) __attribute__((always_inline)) {
    for (std::size_t k = 0; k < w; ++k)
      dc[k] = static_cast<float>(static_cast<double>(pc[k]) * (static_cast<double>(dc[k]) - dot) * scale);
  };
  for (std::size_t j = 0; j < full; j += w) {
    float pc[w], dc[w];
    std::copy_n(p + j, w, pc);
    std::copy_n(row + j, w, dc);
    ds_chunk(pc, dc);
    std::copy_n(dc, w, row + j);
  }
  ds_chunk(p_last, d_last);
  std::copy_n(d_last, tail, row + full);
  for (std::size_t j = n; j < seq; ++j) row[j] = 0.0f;
}

// One (batch, head)'s [seq, seq] block, row i causal (columns 0..i): forward's softmax, or
// backward's dS from P and dP (in place of dP). Compiled for AVX2 and AVX-512F as well and
// chosen at run time, as nn/gemm.hpp's kernels are.
__attribute__((always_inline)) inline void softmax_rows_body(float* p, std::size_t seq) {
  for (std::size_t i = 0; i < seq; ++i) softmax_row(p + i * seq, i + 1, seq);
}
__attribute__((always_inline)) inline void softmax_backward_rows_body(const float* p, float* ds, std::size_t seq,
                                                                      double scale) {
  for (std::size_t i = 0; i < seq; ++i) softmax_backward_row(p + i * seq, ds + i * seq, i + 1, seq, scale);
}
#if defined(TRIDENT_DETAIL_HOST_SIMD)
__attribute__((target("avx2"))) inline void softmax_rows_avx2(float* p, std::size_t seq) { softmax_rows_body(p, seq); }
__attribute__((target("avx512f"))) inline void softmax_rows_avx512(float* p, std::size_t seq) {
  softmax_rows_body(p, seq);
}
__attribute__((target("avx2"))) inline void softmax_backward_rows_avx2(const float* p, float* ds, std::size_t seq,
                                                                       double scale) {
  softmax_backward_rows_body(p, ds, seq, scale);
}
__attribute__((target("avx512f"))) inline void softmax_backward_rows_avx512(const float* p, float* ds, std::size_t seq,
                                                                           double scale) {
  softmax_backward_rows_body(p, ds, seq, scale);
}
#endif

inline void softmax_rows(float* p, std::size_t seq) {
#if defined(TRIDENT_DETAIL_HOST_SIMD)
  switch (trident::optim::detail::active_host_isa()) {
    case trident::optim::detail::host_isa::avx512: return softmax_rows_avx512(p, seq);
    case trident::optim::detail::host_isa::avx2: return softmax_rows_avx2(p, seq);
    default: break;
  }
#endif
  softmax_rows_body(p, seq);
}
inline void softmax_backward_rows(const float* p, float* ds, std::size_t seq, double scale) {
#if defined(TRIDENT_DETAIL_HOST_SIMD)
  switch (trident::optim::detail::active_host_isa()) {
    case trident::optim::detail::host_isa::avx512: return softmax_backward_rows_avx512(p, ds, seq, scale);
    case trident::optim::detail::host_isa::avx2: return softmax_backward_rows_avx2(p, ds, seq, scale);
    default: break;
  }
#endif
  softmax_backward_rows_body(p, ds, seq, scale);
}

}  // namespace detail

//! Causal multi-head attention over `heads` heads of `head_dim`; see the header comment.
//!
//!   trident::nn::causal_attention attn{.seq = 1024, .batch = 8, .heads = 12, .head_dim = 64};
//!   attn.forward(qkv, out, probs);
//!   attn.backward(qkv, probs, dout, dqkv);
struct causal_attention {
  std::size_t seq = 0;
  std::size_t batch = 0;
  std::size_t heads = 0;
  std::size_t head_dim = 0;

  std::size_t qkv_size() const noexcept { return seq * batch * heads * 3 * head_dim; }
  std::size_t out_size() const noexcept { return seq * batch * heads * head_dim; }
  std::size_t probs_size() const noexcept { return batch * heads * seq * seq; }

  void forward(std::span<const float> qkv, std::span<float> out, std::span<float> probs) const {
    check("causal_attention::forward", qkv.size(), out.size(), probs.size());
    probabilities(qkv, probs);
    // out = P V, row block by row block: rows [r0, r1) of P are zero from column r1 on.
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t h = 0; h < heads; ++h) {
        const float* p = probs.data() + (b * heads + h) * seq * seq;
        for (std::size_t r0 = 0; r0 < seq; r0 += row_block) {
          const std::size_t r1 = std::min(seq, r0 + row_block);
          gemm(op::n, op::n, r1 - r0, head_dim, r1, 1.0f, p + r0 * seq, seq, qkv.data() + at(0, b, h, 2), qkv_stride(), 0.0f,
               out.data() + r0 * out_stride() + (b * heads + h) * head_dim, out_stride());
        }
      }
  }

  //! probs [batch, heads, seq, seq] from qkv: forward's softmax, bit for bit (forward calls it).
  void probabilities(std::span<const float> qkv, std::span<float> probs) const {
    check("causal_attention::probabilities", qkv.size(), out_size(), probs.size());
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t h = 0; h < heads; ++h) {
        float* p = probs.data() + (b * heads + h) * seq * seq;
        // Scores q k^T / sqrt(head_dim), only where the mask lets them through (up to column r1).
        for (std::size_t r0 = 0; r0 < seq; r0 += row_block) {
          const std::size_t r1 = std::min(seq, r0 + row_block);
          gemm(op::n, op::t, r1 - r0, r1, head_dim, scale, qkv.data() + at(r0, b, h, 0), qkv_stride(),
               qkv.data() + at(0, b, h, 1), qkv_stride(), 0.0f, p + r0 * seq, seq);
        }
        detail::softmax_rows(p, seq);
      }
  }

  //! dqkv (overwritten) from dout, given forward's qkv and probs.
  void backward(std::span<const float> qkv, std::span<const float> probs, std::span<const float> dout,
                std::span<float> dqkv) const {
    check("causal_attention::backward", qkv.size(), dout.size(), probs.size());
    TRIDENT_EXPECT(dqkv.size() == qkv.size(), "causal_attention::backward: dqkv has ", dqkv.size(), " elements, expected ",
                   qkv.size());
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    std::vector<float> ds(seq * seq);  // dP = dout v^T, then dS = P * (dP - rowsum(P * dP)) * scale
    const std::size_t lq = qkv_stride(), lo = out_stride();
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t h = 0; h < heads; ++h) {
        const float* p = probs.data() + (b * heads + h) * seq * seq;
        const float* g = dout.data() + (b * heads + h) * head_dim;  // row i at g + i * lo
        const float* q = qkv.data() + at(0, b, h, 0);
        const float* k = qkv.data() + at(0, b, h, 1);
        const float* v = qkv.data() + at(0, b, h, 2);
        float* dq = dqkv.data() + at(0, b, h, 0);
        float* dk = dqkv.data() + at(0, b, h, 1);
        float* dv = dqkv.data() + at(0, b, h, 2);
        for (std::size_t r0 = 0; r0 < seq; r0 += row_block) {
          const std::size_t r1 = std::min(seq, r0 + row_block);
          gemm(op::n, op::t, r1 - r0, r1, head_dim, 1.0f, g + r0 * lo, lo, v, lq, 0.0f, ds.data() + r0 * seq, seq);
        }
        detail::softmax_backward_rows(p, ds.data(), seq, scale);
        // dq = dS k (rows [r0, r1) of dS end at column r1); dk = dS^T q and dv = P^T dout
        // (rows [c0, c1) of those take rows c0.. of dS and P: the rest are zero).
        for (std::size_t r0 = 0; r0 < seq; r0 += row_block) {
          const std::size_t r1 = std::min(seq, r0 + row_block);
          gemm(op::n, op::n, r1 - r0, head_dim, r1, 1.0f, ds.data() + r0 * seq, seq, k, lq, 0.0f, dq + r0 * lq, lq);
          gemm(op::t, op::n, r1 - r0, head_dim, seq - r0, 1.0f, ds.data() + r0 * seq + r0, seq, q + r0 * lq, lq, 0.0f,
               dk + r0 * lq, lq);
          gemm(op::t, op::n, r1 - r0, head_dim, seq - r0, 1.0f, p + r0 * seq + r0, seq, g + r0 * lo, lo, 0.0f, dv + r0 * lq,
               lq);
        }
      }
  }

  //! Throws usage_error, naming `who` and the expected shapes, unless the sizes are this
  //! attention's (nn::cuda::causal_attention checks with it too).
  void check(const char* who, std::size_t qkv, std::size_t out, std::size_t probs) const {
    TRIDENT_EXPECT(seq > 0 && batch > 0 && heads > 0 && head_dim > 0, who, ": expected non-zero seq, batch, heads and "
                   "head_dim, got ", seq, ", ", batch, ", ", heads, ", ", head_dim);
    TRIDENT_EXPECT(qkv == qkv_size(), who, ": qkv has ", qkv, " elements, expected [seq=", seq, ", batch=", batch,
                   ", heads=", heads, ", 3, head_dim=", head_dim, "] = ", qkv_size());
    TRIDENT_EXPECT(out == out_size(), who, ": out has ", out, " elements, expected [seq=", seq, ", batch=", batch,
                   ", heads=", heads, ", head_dim=", head_dim, "] = ", out_size());
    TRIDENT_EXPECT(probs == probs_size(), who, ": probs have ", probs, " elements, expected [batch=", batch,
                   ", heads=", heads, ", seq=", seq, ", seq] = ", probs_size());
  }

 private:
  // Rows of a GEMM at a time: a block's rows see columns up to its end, so the products skip
  // what the causal mask removes (about half) and each element's sum depends on its block alone.
  static constexpr std::size_t row_block = 64;
  std::size_t qkv_stride() const noexcept { return batch * heads * 3 * head_dim; }  // between positions
  std::size_t out_stride() const noexcept { return batch * heads * head_dim; }
  // The offset of position i, batch b, head h's query (0), key (1) or value (2).
  std::size_t at(std::size_t i, std::size_t b, std::size_t h, std::size_t which) const noexcept {
    return (((i * batch + b) * heads + h) * 3 + which) * head_dim;
  }
};

}  // namespace trident::nn

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC pop_options
#elif defined(__clang__) && !defined(__CUDACC__)
#pragma float_control(pop)
#endif
