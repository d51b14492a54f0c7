// trident-requires: nvcc
#pragma once
// The tensor-parallel linear layers of parallel/tensor/linear.hpp on the GPU, over a device
// communicator (nccl_comm): the same shapes, shardings and checks (the host classes describe
// them), the GEMMs with cuBLAS in the blas_ref's math (FP32 unless asked; under bf16 each
// backward rounds dy once for both its GEMMs) on a cuda_context's compute stream, the
// collectives on the communicator's stream, the two ordered by events both ways, as llm.c
// hands its compute stream to NCCL's. Nothing here waits on the host or allocates.
//
//   trident::cuda_context ctx;                    // compute stream
//   trident::nn::cublas_handle blas;
//   trident::tensor::cuda::column_parallel_linear fc1(tp, hidden, 4 * hidden, "fc1");
//   trident::tensor::cuda::row_parallel_linear fc2(tp, 4 * hidden, hidden, "fc2");
//   fc1.forward(ctx, blas, tp, batch, x, w1, b1, h);            // h: [batch, 4 hidden / t]
//   ... activation on ctx.stream() ...
//   fc2.forward(ctx, blas, tp, batch, a, w2, b2, y);            // summed over the group (g)
//   fc2.backward(ctx, blas, tp, batch, a, w2, dy, da, dw2, db2);
//   fc1.backward(ctx, blas, tp, batch, x, w1, dh, dx, dw1, db1); // dx summed (f), overlapped
//
// Sequence parallelism (Korthikanti et al.): fc2.forward_to_sequence reduce-scatters the partial
// products to this rank's rows, fc1.backward_to_sequence reduce-scatters the input gradient.
//
// Backward of the column-parallel layer: dx = dy W_r on the compute stream, handed to the
// communicator's stream for its all-reduce, while the weight-gradient GEMM runs on the compute
// stream; the compute stream then waits for the all-reduce, so whatever comes next sees the sum.
#if !defined(__CUDACC__)
#error "trident/parallel/tensor/cuda/linear.cuh contains CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "trident/comm/communicator.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/half.hpp"
#include "trident/exec/cuda/stream.hpp"
#include "trident/nn/cuda/layers.cuh"
#include "trident/parallel/tensor/linear.hpp"

