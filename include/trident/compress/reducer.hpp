#pragma once
// Gradient reducers: what replaces the plain all-reduce of a gradient bucket in data-parallel
// training, so that fewer bytes cross the network (issue 16).
//
//   struct compress::tensor_part             one tensor of a bucket, as a rows x cols matrix
//   struct compress::bucket_view<T, Space>   a bucket's gradients to reduce in place, its tensors
//   concept compress::gradient_reducer       how a type opts in: all_reduce(comm, bucket)
//   concept compress::stateful_reducer       one with state also has step_skipped(comm)
//   struct compress::exact                   the plain all_reduce (the baseline)
//   compress::cast<Half>                     compress/cast.hpp: fp16/bf16 on the wire
//   compress::powersgd                       compress/powersgd.hpp: low rank, error feedback
//   compress::onebit                         compress/onebit.hpp: signs and a scale, error feedback
//
// zero_optimizer::reduce_gradients_with(std::shared_ptr<R>) hands each bucket to R once per step
// (every ZeRO stage: stages 2 and 3 then keep their piece of the reduced bucket). A reducer keeps
// its state (error feedback, warm starts) per bucket index, so one reducer serves one optimizer.
// Every rank must end with the same values: the optimizer's replicas stay equal only so.
//
// A type opts in with a member
//   template <class Comm> void all_reduce(Comm& comm, const bucket_view<T, typename Comm::space>& b);
// that leaves in b.data, on every rank, (an approximation of) b.op (sum or avg) over the ranks'
// b.data. A reducer that keeps state across steps also has
//   template <class Comm> void step_skipped(Comm& comm);      (concept stateful_reducer)
// which the optimizer calls on every rank when it skips a step for an inf/NaN gradient (fp16's
// loss scaling): the reducer forgets what that step's buckets taught it, so that the non-finite
// values do not poison every later step. The reducers here work on host memory (thread ranks, MPI) and on a device (nccl_comm,
// with compress/cuda/cast.cuh, compress/cuda/onebit.cuh and compress/cuda/powersgd.cuh).
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/core/error.hpp"
#include "trident/core/half.hpp"
#include "trident/core/space_span.hpp"

namespace trident::compress {

//! Elements [offset, offset + rows * cols) of a bucket hold one tensor, seen as a rows x cols
//! matrix: rows = its first dimension, cols = the rest (PyTorch's tensor.view(shape[0], -1)), so
//! a 1-D tensor of n elements is n x 1.
struct tensor_part {
  std::string name;
  std::size_t offset = 0;
  std::size_t rows = 0, cols = 0;
  std::size_t numel() const noexcept { return rows * cols; }
};

//! A bucket of this rank's gradients, reduced in place. Elements outside every tensor are
//! padding (zero on every rank).
template <class T, memory_space Space>
struct bucket_view {
  std::size_t index = 0;                 // the bucket: a reducer's state is kept per bucket
  space_span<T, Space> data;             // this rank's gradients in, the reduced ones out
  std::span<const tensor_part> tensors;  // in bucket order
  reduce_op op = reduce_op::avg;         // sum or avg over the ranks
  //! The optimizer step these gradients are for (1-based; 0: not said). ZeRO stages 2-3 reduce
  //! each micro-batch, so with gradient accumulation a bucket comes several times per step:
  //! warm-ups count steps, not calls.
  std::int64_t step = 0;
};

//! A type that can stand in for the all-reduce of a gradient bucket (see the header comment).
template <class R, class Comm, class T>
concept gradient_reducer = communicator<Comm> && requires(R& r, Comm& c, const bucket_view<T, typename Comm::space>& b) {
  r.all_reduce(c, b);
};

//! A reducer with state across steps (error feedback, warm starts, momentum): step_skipped(comm)
//! makes it forget the step that the optimizer skipped (see the header comment).
template <class R, class Comm>
concept stateful_reducer = communicator<Comm> && requires(R& r, Comm& c) { r.step_skipped(c); };

//! The plain all-reduce, through the same hook (the baseline the others are measured against).
struct exact {
  template <class Comm, class T>
  void all_reduce(Comm& comm, const bucket_view<T, typename Comm::space>& b) {
    space_span<T, typename Comm::space> data = b.data;
      comm.all_reduce(data, b.op);
  }
};

namespace detail {

template <class T>
float to_float(T v) noexcept {
  return static_cast<float>(v);
}
//! The bucket's values as floats (reducers compute in float whatever the gradients' type).
template <class T, memory_space Space>
std::vector<float> floats_of(const bucket_view<T, Space>& b) {
  static_assert(Space::host_accessible, "trident::compress: these reducers work on host memory (thread ranks, MPI)");
  std::vector<float> v(b.data.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = to_float(b.data.data()[i]);
  return v;
}
//! Every tensor of the bucket lies inside its data (the reducers index the data with them).
template <class T, memory_space Space>
void check_bucket(const bucket_view<T, Space>& b, const char* who) {
  for (const tensor_part& t : b.tensors) {
    std::size_t n = 0;
    const bool fits = !__builtin_mul_overflow(t.rows, t.cols, &n) && t.offset <= b.data.size() && n <= b.data.size() - t.offset;
    TRIDENT_EXPECT(fits, who, ": bucket ", b.index, "'s tensor '", t.name, "' (", t.rows, " x ", t.cols, " at offset ", t.offset,
                   ") does not fit in the bucket's ", b.data.size(), " elements");
  }
}
template <class T, memory_space Space>
void store(const bucket_view<T, Space>& b, std::span<const float> v) {
  for (std::size_t i = 0; i < v.size(); ++i) b.data.data()[i] = static_cast<T>(v[i]);
}

}  // namespace detail

}  // namespace trident::compress
