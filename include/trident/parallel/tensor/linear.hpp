#pragma once
// Tensor-parallel linear layers (Megatron-LM, Shoeybi et al. 2019) on the host, over any
// host-space communicator (thread ranks, MPI): the weight of nn::linear split over the tensor
// group, with the conjugate operators of regions.hpp at their ends.
//
//   column_parallel_linear   W [out, in] split by rows (output features): each rank computes
//                            its out/t outputs from the whole input; backward all-reduces the
//                            input gradient (f), overlapped with the weight-gradient GEMM
//   row_parallel_linear      W [out, in] split by columns (input features): each rank takes its
//                            in/t inputs (a column-parallel layer's outputs) and the partial
//                            products are all-reduced (g); the bias, replicated, is added once
//
// An MLP is column_parallel_linear -> activation (on the local shard, no communication) ->
// row_parallel_linear: two GEMMs per rank, one all-reduce forward and one backward. The
// result equals the unsharded layers up to the order of the sums (tests/tensor: 1e-5).
//
// Like nn::linear, a layer is only its shape: weights, activations and gradients are spans the
// caller owns (a zero_optimizer over the data axis, a test). Which part of the full weight a
// rank holds is weight_sharding() (model/sharding.hpp): take_part(sharding, rank, full, local)
// cuts it out of weights initialised whole, so the same seed gives the same model whatever t is.
// dW and db accumulate (+=), dx is overwritten, as in nn::linear.
//
//   trident::tensor::column_parallel_linear fc1(tp, hidden, 4 * hidden, "fc1");
//   trident::tensor::row_parallel_linear    fc2(tp, 4 * hidden, hidden, "fc2");
//   fc1.forward(tp, batch, x, w1, b1, h);        // h: [batch, 4 * hidden / t]
//   gelu::forward(h, a);
//   fc2.forward(tp, batch, a, w2, b2, y);        // y: [batch, hidden], summed over the group
//   fc2.backward(tp, batch, a, w2, dy, da, dw2, db2);
//   gelu::backward(h, da, dh);
//   fc1.backward(tp, batch, x, w1, dh, dx, dw1, db1);   // dx summed over the group
//
// bf16_operands (off by default) emulates the GPU's gemm_math::bf16 (nn/cuda/cublas.hpp): each
// GEMM multiplies copies of its operands rounded to bf16 (core/half.hpp's rounding) and sums in
// float, the bias and its gradient stay float. It is the serial reference for a GPU run with bf16
// GEMMs, not a speed-up: the copies cost time and memory on the host.
//
// Bad shapes are usage_errors naming the layer and the sizes: features that t does not divide
// (at construction), a communicator of another size than the layer was built for, spans of the
// wrong size. The shapes and shardings serve any communicator (parallel/tensor/cuda/linear.cuh
// runs the same layers on the GPU); forward and backward here are for host ones.
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/core/error.hpp"
#include "trident/core/half.hpp"
#include "trident/model/sharding.hpp"
#include "trident/nn/gemm.hpp"
#include "trident/nn/linear.hpp"
#include "trident/parallel/tensor/regions.hpp"

