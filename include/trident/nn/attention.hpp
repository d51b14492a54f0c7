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
// is_causal=True) without dropout. Sums in double in index order: deterministic. dqkv is
// overwritten.
//
// Checked against torch's own output, tests/fixtures/torch_layers.txt (tests/nn/
// test_nn_reference.cpp; q, k and v sliced from this qkv layout): out and dqkv within 1.1e-6 of
// torch's float32 results (normwise; the worst is a peaked softmax), which is torch's own float32
// rounding: it is as far from torch's float64 results, and we are within 2.5e-7 of those.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "trident/core/error.hpp"

namespace trident::nn {

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
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t h = 0; h < heads; ++h) {
        const float* p = probs.data() + (b * heads + h) * seq * seq;
        for (std::size_t i = 0; i < seq; ++i) {
          float* o = out.data() + ((i * batch + b) * heads + h) * head_dim;
          for (std::size_t d = 0; d < head_dim; ++d) {
            double acc = 0;
            for (std::size_t j = 0; j <= i; ++j) acc += static_cast<double>(p[i * seq + j]) * qkv[at(j, b, h, 2) + d];
            o[d] = static_cast<float>(acc);
          }
        }
      }
  }

  //! probs [batch, heads, seq, seq] from qkv: forward's softmax, bit for bit (forward calls it).
  void probabilities(std::span<const float> qkv, std::span<float> probs) const {
    check("causal_attention::probabilities", qkv.size(), out_size(), probs.size());
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    std::vector<double> score(seq);
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t h = 0; h < heads; ++h) {
        float* p = probs.data() + (b * heads + h) * seq * seq;
        for (std::size_t i = 0; i < seq; ++i) {
          const float* q = qkv.data() + at(i, b, h, 0);
          double max = -INFINITY;
          for (std::size_t j = 0; j <= i; ++j) {
            const float* k = qkv.data() + at(j, b, h, 1);
            double s = 0;
            for (std::size_t d = 0; d < head_dim; ++d) s += static_cast<double>(q[d]) * k[d];
            score[j] = s * scale;
            max = score[j] > max ? score[j] : max;
          }
          double sum = 0;
          for (std::size_t j = 0; j <= i; ++j) sum += std::exp(score[j] - max);
          for (std::size_t j = 0; j < seq; ++j) p[i * seq + j] = j <= i ? static_cast<float>(std::exp(score[j] - max) / sum) : 0.0f;
        }
      }
  }

  //! dqkv (overwritten) from dout, given forward's qkv and probs.
  void backward(std::span<const float> qkv, std::span<const float> probs, std::span<const float> dout,
                std::span<float> dqkv) const {
    check("causal_attention::backward", qkv.size(), dout.size(), probs.size());
    TRIDENT_EXPECT(dqkv.size() == qkv.size(), "causal_attention::backward: dqkv has ", dqkv.size(), " elements, expected ",
                   qkv.size());
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    for (float& g : dqkv) g = 0.0f;
    std::vector<double> dp(seq), ds(seq);
    std::vector<double> dk(seq * head_dim), dv(seq * head_dim);
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t h = 0; h < heads; ++h) {
        const float* p = probs.data() + (b * heads + h) * seq * seq;
        std::fill(dk.begin(), dk.end(), 0.0);
        std::fill(dv.begin(), dv.end(), 0.0);
        for (std::size_t i = 0; i < seq; ++i) {
          const float* g = dout.data() + ((i * batch + b) * heads + h) * head_dim;
          const float* q = qkv.data() + at(i, b, h, 0);
          double dot = 0;  // sum_j p_ij dp_ij
          for (std::size_t j = 0; j <= i; ++j) {
            const float* v = qkv.data() + at(j, b, h, 2);
            double s = 0;
            for (std::size_t d = 0; d < head_dim; ++d) s += static_cast<double>(g[d]) * v[d];
            dp[j] = s;
            dot += static_cast<double>(p[i * seq + j]) * s;
            for (std::size_t d = 0; d < head_dim; ++d) dv[j * head_dim + d] += static_cast<double>(p[i * seq + j]) * g[d];
          }
          float* dq = dqkv.data() + at(i, b, h, 0);
          for (std::size_t j = 0; j <= i; ++j) ds[j] = static_cast<double>(p[i * seq + j]) * (dp[j] - dot) * scale;
          for (std::size_t d = 0; d < head_dim; ++d) {
            double acc = 0;
            for (std::size_t j = 0; j <= i; ++j) acc += ds[j] * qkv[at(j, b, h, 1) + d];
            dq[d] = static_cast<float>(acc);
          }
          for (std::size_t j = 0; j <= i; ++j)
            for (std::size_t d = 0; d < head_dim; ++d) dk[j * head_dim + d] += ds[j] * q[d];
        }
        for (std::size_t j = 0; j < seq; ++j)
          for (std::size_t d = 0; d < head_dim; ++d) {
            dqkv[at(j, b, h, 1) + d] = static_cast<float>(dk[j * head_dim + d]);
            dqkv[at(j, b, h, 2) + d] = static_cast<float>(dv[j * head_dim + d]);
          }
      }
  }

 private:
  // The offset of position i, batch b, head h's query (0), key (1) or value (2).
  std::size_t at(std::size_t i, std::size_t b, std::size_t h, std::size_t which) const noexcept {
    return (((i * batch + b) * heads + h) * 3 + which) * head_dim;
  }
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
};

}  // namespace trident::nn
