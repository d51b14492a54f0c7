// trident/nn/linear.hpp — the fully connected layer on the host, PyTorch's nn.Linear.
//
// Synopsis
//   struct linear { std::size_t in_features, out_features;
//     void forward(std::size_t batch, x, W, b, y) const          y[batch, out] = x W^T + b
//     void backward(std::size_t batch, x, W, dy, dx, dW, db) const
//                                                               dx = dy W          (overwritten; empty: skipped,
//                                                                                   and W may then be empty too)
//                                                               dW += dy^T x       (accumulated)
//                                                               db += sum_rows dy  (accumulated; empty: no bias)
//     std::size_t weight_size() const, bias_size() const }
//
// Layouts are PyTorch's, row-major: x [batch, in], W [out, in], b [out], y [batch, out]. Memory
// is passed as spans (the layer owns no parameters: a ZeRO optimizer or a test owns them), and
// every size is checked against the shape (usage_error naming the expected shape).
//
// Gradient accumulation: dW and db are ADDED to, like autograd's `.grad` across the backward
// passes of several micro-batches — zero them once per optimizer step, not per micro-batch. dx
// is overwritten, as it is a fresh activation gradient.
//
// A layer without bias: pass an empty b to forward and an empty db to backward.
// Deterministic: single-threaded, fixed summation orders (see gemm.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <span>

#include "trident/core/error.hpp"
#include "trident/core/memory_space.hpp"
#include "trident/nn/gemm.hpp"

namespace trident::nn {

namespace detail {

// The bias loops in chunks of 16 through local arrays: with y and b (or db and dy) possibly
// aliasing, GCC's -O2 left them scalar, and they were 4% of the flagship's CPU step. Element by
// element the same additions in the same order, so the same bits as the plain loops.
inline constexpr std::size_t bias_chunk = 16;

//! y[r, o] += b[o] for r < rows, o < out.
inline void add_bias_rows(float* y, const float* b, std::size_t rows, std::size_t out) {
  constexpr std::size_t w = bias_chunk;
  const std::size_t full = out / w * w;
  for (std::size_t r = 0; r < rows; ++r) {
    float* row = y + r * out;
    for (std::size_t o = 0; o < full; o += w) {
      float yc[w], bc[w];
      std::copy_n(row + o, w, yc);
      std::copy_n(b + o, w, bc);
      for (std::size_t k = 0; k < w; ++k) yc[k] += bc[k];
      std::copy_n(yc, w, row + o);
    }
    for (std::size_t o = full; o < out; ++o) row[o] += b[o];
  }
}

//! db[o] += dy[r, o] for r = 0, 1, ..., rows - 1 in that order (a fixed sum per column); rows
//! outer, so that dy streams in order.
inline void add_column_sums(float* db, const float* dy, std::size_t rows, std::size_t out) {
  constexpr std::size_t w = bias_chunk;
  const std::size_t full = out / w * w;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = dy + r * out;
    for (std::size_t o = 0; o < full; o += w) {
      float acc[w], dc[w];
      std::copy_n(db + o, w, acc);
      std::copy_n(row + o, w, dc);
      for (std::size_t k = 0; k < w; ++k) acc[k] += dc[k];
      std::copy_n(acc, w, db + o);
    }
    for (std::size_t o = full; o < out; ++o) db[o] += row[o];
  }
}

// Whether two arrays share memory: a layer's output over one of its inputs is overwritten
// while the GEMM still reads it (wrong results, no error).
template <class A, class B>
bool share_memory(std::span<A> a, std::span<B> b) noexcept {
  return trident::detail::overlaps(a.data(), a.size_bytes(), b.data(), b.size_bytes());
}

// Size checks shared by the host layer and the CUDA one (nn/cuda/layers.cuh). The products
// first: a batch of 2^63 made batch x in wrap to 0 and empty arrays pass.
inline void check_linear_extents(const char* who, std::size_t batch, std::size_t in, std::size_t out) {
  std::size_t n = 0;
  const bool fits = !__builtin_mul_overflow(batch, in, &n) && !__builtin_mul_overflow(batch, out, &n) &&
                    !__builtin_mul_overflow(out, in, &n);
  TRIDENT_EXPECT(fits, who, ": [batch=", batch, ", in=", in, ", out=", out, "] has more elements than std::size_t counts");
}

inline void check_linear_forward(const char* who, std::size_t batch, std::size_t in, std::size_t out,
                                 std::size_t x, std::size_t w, std::size_t b, std::size_t y) {
  check_linear_extents(who, batch, in, out);
  TRIDENT_EXPECT(x == batch * in, who, ": x has ", x, " elements, expected [batch=", batch, ", in=", in, "] = ",
                 batch * in);
  TRIDENT_EXPECT(w == out * in, who, ": W has ", w, " elements, expected [out=", out, ", in=", in, "] = ", out * in);
  TRIDENT_EXPECT(b == out || b == 0, who, ": b has ", b, " elements, expected [out=", out, "] (or none: no bias)");
  TRIDENT_EXPECT(y == batch * out, who, ": y has ", y, " elements, expected [batch=", batch, ", out=", out, "] = ",
                 batch * out);
}

inline void check_linear_backward(const char* who, std::size_t batch, std::size_t in, std::size_t out,
                                  std::size_t x, std::size_t w, std::size_t dy, std::size_t dx, std::size_t dw,
                                  std::size_t db) {
  check_linear_extents(who, batch, in, out);
  TRIDENT_EXPECT(x == batch * in, who, ": x has ", x, " elements, expected [batch=", batch, ", in=", in, "] = ",
                 batch * in);
  // W only serves dx: the first layer of a network (dx not wanted) need not pass its weights.
  TRIDENT_EXPECT(w == out * in || (w == 0 && dx == 0), who, ": W has ", w, " elements, expected [out=", out, ", in=", in,
                 "] = ", out * in, dx == 0 ? " (or none, since dx is not wanted)" : "");
  TRIDENT_EXPECT(dy == batch * out, who, ": dy has ", dy, " elements, expected [batch=", batch, ", out=", out,
                 "] = ", batch * out);
  TRIDENT_EXPECT(dx == batch * in || dx == 0, who, ": dx has ", dx, " elements, expected [batch=", batch,
                 ", in=", in, "] = ", batch * in, " (or none: not needed)");
  TRIDENT_EXPECT(dw == out * in, who, ": dW has ", dw, " elements, expected [out=", out, ", in=", in, "] = ",
                 out * in);
  TRIDENT_EXPECT(db == out || db == 0, who, ": db has ", db, " elements, expected [out=", out,
                 "] (or none: no bias)");
}

}  // namespace detail