namespace trident::tensor {

namespace detail {

template <class Comm>
constexpr void require_host_comm() {
  static_assert(Comm::space::host_accessible,
                "trident::tensor: these layers run on the host; over a device communicator (nccl_comm) use the CUDA "
                "layers");
}

// The layer was built for a tensor group of `parts` ranks: the communicator must be one.
template <class Comm>
void check_group(const std::string& name, const char* call, const Comm& tp, int parts) {
  TRIDENT_EXPECT(tp.size() == parts, name, ".", call, ": the tensor-parallel communicator has ", tp.size(),
                 " ranks, but the layer was built for ", parts, "; expected the tensor group of the same process_grid");
}

// A GEMM operand as bf16_operands multiplies it: `v` itself, or a copy rounded to bf16 in `copy`.
inline std::span<const float> operand(std::span<const float> v, bool bf16, std::vector<float>& copy) {
  if (!bf16) return v;
  copy.resize(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) copy[i] = static_cast<float>(trident::bf16(v[i]));
  return copy;
}

// dW += dy^T x and db += the column sums of dy (nn::linear's weight gradients), the GEMM on
// bf16-rounded copies of dy and x under bf16 operands, db from dy as it is (the GPU's bias
// gradient sums the float dy).
inline void weight_gradients(const nn::linear& layer, bool bf16, std::size_t batch, std::span<const float> x,
                             std::span<const float> dy, std::span<float> dw, std::span<float> db) {
  if (!bf16) {
    layer.backward(batch, x, {}, dy, {}, dw, db);
    return;
  }
  std::vector<float> x16, dy16;
  layer.backward(batch, operand(x, true, x16), {}, operand(dy, true, dy16), {}, dw, {});
  if (!db.empty()) nn::detail::add_column_sums(db.data(), dy.data(), batch, layer.out_features);
}

}  // namespace detail

//! y[batch, out/t] = x[batch, in] W_r[out/t, in]^T + b_r, W_r the rank's rows of W.
//!
//!   trident::tensor::column_parallel_linear fc1(grid.tensor(), 512, 2048, "fc1");
//!   std::vector<float> w(fc1.weight_sharding().local_numel());
//!   trident::take_part<float>(fc1.weight_sharding(), grid.tensor().rank(), full_w, w);
class column_parallel_linear {
 public:
  template <communicator Comm>
  column_parallel_linear(const Comm& tp, std::size_t in_features, std::size_t out_features,
                         std::string name = "column_parallel_linear")
      : name_(std::move(name)), parts_(tp.size()),
        weight_(sharding::split_exact({out_features, in_features}, 0, tp.size(), name_ + ".weight (output features)")),
        bias_(sharding::split_exact({out_features}, 0, tp.size(), name_ + ".bias")),
        local_{in_features, out_features / static_cast<std::size_t>(tp.size())} {}

  const std::string& name() const noexcept { return name_; }
  //! The size of the tensor-parallel group the layer was built for.
  int parts() const noexcept { return parts_; }
  std::size_t in_features() const noexcept { return local_.in_features; }
  std::size_t out_features() const noexcept { return local_.out_features * static_cast<std::size_t>(parts_); }
  //! This rank's output features: out_features() / t.
  std::size_t local_out_features() const noexcept { return local_.out_features; }
  //! W [out, in] split along axis 0 into t parts; the bias [out] likewise.
  const sharding& weight_sharding() const noexcept { return weight_; }
  const sharding& bias_sharding() const noexcept { return bias_; }
  //! The rank's part as an unsharded layer ([in] -> [out/t]).
  const nn::linear& local() const noexcept { return local_; }
  //! Whether backward overlaps the input gradient's all-reduce with the weight-gradient GEMM
  //! (Megatron's asynchronous tensor-parallel communication); the results are the same.
  bool overlap = true;
  //! Whether the GEMMs multiply bf16-rounded copies of their operands: the GPU's
  //! gemm_math::bf16, emulated (see the header comment).
  bool bf16_operands = false;

  //! y [batch, out/t] = x [batch, in] W_r^T + b_r; x is the same on every rank of the group (f).
  template <communicator Comm>
  void forward(Comm& tp, std::size_t batch, std::span<const float> x, std::span<const float> w,
               std::span<const float> b, std::span<float> y) const {
    detail::require_host_comm<Comm>();
    detail::check_group(name_, "forward", tp, parts_);
    trident::nn::detail::check_linear_forward((name_ + ".forward").c_str(), batch, local_.in_features, local_.out_features,
                                              x.size(), w.size(), b.size(), y.size());
    copy_to_region::forward(tp, x, x);  // f: nothing moves
    std::vector<float> x16, w16;
    local_.forward(batch, detail::operand(x, bf16_operands, x16), detail::operand(w, bf16_operands, w16), b, y);
  }

  //! dx [batch, in] = sum over the group of dy_r W_r (overwritten; empty: not wanted, and then
  //! nothing is communicated), dW_r += dy_r^T x, db_r += column sums of dy_r.
  template <communicator Comm>
  void backward(Comm& tp, std::size_t batch, std::span<const float> x, std::span<const float> w,
                std::span<const float> dy, std::span<float> dx, std::span<float> dw, std::span<float> db) const {
    detail::require_host_comm<Comm>();
    detail::check_group(name_, "backward", tp, parts_);
    const std::size_t in = local_.in_features, out = local_.out_features;
    trident::nn::detail::check_linear_backward((name_ + ".backward").c_str(), batch, in, out, x.size(), w.size(),
                                               dy.size(), dx.size(), dw.size(), db.size());
    if (dx.empty()) {
      detail::weight_gradients(local_, bf16_operands, batch, x, dy, dw, db);
      return;
    }
    // This rank's share of dx first, then its sum over the group (f's backward) runs while the
    // weight gradients are computed.
    input_then_weights(batch, x, w, dy, dx, dw, db, [&] { copy_to_region::backward(tp, dx, dx); },
                       [&] { return copy_to_region::backward_async(tp, dx, dx); });
  }

