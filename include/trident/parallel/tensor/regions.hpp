#pragma once
// The conjugate communication operators of tensor and sequence parallelism (Megatron-LM:
// Shoeybi et al. 2019, "f" and "g"; Korthikanti et al. 2022 for the sequence-parallel pair),
// each a forward and the backward that is its adjoint, over the tensor-parallel communicator:
//
//   copy_to_region             f: forward identity,          backward all-reduce (sum)
//   reduce_from_region         g: forward all-reduce (sum),  backward identity
//   gather_from_sequence       forward all-gather of sequence shards,  backward reduce-scatter
//   reduce_scatter_to_sequence forward reduce-scatter to sequence shards, backward all-gather
//   concept region_operator    what a type provides to be one of them
//
// A transformer's MLP and attention are f -> column-parallel GEMM -> ... -> row-parallel GEMM
// -> g; with sequence parallelism f becomes gather_from_sequence and g
// reduce_scatter_to_sequence, moving the same bytes (an all-reduce is a reduce-scatter and an
// all-gather), while the norms and residuals between blocks run on sequence shards.
//
// Every operator is stateless and takes (comm, in, out), both forward and backward, over any
// communicator and its memory space: `in` and `out` may be the same buffer where the operator
// is an identity or an all-reduce (in place). Sequence shards are contiguous: activations are
// laid out sequence-major ([s, b, h], as Megatron's), so rank r's shard is rows r*s/t .. of the
// whole, and an all-gather in rank order rebuilds it. The _async forms return the
// communicator's request (identity: nothing to wait for, so they have none), which is how the
// layers in linear.hpp overlap the input-gradient all-reduce with the weight-gradient GEMM.
//
//   trident::tensor::copy_to_region::forward(tp, x, x);          // nothing moves
//   ... column-parallel GEMM, GELU, row-parallel GEMM into y ...
//   trident::tensor::reduce_from_region::forward(tp, y, y);      // y summed over the tensor group
//   trident::tensor::reduce_from_region::backward(tp, dy, dy);   // nothing moves
//   trident::tensor::copy_to_region::backward(tp, dx, dx);       // dx summed over the group
//
// A type opts in to region_operator by providing static forward(comm, in, out) and
// backward(comm, in, out) for the communicator's spans.
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>

#include "trident/comm/communicator.hpp"
#include "trident/core/error.hpp"
#include "trident/core/space_span.hpp"

