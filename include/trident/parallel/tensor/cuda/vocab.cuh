// trident-requires: nvcc
#pragma once
// The vocabulary-parallel embedding and cross-entropy of parallel/tensor/vocab.hpp on the GPU,
// over a device communicator (nccl_comm): the same shardings and shape checks (the host classes
// hold them: shape()), kernels on a cuda_context's compute stream, the all-reduces on the
// communicator's stream, ordered by events both ways. Nothing waits on the host or allocates
// after the first call.
//
//   trident::tensor::cuda::vocab_parallel_embedding wte(tp, vocab, hidden, "wte");
//   wte.forward(ctx, tp, tokens, table_part, x);           // x [n, hidden], the same on every rank
//   wte.backward(ctx, tp, tokens, dx, dtable_part);         // this rank's rows, accumulated
//   trident::tensor::cuda::vocab_parallel_cross_entropy ce(tp, vocab, "lm_head");
//   ce.forward(ctx, tp, n, logits_part, targets, loss);     // loss: one float in device memory
//   ce.backward(ctx, n, logits_part, targets, dlogits_part);  // float (may be logits_part) or bf16
//
// Tokens and targets live in device memory, so the host cannot check their values without
// waiting for the device: a token or target outside [0, vocab) makes its row NaN on every rank
// (its embedding row, its loss term and so the loss, its gradient row), as nn::cuda's
// cross-entropy does, instead of an exception. Sizes are checked on the host, as there.
//
// Deterministic: row statistics over a fixed tree in double, the loss's mean over a fixed tree,
// the table's gradient summed over positions in order; no atomics. For that gradient the
// positions are sorted by token (CUB's radix sort, which is stable, so each token's positions
// stay in order), cut into runs of one token (CUB's run-length encoding), and each (token,
// column) adds its run in order: the host's order and rounding, with a thread per element of
// the rows the batch touches instead of one per column walking every position. The sort's
// buffers are made at the first backward() (mem_category::other) and kept.
#if !defined(__CUDACC__)
#error "trident/parallel/tensor/cuda/vocab.cuh contains CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "trident/comm/communicator.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/half.hpp"
#include "trident/exec/cuda/stream.hpp"
#include "trident/nn/cuda/layers.cuh"
#include "trident/parallel/tensor/cuda/linear.cuh"
#include "trident/parallel/tensor/vocab.hpp"

namespace trident::tensor::cuda {

namespace detail {

namespace k = nn::cuda::detail;

// out[i, :] = the table's row of tokens[i] when this rank holds it, zeros when another does, NaN
// when no rank does (outside [0, vocab)).
template <class = void>  // a template so that several translation units may include this header
__global__ void embedding_lookup_kernel(device_span<const std::int32_t> tokens, device_span<const float> table,
                                        device_span<float> out, std::size_t hidden, std::size_t begin, std::size_t end,
                                        std::size_t vocab) {
  const std::size_t total = tokens.size() * hidden;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total; e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t i = e / hidden, j = e % hidden;
    const std::int32_t t = tokens[i];
    float value = 0.0f;
    if (t < 0 || static_cast<std::size_t>(t) >= vocab) value = NAN;
    else if (static_cast<std::size_t>(t) >= begin && static_cast<std::size_t>(t) < end)
      value = table[(static_cast<std::size_t>(t) - begin) * hidden + j];
    out[e] = value;
  }
}

// The sort's keys: a token's row in this rank's table, or `rows` (sorted last, never added)
// when another rank holds it or it is outside the vocabulary; the values are the positions.
template <class = void>  // a template so that several translation units may include this header
__global__ void embedding_keys_kernel(device_span<const std::int32_t> tokens, std::size_t begin, std::size_t end,
                                      std::uint32_t* __restrict__ keys, std::uint32_t* __restrict__ positions) {
  const std::size_t rows = end - begin;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < tokens.size(); i += std::size_t{gridDim.x} * blockDim.x) {
    const std::int32_t t = tokens[i];
    const bool mine = t >= 0 && static_cast<std::size_t>(t) >= begin && static_cast<std::size_t>(t) < end;
    keys[i] = static_cast<std::uint32_t>(mine ? static_cast<std::size_t>(t) - begin : rows);
    positions[i] = static_cast<std::uint32_t>(i);
  }
}