  //! Sequence parallelism: x [batch, in] is the all-gathered input (gather_from_sequence), so the
  //! input gradient goes back to sequence shards: `partial` [batch, in] (scratch) = dy_r W_r,
  //! reduce-scattered into dx [batch / t, in] (overwritten) while the weight gradients are
  //! computed (or after them, without overlap).
  template <communicator Comm>
  void backward_to_sequence(Comm& tp, std::size_t batch, std::span<const float> x, std::span<const float> w,
                            std::span<const float> dy, std::span<float> partial, std::span<float> dx, std::span<float> dw,
                            std::span<float> db) const {
    detail::require_host_comm<Comm>();
    detail::check_group(name_, "backward_to_sequence", tp, parts_);
    const std::size_t in = local_.in_features, out = local_.out_features;
    trident::nn::detail::check_linear_backward((name_ + ".backward_to_sequence").c_str(), batch, in, out, x.size(), w.size(),
                                               dy.size(), partial.size(), dw.size(), db.size());
    TRIDENT_EXPECT(batch % static_cast<std::size_t>(parts_) == 0 && dx.size() * static_cast<std::size_t>(parts_) == partial.size(),
                   name_, ".backward_to_sequence: dx has ", dx.size(), " elements, expected [", batch, " / ", parts_, ", ", in,
                   "] (this rank's rows)");
    input_then_weights(batch, x, w, dy, partial, dw, db, [&] { gather_from_sequence::backward(tp, partial, dx); },
                       [&] { return gather_from_sequence::backward_async(tp, partial, dx); });
  }

 private:
  // partial = dy W_r, then its reduction over the group (`reduce`, or `start` and a wait) beside
  // the weight-gradient GEMM, or before it without overlap.
  template <class Reduce, class Start>
  void input_then_weights(std::size_t batch, std::span<const float> x, std::span<const float> w, std::span<const float> dy,
                          std::span<float> partial, std::span<float> dw, std::span<float> db, Reduce&& reduce,
                          Start&& start) const {
    const std::size_t in = local_.in_features, out = local_.out_features;
    std::vector<float> dy16, w16;
    const auto dy_in = detail::operand(dy, bf16_operands, dy16), w_in = detail::operand(w, bf16_operands, w16);
    nn::gemm(nn::op::n, nn::op::n, batch, in, out, 1.0f, dy_in.data(), out, w_in.data(), in, 0.0f, partial.data(), in);
    if (!overlap) {
      reduce();
      detail::weight_gradients(local_, bf16_operands, batch, x, dy, dw, db);
      return;
    }
    auto pending = start();
    detail::weight_gradients(local_, bf16_operands, batch, x, dy, dw, db);
    pending.wait();
  }

  std::string name_;
  int parts_;
  sharding weight_, bias_;
  nn::linear local_;
};

//! y[batch, out] = sum over the group of x_r[batch, in/t] W_r[out, in/t]^T, + b (replicated,
//! added once after the sum), W_r the rank's columns of W.
//!
//!   trident::tensor::row_parallel_linear fc2(grid.tensor(), 2048, 512, "fc2");
//!   fc2.weight_sharding().local_shape();   // {512, 2048 / t}
class row_parallel_linear {
 public:
  template <communicator Comm>
  row_parallel_linear(const Comm& tp, std::size_t in_features, std::size_t out_features, std::string name = "row_parallel_linear")
      : name_(std::move(name)), parts_(tp.size()),
        weight_(sharding::split_exact({out_features, in_features}, 1, tp.size(), name_ + ".weight (input features)")),
        bias_(sharding::replicated({out_features})),
        local_{in_features / static_cast<std::size_t>(tp.size()), out_features} {}

  const std::string& name() const noexcept { return name_; }
  //! The size of the tensor-parallel group the layer was built for.
  int parts() const noexcept { return parts_; }
  std::size_t in_features() const noexcept { return local_.in_features * static_cast<std::size_t>(parts_); }
  std::size_t out_features() const noexcept { return local_.out_features; }
  //! This rank's input features: in_features() / t.
  std::size_t local_in_features() const noexcept { return local_.in_features; }
  //! W [out, in] split along axis 1 into t parts (a strided block per rank); the bias whole.
  const sharding& weight_sharding() const noexcept { return weight_; }
  const sharding& bias_sharding() const noexcept { return bias_; }
  const nn::linear& local() const noexcept { return local_; }
  //! Whether the GEMMs multiply bf16-rounded copies of their operands: the GPU's
  //! gemm_math::bf16, emulated (see the header comment).
  bool bf16_operands = false;