namespace trident::tensor::cuda {

namespace detail {

template <class Comm>
constexpr void require_device_comm() {
  static_assert(!Comm::space::host_accessible && requires(Comm& c) { c.stream(); },
                "trident::tensor::cuda: these layers need a device communicator with a stream (nccl_comm); host "
                "communicators use trident::tensor's host layers");
}

inline void add_bias(cudaStream_t stream, device_span<float> y, device_span<const float> b, std::size_t out) {
  if (b.empty() || y.empty()) return;
  nn::cuda::detail::add_bias_kernel<><<<nn::cuda::detail::grid_for(y.size()), nn::cuda::detail::block_size, 0, stream>>>(
      y, b, out);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail

//! tensor::column_parallel_linear on the GPU (see the header comment).
class column_parallel_linear {
  // dx = dy W_r on the compute stream now; returns what computes dW += dy^T x and db later
  // (beside the collective on dx). Under gemm_math::bf16, x, W and dy are rounded once here for
  // both GEMMs: the copies in the handle's scratch stay valid, as nothing else runs a GEMM
  // through the handle in between (the collective only reads dx). Defined before its callers,
  // which use its deduced return type.
  // x and dy may be in bf16 already (gemm_math::bf16 only: then they are not rounded again; a
  // bf16 dy takes no bias gradient).
  template <class X, class Dy>
  static auto input_gradient(const cuda_context& ctx, nn::blas_ref blas, const nn::cuda::linear& layer, std::size_t batch,
                             device_span<const X> x, device_span<const float> w, device_span<const Dy> dy,
                             device_span<float> dx, device_span<float> dw, device_span<float> db) {
    const cudaStream_t stream = ctx.stream();
    const std::size_t in = layer.in_features, out = layer.out_features;
    nn::cuda::linear::rounded_operands r;
    constexpr bool rounded_input = std::is_same_v<X, trident::bf16> || std::is_same_v<Dy, trident::bf16>;
    const bool bf16 = blas.math == nn::gemm_math::bf16 || rounded_input;
    if (bf16) {
      r = layer.round_for_backward(blas, stream, batch, x, w, dy);
      layer.input_gradient(blas, stream, batch, r, dx);
    } else if constexpr (!rounded_input) {
      nn::cuda::gemm(blas, stream, nn::op::n, nn::op::n, batch, in, out, 1.0f, dy.data(), out, w.data(), in, 0.0f, dx.data(), in);
    }
    return [=] {
      if constexpr (!rounded_input) {
        if (!bf16) {
          layer.backward(blas, stream, batch, x, {}, dy, {}, dw, db);
          return;
        }
      }
      layer.weight_gradient(blas, stream, batch, r, dw);
      if constexpr (std::is_same_v<Dy, float>) layer.bias_gradient(stream, batch, dy, db);
    };
  }

 public:
  template <communicator Comm>
  column_parallel_linear(const Comm& tp, std::size_t in_features, std::size_t out_features,
                         std::string name = "column_parallel_linear")
      : shape_(tp, in_features, out_features, std::move(name)) {}

  //! The shapes and shardings (this rank's part of the weight: weight_sharding()).
  const tensor::column_parallel_linear& shape() const noexcept { return shape_; }
  bool overlap = true;

  //! x [batch, in] float; or bf16 under gemm_math::bf16, rounded by its producer (nothing
  //! rounds it again: the same bits as the float x that rounds to it, for a 256-byte aligned x
  //! such as a buffer of its own; see nn::cuda::linear). backward's x alike.
  template <communicator Comm>
  void forward(const cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const float> x,
               device_span<const float> w, device_span<const float> b, device_span<float> y) const {
    forward_impl(ctx, blas, tp, batch, x, w, b, y);
  }
  template <communicator Comm>
  void forward(const cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const trident::bf16> x,
               device_span<const float> w, device_span<const float> b, device_span<float> y) const {
    forward_impl(ctx, blas, tp, batch, x, w, b, y);
  }

  template <communicator Comm>
  void backward(cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const float> x,
                device_span<const float> w, device_span<const float> dy, device_span<float> dx, device_span<float> dw,
                device_span<float> db) const {
    backward_impl(ctx, blas, tp, batch, x, w, dy, dx, dw, db);
  }
  template <communicator Comm>
  void backward(cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const trident::bf16> x,
                device_span<const float> w, device_span<const float> dy, device_span<float> dx, device_span<float> dw,
                device_span<float> db) const {
    backward_impl(ctx, blas, tp, batch, x, w, dy, dx, dw, db);
  }
  //! dy in bf16, under gemm_math::bf16 only, rounded by its producer (as the vocabulary-parallel
  //! cross-entropy's backward writes the output head's): nothing reads or rounds a float dy; the
  //! same bits as the float dy that rounds to it, for a 256-byte aligned dy. No bias gradient (db
  //! empty), as nn::cuda::linear's.
  template <communicator Comm>
  void backward(cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const float> x,
                device_span<const float> w, device_span<const trident::bf16> dy, device_span<float> dx, device_span<float> dw,
                device_span<float> db) const {
    backward_impl(ctx, blas, tp, batch, x, w, dy, dx, dw, db);
  }

 private:
  template <communicator Comm, class X>
  void forward_impl(const cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const X> x,
                    device_span<const float> w, device_span<const float> b, device_span<float> y) const {
    detail::require_device_comm<Comm>();
    tensor::detail::check_group(name(), "forward", tp, tp_size());
    nn::detail::check_linear_forward((name() + ".forward").c_str(), batch, local().in_features, local().out_features,
                                     x.size(), w.size(), b.size(), y.size());
    nn::cuda::linear{local().in_features, local().out_features}.forward(blas, ctx.stream(), batch, x, w, b, y);  // f: identity
  }
  template <communicator Comm, class X, class Dy>
  void backward_impl(cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const X> x,
                     device_span<const float> w, device_span<const Dy> dy, device_span<float> dx, device_span<float> dw,
                     device_span<float> db) const {
    detail::require_device_comm<Comm>();
    tensor::detail::check_group(name(), "backward", tp, tp_size());
    const std::size_t in = local().in_features, out = local().out_features;
    nn::detail::check_linear_backward((name() + ".backward").c_str(), batch, in, out, x.size(), w.size(), dy.size(),
                                      dx.size(), dw.size(), db.size());
    if constexpr (std::is_same_v<Dy, trident::bf16>) {
      TRIDENT_EXPECT(db.empty(), name(), ".backward: dy in bf16 takes no bias gradient (db has ", db.size(),
                     " elements, expected none): the bias's column sums are taken over the float dy");
      TRIDENT_EXPECT(blas.math == nn::gemm_math::bf16, name(), ".backward: dy in bf16 needs gemm_math::bf16; the blas_ref is in ",
                     nn::name(blas.math));
    }
    const nn::cuda::linear layer{in, out};
    if (dx.empty()) {
      layer.backward(blas, ctx.stream(), batch, x, {}, dy, {}, dw, db);
      return;
    }
    const auto weights = input_gradient(ctx, blas, layer, batch, x, w, dy, dx, dw, db);
    if (!overlap) weights();
    ctx.hand_to(tp.stream());  // the all-reduce starts once dx is written
    tp.all_reduce(space_span<float, cuda_space>(dx.data(), dx.size()), reduce_op::sum);  // enqueued, not waited for
    if (overlap) weights();                                                             // meanwhile
    ctx.order_after(tp.stream());  // what follows on the compute stream sees the sum
  }

 public:
  //! Sequence parallelism: x [batch, in] is the all-gathered input, so the input gradient goes
  //! back to sequence shards: `partial` [batch, in] (scratch) = dy W_r, reduce-scattered into dx
  //! [batch / t, in] (overwritten) beside the weight-gradient GEMM (without overlap the GEMM is
  //! queued first and the reduce-scatter waits for it); the host's backward_to_sequence.
  template <communicator Comm>
  void backward_to_sequence(cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const float> x,
                            device_span<const float> w, device_span<const float> dy, device_span<float> partial,
                            device_span<float> dx, device_span<float> dw, device_span<float> db) const {
    detail::require_device_comm<Comm>();
    tensor::detail::check_group(name(), "backward_to_sequence", tp, tp_size());
    const std::size_t in = local().in_features, out = local().out_features, t = static_cast<std::size_t>(tp_size());
    nn::detail::check_linear_backward((name() + ".backward_to_sequence").c_str(), batch, in, out, x.size(), w.size(), dy.size(),
                                      partial.size(), dw.size(), db.size());
    TRIDENT_EXPECT(batch % t == 0 && dx.size() * t == partial.size(), name(), ".backward_to_sequence: dx has ", dx.size(),
                   " elements, expected [", batch, " / ", tp_size(), ", ", in, "] (this rank's rows)");
    const nn::cuda::linear layer{in, out};
    const auto weights = input_gradient(ctx, blas, layer, batch, x, w, dy, partial, dw, db);
    if (!overlap) weights();
    ctx.hand_to(tp.stream());
    tp.reduce_scatter(space_span<const float, cuda_space>(partial.data(), partial.size()),
                      space_span<float, cuda_space>(dx.data(), dx.size()), reduce_op::sum);
    if (overlap) weights();
    ctx.order_after(tp.stream());
  }

 private:
  const std::string& name() const noexcept { return shape_.name(); }
  const nn::linear& local() const noexcept { return shape_.local(); }
  int tp_size() const noexcept { return shape_.parts(); }

  tensor::column_parallel_linear shape_;
};

//! tensor::row_parallel_linear on the GPU (see the header comment).
class row_parallel_linear {
 public:
  template <communicator Comm>
  row_parallel_linear(const Comm& tp, std::size_t in_features, std::size_t out_features, std::string name = "row_parallel_linear")
      : shape_(tp, in_features, out_features, std::move(name)) {}

  const tensor::row_parallel_linear& shape() const noexcept { return shape_; }

  //! y = sum over the group of x_r W_r^T (g), then + b; the same on every rank. x float; or
  //! bf16 under gemm_math::bf16, rounded by its producer (as the column layer's).
  template <communicator Comm>
  void forward(cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const float> x,
               device_span<const float> w, device_span<const float> b, device_span<float> y) const {
    forward_impl(ctx, blas, tp, batch, x, w, b, y);
  }
  template <communicator Comm>
  void forward(cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const trident::bf16> x,
               device_span<const float> w, device_span<const float> b, device_span<float> y) const {
    forward_impl(ctx, blas, tp, batch, x, w, b, y);
  }

 private:
  template <communicator Comm, class X>
  void forward_impl(cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const X> x,
                    device_span<const float> w, device_span<const float> b, device_span<float> y) const {
    detail::require_device_comm<Comm>();
    tensor::detail::check_group(shape_.name(), "forward", tp, tp_size());
    const std::size_t in = shape_.local().in_features, out = shape_.local().out_features;
    nn::detail::check_linear_forward((shape_.name() + ".forward").c_str(), batch, in, out, x.size(), w.size(), b.size(),
                                     y.size());
    nn::cuda::linear{in, out}.forward(blas, ctx.stream(), batch, x, w, {}, y);
    ctx.hand_to(tp.stream());
    tp.all_reduce(space_span<float, cuda_space>(y.data(), y.size()), reduce_op::sum);
    ctx.order_after(tp.stream());
    detail::add_bias(ctx.stream(), y, b, out);  // once, after the sum
  }

 public:
  //! Sequence parallelism: the partial products [batch, out] (`partial`, scratch) are
  //! reduce-scattered to this rank's rows, y [batch / t, out], and the bias is added there; the
  //! host's forward_to_sequence. Backward is backward() with the all-gathered output gradient.
  template <communicator Comm>
  void forward_to_sequence(cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const float> x,
                           device_span<const float> w, device_span<const float> b, device_span<float> partial,
                           device_span<float> y) const {
    detail::require_device_comm<Comm>();
    tensor::detail::check_group(shape_.name(), "forward_to_sequence", tp, tp_size());
    const std::size_t in = shape_.local().in_features, out = shape_.local().out_features, t = static_cast<std::size_t>(tp_size());
    nn::detail::check_linear_forward((shape_.name() + ".forward_to_sequence").c_str(), batch, in, out, x.size(), w.size(),
                                     b.size(), partial.size());
    TRIDENT_EXPECT(batch % t == 0 && y.size() * t == partial.size(), shape_.name(), ".forward_to_sequence: y has ", y.size(),
                   " elements, expected [", batch, " / ", tp_size(), ", ", out, "] (this rank's rows)");
    nn::cuda::linear{in, out}.forward(blas, ctx.stream(), batch, x, w, {}, partial);
    ctx.hand_to(tp.stream());
    tp.reduce_scatter(space_span<const float, cuda_space>(partial.data(), partial.size()),
                      space_span<float, cuda_space>(y.data(), y.size()), reduce_op::sum);
    ctx.order_after(tp.stream());
    detail::add_bias(ctx.stream(), y, b, out);  // once, on this rank's rows
  }

  //! Local: dy is the same on every rank (g's backward is the identity). x as forward's.
  template <communicator Comm>
  void backward(const cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const float> x,
                device_span<const float> w, device_span<const float> dy, device_span<float> dx, device_span<float> dw,
                device_span<float> db) const {
    backward_impl(ctx, blas, tp, batch, x, w, dy, dx, dw, db);
  }
  template <communicator Comm>
  void backward(const cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const trident::bf16> x,
                device_span<const float> w, device_span<const float> dy, device_span<float> dx, device_span<float> dw,
                device_span<float> db) const {
    backward_impl(ctx, blas, tp, batch, x, w, dy, dx, dw, db);
  }

 private:
  template <communicator Comm, class X>
  void backward_impl(const cuda_context& ctx, nn::blas_ref blas, Comm& tp, std::size_t batch, device_span<const X> x,
                     device_span<const float> w, device_span<const float> dy, device_span<float> dx, device_span<float> dw,
                     device_span<float> db) const {
    detail::require_device_comm<Comm>();
    tensor::detail::check_group(shape_.name(), "backward", tp, tp_size());
    const std::size_t in = shape_.local().in_features, out = shape_.local().out_features;
    nn::detail::check_linear_backward((shape_.name() + ".backward").c_str(), batch, in, out, x.size(), w.size(), dy.size(),
                                      dx.size(), dw.size(), db.size());
    nn::cuda::linear{in, out}.backward(blas, ctx.stream(), batch, x, w, dy, dx, dw, db);
  }

  int tp_size() const noexcept { return shape_.parts(); }
  tensor::row_parallel_linear shape_;
};

}  // namespace trident::tensor::cuda