// dtable[row, j] += dout[i, j] over the run of positions i of each row this rank holds, in
// position order (the sort kept it): the host's order and rounding. Element e = (run, column).
template <class = void>  // a template so that several translation units may include this header
__global__ void embedding_grad_kernel(const std::uint32_t* __restrict__ rows_of_runs, const std::uint32_t* __restrict__ starts,
                                      const std::uint32_t* __restrict__ lengths, const std::uint32_t* __restrict__ runs,
                                      const std::uint32_t* __restrict__ positions, device_span<const float> dout,
                                      device_span<float> dtable, std::size_t hidden, std::size_t rows, std::size_t tokens) {
  const std::size_t total = tokens * hidden, used = static_cast<std::size_t>(*runs) * hidden;
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < total && e < used;
       e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = e / hidden, j = e % hidden;
    const std::size_t row = rows_of_runs[r];
    if (row >= rows) continue;  // the run of tokens this rank does not hold
    float* dst = dtable.data() + row * hidden + j;
    float acc = *dst;
    const std::size_t first = starts[r], count = lengths[r];
    for (std::size_t k = first; k < first + count; ++k) acc = __fadd_rn(acc, dout[std::size_t{positions[k]} * hidden + j]);
    *dst = acc;
  }
}

// A running softmax denominator: the largest logit seen and the sum of exp(logit - max) over
// those seen. Merging two rescales the one with the smaller max (no exp when a max equals the
// merged one, so that empty states, max -inf, merge to 0 rather than NaN). NaN and +inf logits
// make the sum NaN, as the two-pass form did; -inf logits add nothing.
struct softmax_state {
  float max = -INFINITY;
  double sum = 0;

  __device__ void add(float x) {
    if (x > max) {  // rare after a row's first few columns
      // exp(-inf) = 0 for the first; a +inf logit makes the sum NaN, as exp(inf - inf) did in
      // the two-pass form (and does on the host), wherever the other columns of its row lie
      sum = sum * exp(static_cast<double>(max) - x) + (x == INFINITY ? NAN : 1.0);
      max = x;
    } else if (x != -INFINITY) {  // -inf adds 0 (and exp(-inf - -inf) would be NaN); NaN adds NaN
      sum += exp(static_cast<double>(x) - max);
    }
  }
  __device__ static softmax_state merge(softmax_state a, softmax_state b) {
    softmax_state m;
    m.max = b.max > a.max ? b.max : a.max;
    m.sum = (a.max == m.max ? a.sum : a.sum * exp(static_cast<double>(a.max) - m.max)) +
            (b.max == m.max ? b.sum : b.sum * exp(static_cast<double>(b.max) - m.max));
    return m;
  }
};

// One pass over each row (one block per row): max[i] and local_max[i] = the row's largest logit
// on this rank's columns, sums[i] = the sum of exp(logit - that max) over them, sums[n + i] =
// the target's logit where this rank holds it (0 elsewhere; NaN on every rank for a target
// outside the vocabulary). The threads' states merge over a fixed tree. (Two passes, the max
// and then the sum, read the logits twice: 3.3 GB each for GPT-2 at B = 16, T = 1024.)
template <class = void>  // a template so that several translation units may include this header
__global__ void row_stats_kernel(device_span<const float> logits, device_span<const std::int32_t> targets, std::size_t local,
                                 device_span<float> max, device_span<float> local_max, device_span<double> sums,
                                 std::size_t begin, std::size_t vocab) {
  __shared__ float shared_max[k::block_size];
  __shared__ double shared_sum[k::block_size];
  const std::size_t i = blockIdx.x, n = targets.size();
  const float* row = logits.data() + i * local;
  softmax_state state;
  for (std::size_t c = threadIdx.x; c < local; c += k::block_size) state.add(row[c]);
  shared_max[threadIdx.x] = state.max;
  shared_sum[threadIdx.x] = state.sum;
  __syncthreads();
  for (unsigned half = k::block_size / 2; half > 0; half /= 2) {  // a fixed tree: the same bits every run
    if (threadIdx.x < half) {
      const softmax_state merged = softmax_state::merge({shared_max[threadIdx.x], shared_sum[threadIdx.x]},
                                                        {shared_max[threadIdx.x + half], shared_sum[threadIdx.x + half]});
      shared_max[threadIdx.x] = merged.max;
      shared_sum[threadIdx.x] = merged.sum;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    max[i] = local_max[i] = shared_max[0];
    sums[i] = shared_sum[0];
    const std::int32_t t = targets[i];
    double target = 0;
    if (t < 0 || static_cast<std::size_t>(t) >= vocab) target = NAN;
    else if (static_cast<std::size_t>(t) >= begin && static_cast<std::size_t>(t) < begin + local)
      target = row[static_cast<std::size_t>(t) - begin];
    sums[n + i] = target;
  }
}

// After the max's all-reduce: each rank's sums taken to the row's max over every rank, so that
// their all-reduce is the whole row's (no exp where this rank holds the max: one rank, always).
template <class = void>  // a template so that several translation units may include this header
__global__ void rescale_sums_kernel(device_span<const float> max, device_span<const float> local_max, device_span<double> sums) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < max.size(); i += std::size_t{gridDim.x} * blockDim.x)
    if (local_max[i] != max[i]) sums[i] *= exp(static_cast<double>(local_max[i]) - max[i]);
}