  //! y [batch, out] = sum over the group of x_r W_r^T (g), then + b; the same on every rank.
  template <communicator Comm>
  void forward(Comm& tp, std::size_t batch, std::span<const float> x, std::span<const float> w,
               std::span<const float> b, std::span<float> y) const {
    detail::require_host_comm<Comm>();
    detail::check_group(name_, "forward", tp, parts_);
    trident::nn::detail::check_linear_forward((name_ + ".forward").c_str(), batch, local_.in_features, local_.out_features,
                                              x.size(), w.size(), b.size(), y.size());
    std::vector<float> x16, w16;
    local_.forward(batch, detail::operand(x, bf16_operands, x16), detail::operand(w, bf16_operands, w16), {}, y);  // the bias
    reduce_from_region::forward(tp, y, y);                                                                       // after the sum
    const std::size_t out = local_.out_features;
    if (!b.empty()) trident::nn::detail::add_bias_rows(y.data(), b.data(), batch, out);
  }

  //! Sequence parallelism: the partial products [batch, out] (`partial`, scratch) are
  //! reduce-scattered to this rank's rows (reduce_scatter_to_sequence), y [batch / t, out], and
  //! the bias is added there. Backward is backward() with the all-gathered output gradient.
  template <communicator Comm>
  void forward_to_sequence(Comm& tp, std::size_t batch, std::span<const float> x, std::span<const float> w,
                           std::span<const float> b, std::span<float> partial, std::span<float> y) const {
    detail::require_host_comm<Comm>();
    detail::check_group(name_, "forward_to_sequence", tp, parts_);
    trident::nn::detail::check_linear_forward((name_ + ".forward_to_sequence").c_str(), batch, local_.in_features,
                                              local_.out_features, x.size(), w.size(), b.size(), partial.size());
    TRIDENT_EXPECT(batch % static_cast<std::size_t>(parts_) == 0 && y.size() * static_cast<std::size_t>(parts_) == partial.size(),
                   name_, ".forward_to_sequence: y has ", y.size(), " elements, expected [", batch, " / ", parts_, ", ",
                   local_.out_features, "] (this rank's rows)");
    std::vector<float> x16, w16;
    local_.forward(batch, detail::operand(x, bf16_operands, x16), detail::operand(w, bf16_operands, w16), {}, partial);
    reduce_scatter_to_sequence::forward(tp, partial, y);
    const std::size_t out = local_.out_features, rows = batch / static_cast<std::size_t>(parts_);
    if (!b.empty()) trident::nn::detail::add_bias_rows(y.data(), b.data(), rows, out);
  }

  //! dx_r [batch, in/t] = dy W_r (overwritten; empty: not wanted), dW_r += dy^T x_r, db += column
  //! sums of dy (the whole bias gradient, the same on every rank). No communication: dy is the
  //! same on every rank (g's backward is the identity).
  template <communicator Comm>
  void backward(Comm& tp, std::size_t batch, std::span<const float> x, std::span<const float> w,
                std::span<const float> dy, std::span<float> dx, std::span<float> dw, std::span<float> db) const {
    detail::require_host_comm<Comm>();
    detail::check_group(name_, "backward", tp, parts_);
    reduce_from_region::backward(tp, dy, dy);  // g: nothing moves
    trident::nn::detail::check_linear_backward((name_ + ".backward").c_str(), batch, local_.in_features,
                                               local_.out_features, x.size(), w.size(), dy.size(), dx.size(), dw.size(),
                                               db.size());
    if (!bf16_operands) {
      local_.backward(batch, x, w, dy, dx, dw, db);
      return;
    }
    std::vector<float> x16, w16, dy16;
    local_.backward(batch, detail::operand(x, true, x16), detail::operand(w, true, w16), detail::operand(dy, true, dy16), dx, dw, {});
    if (!db.empty()) nn::detail::add_column_sums(db.data(), dy.data(), batch, local_.out_features);
  }

 private:
  std::string name_;
  int parts_;
  sharding weight_, bias_;
  nn::linear local_;
};

}  // namespace trident::tensor