namespace trident::tensor {

namespace detail {

// out = in for the identity halves: nothing when they are one buffer, else a copy in the
// communicator's space (host spaces only here: a device copy must be ordered on the
// communicator's stream, which the CUDA layers do themselves).
template <class Comm, class In, class Out>
void identity(const char* who, Comm&, In&& in, Out&& out) {
  using space = typename std::remove_cvref_t<Comm>::space;
  auto i = trident::as_space_span<space>(in);
  auto o = trident::as_space_span<space>(out);
  TRIDENT_EXPECT(i.size() == o.size(), who, ": the input has ", i.size(), " elements and the output ", o.size(),
                 "; expected the same size");
  if (static_cast<const void*>(i.data()) == static_cast<const void*>(o.data())) return;
  using element = std::remove_pointer_t<decltype(o.data())>;
  if constexpr (std::is_const_v<element>) {
    throw usage_error(trident::detail::concat(who, ": the output is read-only and not the input; expected the input "
                                                   "itself (in place) or a writable buffer"));
  } else if constexpr (space::host_accessible) {
    std::copy(i.data(), i.data() + i.size(), o.data());
  } else {
    static_assert(space::host_accessible, "tensor regions: an identity between two device buffers needs a stream; "
                                          "pass the same buffer as input and output (in place)");
  }
}

}  // namespace detail

//! f: the input of a column-parallel layer. Forward: every rank already holds the whole input
//! (identity). Backward: each rank's input gradient is a partial sum over its output features,
//! so they are summed over the tensor group.
struct copy_to_region {
  template <communicator Comm, class In, class Out>
  static void forward(Comm& tp, In&& in, Out&& out) {
    detail::identity("copy_to_region::forward", tp, in, out);
  }
  template <communicator Comm, class In, class Out>
  static void backward(Comm& tp, In&& grad_out, Out&& grad_in) {
    tp.all_reduce(grad_out, grad_in, reduce_op::sum);
  }
  //! The backward all-reduce, started: wait() before the input gradient is used.
  template <communicator Comm, class In, class Out>
  static auto backward_async(Comm& tp, In&& grad_out, Out&& grad_in) {
    return tp.all_reduce_async(grad_out, grad_in, reduce_op::sum);
  }
};

//! g: the output of a row-parallel layer. Forward: each rank holds a partial sum over its
//! input features; they are summed over the tensor group. Backward: the output gradient is the
//! same on every rank (identity).
struct reduce_from_region {
  template <communicator Comm, class In, class Out>
  static void forward(Comm& tp, In&& partial, Out&& out) {
    tp.all_reduce(partial, out, reduce_op::sum);
  }
  template <communicator Comm, class In, class Out>
  static auto forward_async(Comm& tp, In&& partial, Out&& out) {
    return tp.all_reduce_async(partial, out, reduce_op::sum);
  }
  template <communicator Comm, class In, class Out>
  static void backward(Comm& tp, In&& grad_out, Out&& grad_in) {
    detail::identity("reduce_from_region::backward", tp, grad_out, grad_in);
  }
};

//! Sequence parallelism's f: forward all-gathers the sequence shards ([s/t, ...] on each rank)
//! into the whole sequence ([s, ...]) for a column-parallel layer; backward reduce-scatters the
//! whole-sequence gradient (a partial sum on each rank) back to summed shards.
struct gather_from_sequence {
  template <communicator Comm, class In, class Out>
  static void forward(Comm& tp, In&& shard, Out&& whole) {
    tp.all_gather(shard, whole);
  }
  template <communicator Comm, class In, class Out>
  static auto forward_async(Comm& tp, In&& shard, Out&& whole) {
    return tp.all_gather_async(shard, whole);
  }
  template <communicator Comm, class In, class Out>
  static void backward(Comm& tp, In&& grad_whole, Out&& grad_shard) {
    tp.reduce_scatter(grad_whole, grad_shard, reduce_op::sum);
  }
  template <communicator Comm, class In, class Out>
  static auto backward_async(Comm& tp, In&& grad_whole, Out&& grad_shard) {
    return tp.reduce_scatter_async(grad_whole, grad_shard, reduce_op::sum);
  }
};

//! Sequence parallelism's g: forward reduce-scatters a row-parallel layer's partial sums over
//! the whole sequence into summed sequence shards; backward all-gathers the shards' gradients.
struct reduce_scatter_to_sequence {
  template <communicator Comm, class In, class Out>
  static void forward(Comm& tp, In&& partial_whole, Out&& shard) {
    tp.reduce_scatter(partial_whole, shard, reduce_op::sum);
  }
  template <communicator Comm, class In, class Out>
  static auto forward_async(Comm& tp, In&& partial_whole, Out&& shard) {
    return tp.reduce_scatter_async(partial_whole, shard, reduce_op::sum);
  }
  template <communicator Comm, class In, class Out>
  static void backward(Comm& tp, In&& grad_shard, Out&& grad_whole) {
    tp.all_gather(grad_shard, grad_whole);
  }
  template <communicator Comm, class In, class Out>
  static auto backward_async(Comm& tp, In&& grad_shard, Out&& grad_whole) {
    return tp.all_gather_async(grad_shard, grad_whole);
  }
};

//! A forward and its adjoint over the tensor-parallel communicator, both (comm, in, out).
template <class Op, class Comm, class T = float>
concept region_operator = communicator<Comm> && requires(Comm& c, space_span<T, typename Comm::space> a,
                                                         space_span<T, typename Comm::space> b) {
  Op::forward(c, a, b);
  Op::backward(c, a, b);
};

}  // namespace trident::tensor