// loss[0] = the mean over rows of (max + log sum) - target logit, over a fixed tree (one block).
template <class = void>  // a template so that several translation units may include this header
__global__ void mean_loss_kernel(device_span<const float> max, device_span<const double> sums, device_span<float> loss) {
  __shared__ double shared[k::block_size];
  const std::size_t n = max.size();
  double total = 0;
  for (std::size_t i = threadIdx.x; i < n; i += k::block_size)
    total += (static_cast<double>(max[i]) + log(sums[i])) - sums[n + i];
  total = k::block_reduce(total, shared, k::add_op{});
  if (threadIdx.x == 0) loss[0] = static_cast<float>(total / static_cast<double>(n));
}

// dlogits = scale (softmax - onehot(target)) on this rank's columns (one block per row); the
// softmax as exp(logit - lse), lse = max + log(sum) once per row: no division per element.
// Out: float, or bf16 (the float value rounded as bf16's constructor rounds: what a GEMM on bf16
// operands would round it to).
template <class Out = float>
__global__ void vocab_ce_backward_kernel(device_span<const float> logits, device_span<const std::int32_t> targets,
                                         std::size_t local, device_span<const float> max, device_span<const double> sums,
                                         device_span<Out> dlogits, double scale, std::size_t begin, std::size_t vocab) {
  const std::size_t i = blockIdx.x;
  const float* row = logits.data() + i * local;
  Out* grad = dlogits.data() + i * local;
  const std::int32_t t = targets[i];
  const bool valid = t >= 0 && static_cast<std::size_t>(t) < vocab;
  const double lse = static_cast<double>(max[i]) + log(sums[i]);
  for (std::size_t c = threadIdx.x; c < local; c += k::block_size) {
    const double p = exp(static_cast<double>(row[c]) - lse);
    const double onehot = valid && begin + c == static_cast<std::size_t>(t) ? 1.0 : 0.0;
    grad[c] = Out(valid ? static_cast<float>(scale * (p - onehot)) : NAN);
  }
}

inline unsigned rows_grid(const std::string& who, std::size_t n) {
  TRIDENT_EXPECT(n <= 0x7fffffffu, who, ": ", n, " rows exceed the grid's limit");
  return static_cast<unsigned>(n);
}

}  // namespace detail

//! tensor::vocab_parallel_embedding on the GPU (see the header comment).
class vocab_parallel_embedding {
 public:
  template <communicator Comm>
  vocab_parallel_embedding(const Comm& tp, std::size_t vocab, std::size_t hidden, std::string name = "vocab_parallel_embedding")
      : shape_(tp, vocab, hidden, std::move(name)) {}

  //! The shapes and sharding (weight_sharding(), vocab_range()).
  const tensor::vocab_parallel_embedding& shape() const noexcept { return shape_; }