//! y = x W^T + b over a batch, with PyTorch's layouts; the layer is only its shape.
//!
//!   trident::nn::linear fc{.in_features = 784, .out_features = 128};
//!   fc.forward(batch, x, w, b, y);                       // y: batch x 128
//!   fc.backward(batch, x, w, dy, dx, dw, db);            // dw, db accumulate (+=); dx overwritten
struct linear {
  std::size_t in_features = 0;
  std::size_t out_features = 0;

  std::size_t weight_size() const noexcept { return in_features * out_features; }
  std::size_t bias_size() const noexcept { return out_features; }

  //! y[batch, out] = x[batch, in] W[out, in]^T + b[out]; an empty b means no bias.
  void forward(std::size_t batch, std::span<const float> x, std::span<const float> w, std::span<const float> b,
               std::span<float> y) const {
    const std::size_t in = in_features, out = out_features;
    detail::check_linear_forward("linear::forward", batch, in, out, x.size(), w.size(), b.size(), y.size());
    TRIDENT_EXPECT(!detail::share_memory(y, x) && !detail::share_memory(y, w) && !detail::share_memory(y, b),
                   "linear::forward: y shares memory with x, W or b, which the product still reads; give y its own");
    if (b.empty()) {
      gemm(op::n, op::t, batch, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f, y.data(), out);
      return;
    }
    // y starts as the bias rows and the GEMM adds x W^T to it (beta = 1), as torch's addmm: one
    // pass over y fewer than adding b after the product (a BLAS clears C for beta = 0 anyway).
    for (std::size_t r = 0; r < batch; ++r) std::copy_n(b.data(), out, y.data() + r * out);
    gemm(op::n, op::t, batch, out, in, 1.0f, x.data(), in, w.data(), in, 1.0f, y.data(), out);
  }

  //! Given dy = dL/dy: dx = dy W (overwritten; skipped when dx is empty, and then W may be
  //! empty), dW += dy^T x and db += the column sums of dy (accumulated; db empty: no bias). x
  //! and W are forward's inputs.
  void backward(std::size_t batch, std::span<const float> x, std::span<const float> w, std::span<const float> dy,
                std::span<float> dx, std::span<float> dw, std::span<float> db) const {
    const std::size_t in = in_features, out = out_features;
    detail::check_linear_backward("linear::backward", batch, in, out, x.size(), w.size(), dy.size(), dx.size(),
                                  dw.size(), db.size());
    for (const auto out_span : {dx, dw, db})
      TRIDENT_EXPECT(!detail::share_memory(out_span, x) && !detail::share_memory(out_span, w) && !detail::share_memory(out_span, dy),
                     "linear::backward: dx, dW or db shares memory with x, W or dy, which the products still read");
    TRIDENT_EXPECT(!detail::share_memory(dx, dw) && !detail::share_memory(dx, db) && !detail::share_memory(dw, db),
                   "linear::backward: dx, dW and db share memory");
    if (!dx.empty()) gemm(op::n, op::n, batch, in, out, 1.0f, dy.data(), out, w.data(), in, 0.0f, dx.data(), in);
    gemm(op::t, op::n, out, in, batch, 1.0f, dy.data(), out, x.data(), in, 1.0f, dw.data(), in);
    if (!db.empty()) detail::add_column_sums(db.data(), dy.data(), batch, out);  // rows in order: a fixed sum
  }
};

}  // namespace trident::nn