  //! out [n, hidden] = the rows of `tokens`, summed over the group (g): the same on every rank.
  template <communicator Comm>
  void forward(cuda_context& ctx, Comm& tp, device_span<const std::int32_t> tokens, device_span<const float> table,
               device_span<float> out) const {
    detail::require_device_comm<Comm>();
    tensor::detail::check_group(shape_.name(), "forward", tp, shape_.parts());
    check(".forward", tokens.size(), table.size(), out.size(), "out");
    if (out.empty()) return;  // no tokens, or hidden = 0
    const auto range = shape_.vocab_range();
    detail::embedding_lookup_kernel<><<<nn::cuda::detail::grid_for(out.size()), nn::cuda::detail::block_size, 0, ctx.stream()>>>(
        tokens, table, out, shape_.hidden(), range.begin, range.end, shape_.vocab());
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    ctx.hand_to(tp.stream());
    tp.all_reduce(space_span<float, cuda_space>(out.data(), out.size()), reduce_op::sum);  // one rank holds each row
    ctx.order_after(tp.stream());
  }

  //! dtable (this rank's rows) += dout [n, hidden] of the tokens in its range, in order; dout
  //! is the same on every rank (g's backward), so nothing is communicated.
  template <communicator Comm>
  void backward(const cuda_context& ctx, Comm& tp, device_span<const std::int32_t> tokens, device_span<const float> dout,
                device_span<float> dtable) const {
    detail::require_device_comm<Comm>();
    tensor::detail::check_group(shape_.name(), "backward", tp, shape_.parts());
    check(".backward", tokens.size(), dtable.size(), dout.size(), "dout");
    if (tokens.empty() || shape_.hidden() == 0) return;
    const auto range = shape_.vocab_range();
    const std::size_t n = tokens.size(), rows = range.end - range.begin;
    TRIDENT_EXPECT(n < (std::size_t{1} << 31) && rows < (std::size_t{1} << 31), shape_.name(), ".backward: ", n, " tokens and ",
                   rows, " rows; expected fewer than 2^31 of each (CUB's item count)");
    sort_.reserve(n, rows);
    const cudaStream_t stream = ctx.stream();
    detail::embedding_keys_kernel<><<<nn::cuda::detail::grid_for(n), nn::cuda::detail::block_size, 0, stream>>>(
        tokens, range.begin, range.end, sort_.keys.data(), sort_.positions.data());
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    const int key_bits = sort_.key_bits;
    const int items = static_cast<int>(n);
    std::size_t temp = sort_.temp.size();
    TRIDENT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_.temp.data(), temp, sort_.keys.data(), sort_.sorted_keys.data(),
                                                       sort_.positions.data(), sort_.sorted_positions.data(), items, 0, key_bits,
                                                       stream));
    temp = sort_.temp.size();
    TRIDENT_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(sort_.temp.data(), temp, sort_.sorted_keys.data(), sort_.keys.data(),
                                                          sort_.lengths.data(), sort_.runs.data(), items, stream));
    temp = sort_.temp.size();
    TRIDENT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(sort_.temp.data(), temp, sort_.lengths.data(), sort_.starts.data(), items,
                                                     stream));
    // sort_.keys now holds each run's row.
    detail::embedding_grad_kernel<><<<nn::cuda::detail::grid_for(n * shape_.hidden()), nn::cuda::detail::block_size, 0, stream>>>(
        sort_.keys.data(), sort_.starts.data(), sort_.lengths.data(), sort_.runs.data(), sort_.sorted_positions.data(), dout, dtable,
        shape_.hidden(), rows, n);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }

 private:
  void check(const char* call, std::size_t tokens, std::size_t table, std::size_t rows, const char* rows_name) const {
    const std::string who = shape_.name() + call;
    const std::size_t hidden = shape_.hidden(), local = shape_.weight_sharding().local_numel();
    TRIDENT_EXPECT(table == local, who, ": this rank's table has ", table, " elements, expected [", shape_.vocab_range().size(),
                   ", ", hidden, "] = ", local);
    TRIDENT_EXPECT(rows == tokens * hidden, who, ": ", rows_name, " has ", rows, " elements, expected [", tokens, ", ", hidden,
                   "] = ", tokens * hidden);
  }

  // backward()'s sort of positions by token: buffers for `tokens` positions and CUB's scratch,
  // grown (never per call at one size) and kept.
  struct sort_buffers {
    std::size_t tokens = 0;
    int key_bits = 1;
    buffer<std::uint32_t, cuda_space> keys, sorted_keys, positions, sorted_positions, lengths, starts, runs;
    buffer<std::uint8_t, cuda_space> temp;

    void reserve(std::size_t n, std::size_t rows) {
      // Keys run from 0 to `rows` (the sentinel): the sort looks at that many bits only.
      key_bits = std::max(1, static_cast<int>(std::bit_width(static_cast<std::uint64_t>(rows))));
      if (n <= tokens) return;
      auto make = [&](buffer<std::uint32_t, cuda_space>& b, std::size_t count) { b = buffer<std::uint32_t, cuda_space>(count, mem_category::other); };
      make(keys, n);
      make(sorted_keys, n);
      make(positions, n);
      make(sorted_positions, n);
      make(lengths, n);
      make(starts, n);
      make(runs, 1);
      // CUB's scratch for the largest of its three calls (a host-side query: nothing runs).
      const int items = static_cast<int>(n);
      std::size_t sort_bytes = 0, encode_bytes = 0, scan_bytes = 0;
      TRIDENT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys.data(), sorted_keys.data(), positions.data(),
                                                         sorted_positions.data(), items, 0, 32));
      TRIDENT_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, encode_bytes, sorted_keys.data(), keys.data(), lengths.data(),
                                                            runs.data(), items));
      TRIDENT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, lengths.data(), starts.data(), items));
      temp = buffer<std::uint8_t, cuda_space>(std::max({sort_bytes, encode_bytes, scan_bytes, std::size_t{1}}), mem_category::other);
      tokens = n;
    }
  };

  tensor::vocab_parallel_embedding shape_;
  mutable sort_buffers sort_;
};

//! tensor::vocab_parallel_cross_entropy on the GPU (see the header comment). forward() keeps
//! each row's maximum and sum of exponentials in device memory for backward(): call them in
//! pairs, on the same context.
class vocab_parallel_cross_entropy {
 public:
  template <communicator Comm>
  vocab_parallel_cross_entropy(const Comm& tp, std::size_t vocab, std::string name = "vocab_parallel_cross_entropy")
      : shape_(tp, vocab, std::move(name)) {}

  const tensor::vocab_parallel_cross_entropy& shape() const noexcept { return shape_; }

  //! loss[0] (device memory, one float) = the mean over n rows, the same on every rank.
  //! logits: [n, vocab / t], this rank's columns.
  template <communicator Comm>
  void forward(cuda_context& ctx, Comm& tp, std::size_t n, device_span<const float> logits,
               device_span<const std::int32_t> targets, device_span<float> loss) {
    detail::require_device_comm<Comm>();
    tensor::detail::check_group(shape_.name(), "forward", tp, shape_.parts());
    const std::string who = shape_.name() + ".forward";
    check(who, n, logits.size(), targets.size());
    TRIDENT_EXPECT(loss.size() == 1, who, ": loss has ", loss.size(), " elements, expected 1");
    if (max_.size() != n) {  // sized once for a fixed batch
      max_ = buffer<float, cuda_space>(n, mem_category::activations);
      local_max_ = buffer<float, cuda_space>(n, mem_category::activations);
      sums_ = buffer<double, cuda_space>(2 * n, mem_category::activations);
    }
    const std::size_t local = shape_.vocab_range().size();
    const unsigned grid = detail::rows_grid(who, n);
    const auto block = nn::cuda::detail::block_size;
    detail::row_stats_kernel<><<<grid, block, 0, ctx.stream()>>>(logits, targets, local, max_.device_handle(),
                                                                  local_max_.device_handle(), sums_.device_handle(),
                                                                  shape_.vocab_range().begin, shape_.vocab());
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    ctx.hand_to(tp.stream());
    tp.all_reduce(space_span<float, cuda_space>(max_.data(), n), reduce_op::max);
    ctx.order_after(tp.stream());
    detail::rescale_sums_kernel<><<<nn::cuda::detail::grid_for(n), block, 0, ctx.stream()>>>(
        max_.device_handle(), local_max_.device_handle(), sums_.device_handle());
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    ctx.hand_to(tp.stream());
    tp.all_reduce(space_span<double, cuda_space>(sums_.data(), 2 * n), reduce_op::sum);  // sums and target logits, one call
    ctx.order_after(tp.stream());
    detail::mean_loss_kernel<><<<1, block, 0, ctx.stream()>>>(max_.device_handle(), sums_.device_handle(), loss);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }

  //! dlogits [n, vocab / t] = dloss / n (softmax - onehot(target)) on this rank's columns
  //! (overwritten; may alias logits), from the statistics of the last forward() over the same n
  //! rows.
  void backward(const cuda_context& ctx, std::size_t n, device_span<const float> logits, device_span<const std::int32_t> targets,
                device_span<float> dlogits, float dloss = 1.0f) const {
    backward_impl(ctx, n, logits, targets, dlogits, dloss);
  }
  //! The same written in bf16, each value the float one rounded: for an output head whose GEMMs
  //! run on bf16 operands (gemm_math::bf16), which would round it so (column_parallel_linear's
  //! backward takes it as it is). Half the bytes written, and no float copy to round afterwards.
  //! dlogits must not overlap logits.
  void backward(const cuda_context& ctx, std::size_t n, device_span<const float> logits, device_span<const std::int32_t> targets,
                device_span<trident::bf16> dlogits, float dloss = 1.0f) const {
    backward_impl(ctx, n, logits, targets, dlogits, dloss);
  }

 private:
  template <class Out>
  void backward_impl(const cuda_context& ctx, std::size_t n, device_span<const float> logits,
                     device_span<const std::int32_t> targets, device_span<Out> dlogits, float dloss) const {
    const std::string who = shape_.name() + ".backward";
    check(who, n, logits.size(), targets.size());
    TRIDENT_EXPECT(dlogits.size() == logits.size(), who, ": dlogits have ", dlogits.size(), " elements, expected [", n, ", ",
                   shape_.vocab_range().size(), "] = ", logits.size());
    TRIDENT_EXPECT(max_.size() == n, who, ": expected a forward() over the same ", n,
                   " rows first (it keeps each row's statistics); the last one had ", max_.size());
    if constexpr (!std::is_same_v<Out, float>) {  // rows are written in any order: an overlap would be read after it is written
      const auto in = reinterpret_cast<std::uintptr_t>(logits.data());
      const auto out = reinterpret_cast<std::uintptr_t>(dlogits.data());
      TRIDENT_EXPECT(out + dlogits.size() * sizeof(Out) <= in || in + logits.size() * sizeof(float) <= out, who,
                     ": bf16 dlogits must not overlap the logits");
    }
    const double scale = static_cast<double>(dloss) / static_cast<double>(n);
    detail::vocab_ce_backward_kernel<Out><<<detail::rows_grid(who, n), nn::cuda::detail::block_size, 0, ctx.stream()>>>(
        logits, targets, shape_.vocab_range().size(), max_.device_handle(), sums_.device_handle(), dlogits, scale,
        shape_.vocab_range().begin, shape_.vocab());
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  }

  void check(const std::string& who, std::size_t n, std::size_t logits, std::size_t targets) const {
    const std::size_t local = shape_.vocab_range().size();
    TRIDENT_EXPECT(n > 0, who, ": the mean over zero rows is undefined");
    TRIDENT_EXPECT(logits == n * local, who, ": this rank's logits have ", logits, " elements, expected [n=", n,
                   ", vocab/t=", local, "] = ", n * local);
    TRIDENT_EXPECT(targets == n, who, ": targets have ", targets, " elements, expected n = ", n);
  }

  tensor::vocab_parallel_cross_entropy shape_;
  buffer<float, cuda_space> max_;        // per row, over the whole vocabulary (last forward)
  buffer<float, cuda_space> local_max_;  // per row, over this rank's columns
  buffer<double, cuda_space> sums_;  // [sum of exp(logit - max) per row..., target logit per row...], all-reduced
};

}  // namespace trident::tensor::cuda
