#pragma once
// The vocabulary split over the tensor group (Megatron-LM): an embedding table and a
// cross-entropy over logits that no rank ever holds whole.
//
//   vocab_parallel_embedding       E [V, h] split by rows: each rank looks up the tokens in its
//                                  range, the others give zeros, and the rows are summed over
//                                  the group (g). Backward accumulates only local rows.
//   vocab_parallel_cross_entropy   logits [n, V/t] per rank (a column-parallel output head):
//                                  the row maximum is all-reduced (max), then the sums of
//                                  exponentials and the target's logit (sum, in double) in one
//                                  call, so the full [n, V] logits are never materialised. The
//                                  gradient needs no communication.
//
// Both on the host, over any host communicator, shapes only (the caller owns the memory), with
// the vocabulary divided by model/sharding's exact rule (a vocabulary that t does not divide
// is a usage_error naming the sizes; pad it, as Megatron does). The embedding equals the
// unsharded lookup bit for bit (the other ranks add exact zeros); the loss and its gradient
// equal nn::softmax_cross_entropy's within rounding (tests/tensor).
//
//   trident::tensor::vocab_parallel_embedding wte(tp, vocab, hidden, "wte");
//   wte.forward(tp, tokens, table_part, x);              // x: [n, hidden], the same on every rank
//   trident::tensor::vocab_parallel_cross_entropy ce(tp, vocab, "lm_head");
//   const float loss = ce.forward(tp, n, logits_part, targets);   // the mean over n rows
//   ce.backward(n, logits_part, targets, dlogits_part);           // this rank's columns
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/core/error.hpp"
#include "trident/model/sharding.hpp"
#include "trident/parallel/tensor/linear.hpp"
#include "trident/parallel/tensor/regions.hpp"

namespace trident::tensor {

namespace detail {

inline void check_token(const std::string& who, std::size_t i, std::int64_t token, std::size_t vocab) {
  TRIDENT_EXPECT(token >= 0 && static_cast<std::size_t>(token) < vocab, who, ": token ", token, " at position ", i,
                 " is outside the vocabulary [0, ", vocab, ")");
}

}  // namespace detail

//! out[i, :] = E[tokens[i], :], E [vocab, hidden] split by rows over the tensor group.
//!
//!   trident::tensor::vocab_parallel_embedding wte(grid.tensor(), 50304, 768, "wte");
//!   wte.vocab_range();   // [rank * 50304 / t, (rank + 1) * 50304 / t)
class vocab_parallel_embedding {
 public:
  template <communicator Comm>
  vocab_parallel_embedding(const Comm& tp, std::size_t vocab, std::size_t hidden, std::string name = "vocab_parallel_embedding")
      : name_(std::move(name)), parts_(tp.size()), hidden_(hidden),
        table_(sharding::split_exact({vocab, hidden}, 0, tp.size(), name_ + ".weight (vocabulary)")),
        range_(table_.owned(tp.rank())) {}  // any communicator: the CUDA layers keep their shapes here

  const std::string& name() const noexcept { return name_; }
  int parts() const noexcept { return parts_; }
  std::size_t vocab() const noexcept { return table_.shape()[0]; }
  std::size_t hidden() const noexcept { return hidden_; }
  //! The table [vocab, hidden] split along axis 0; this rank's rows are vocab_range().
  const sharding& weight_sharding() const noexcept { return table_; }
  index_range vocab_range() const noexcept { return range_; }

  //! out [n, hidden] = the rows of `tokens` (n of them), the same on every rank.
  template <communicator Comm>
  void forward(Comm& tp, std::span<const std::int32_t> tokens, std::span<const float> table, std::span<float> out) const {
    detail::require_host_comm<Comm>();
    detail::check_group(name_, "forward", tp, parts_);
    check(".forward", tokens, table.size(), out.size(), "out");
    lookup(tokens, table, out);
    reduce_from_region::forward(tp, out, out);  // one rank holds each row, the others add zeros
  }

  //! dtable (this rank's rows) += dout [n, hidden] of the tokens in its range, in order; dout
  //! is the same on every rank (g's backward), so nothing is communicated.
  template <communicator Comm>
  void backward(Comm& tp, std::span<const std::int32_t> tokens, std::span<const float> dout, std::span<float> dtable) const {
    detail::require_host_comm<Comm>();
    detail::check_group(name_, "backward", tp, parts_);
    check(".backward", tokens, dtable.size(), dout.size(), "dout");
    accumulate(tokens, dout, dtable);
  }

  //! Sequence parallelism: the rows go to sequence shards instead (reduce_scatter_to_sequence:
  //! tokens are sequence-major, n divisible by t): `whole` [n, hidden] is scratch, `out`
  //! [n / t, hidden] this rank's rows. The same values as forward()'s rows, bit for bit.
  template <communicator Comm>
  void forward_to_sequence(Comm& tp, std::span<const std::int32_t> tokens, std::span<const float> table, std::span<float> whole,
                           std::span<float> out) const {
    detail::require_host_comm<Comm>();
    detail::check_group(name_, "forward_to_sequence", tp, parts_);
    check(".forward_to_sequence", tokens, table.size(), whole.size(), "whole");
    check_shard(".forward_to_sequence", tokens.size(), out.size(), "out");
    lookup(tokens, table, whole);
    reduce_scatter_to_sequence::forward(tp, whole, out);
  }

  //! Its backward: dout [n / t, hidden] (this rank's rows) is all-gathered into `whole`
  //! (scratch, [n, hidden]), then the local rows of dtable accumulate as in backward().
  template <communicator Comm>
  void backward_from_sequence(Comm& tp, std::span<const std::int32_t> tokens, std::span<const float> dout,
                              std::span<float> whole, std::span<float> dtable) const {
    detail::require_host_comm<Comm>();
    detail::check_group(name_, "backward_from_sequence", tp, parts_);
    check(".backward_from_sequence", tokens, dtable.size(), whole.size(), "whole");
    check_shard(".backward_from_sequence", tokens.size(), dout.size(), "dout");
    reduce_scatter_to_sequence::backward(tp, dout, whole);
    accumulate(tokens, whole, dtable);
  }

 private:
  // The rows of the tokens in this rank's range, zeros for the others.
  void lookup(std::span<const std::int32_t> tokens, std::span<const float> table, std::span<float> out) const {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      float* row = out.data() + i * hidden_;
      const auto t = static_cast<std::size_t>(tokens[i]);
      if (t >= range_.begin && t < range_.end) {
        const float* src = table.data() + (t - range_.begin) * hidden_;
        for (std::size_t j = 0; j < hidden_; ++j) row[j] = src[j];
      } else {
        for (std::size_t j = 0; j < hidden_; ++j) row[j] = 0.0f;
      }
    }
  }
  void accumulate(std::span<const std::int32_t> tokens, std::span<const float> dout, std::span<float> dtable) const {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto t = static_cast<std::size_t>(tokens[i]);
      if (t < range_.begin || t >= range_.end) continue;
      float* dst = dtable.data() + (t - range_.begin) * hidden_;
      const float* src = dout.data() + i * hidden_;
      for (std::size_t j = 0; j < hidden_; ++j) dst[j] += src[j];
    }
  }
  void check_shard(const char* call, std::size_t n, std::size_t rows, const char* rows_name) const {
    const auto t = static_cast<std::size_t>(parts_);
    TRIDENT_EXPECT(n % t == 0 && rows == n / t * hidden_, name_, call, ": ", rows_name, " has ", rows, " elements, expected [",
                   n, " tokens / ", parts_, ", ", hidden_, "] (this rank's sequence shard; the tokens must divide over the "
                   "group)");
  }
  void check(const char* call, std::span<const std::int32_t> tokens, std::size_t table, std::size_t rows,
             const char* rows_name) const {
    const std::string who = name_ + call;
    TRIDENT_EXPECT(table == table_.local_numel(), who, ": this rank's table has ", table, " elements, expected [",
                   range_.size(), ", ", hidden_, "] = ", table_.local_numel());
    TRIDENT_EXPECT(rows == tokens.size() * hidden_, who, ": ", rows_name, " has ", rows, " elements, expected [",
                   tokens.size(), ", ", hidden_, "] = ", tokens.size() * hidden_);
    for (std::size_t i = 0; i < tokens.size(); ++i) detail::check_token(who, i, tokens[i], vocab());
  }

  std::string name_;
  int parts_;
  std::size_t hidden_;
  sharding table_;
  index_range range_;
};

//! The mean over n rows of -log softmax(logits)[target], logits [n, vocab] split by columns
//! over the tensor group; torch.nn.CrossEntropyLoss() on the whole logits (no weights, no
//! ignore_index, no label smoothing). forward() keeps each row's maximum and sum of
//! exponentials for backward(), which therefore needs no communication: call them in pairs.
class vocab_parallel_cross_entropy {
 public:
  template <communicator Comm>
  vocab_parallel_cross_entropy(const Comm& tp, std::size_t vocab, std::string name = "vocab_parallel_cross_entropy")
      : name_(std::move(name)), parts_(tp.size()), vocab_(vocab),
        columns_(sharding::split_exact({vocab}, 0, tp.size(), name_ + " (vocabulary)")),
        range_(columns_.owned(tp.rank())) {}  // any communicator: the CUDA layer keeps its shape here

  const std::string& name() const noexcept { return name_; }
  int parts() const noexcept { return parts_; }
  std::size_t vocab() const noexcept { return vocab_; }
  //! This rank's columns of the logits: [begin, end) of the vocabulary.
  index_range vocab_range() const noexcept { return range_; }

  //! The loss, the same on every rank. logits: [n, vocab / t], this rank's columns.
  template <communicator Comm>
  float forward(Comm& tp, std::size_t n, std::span<const float> logits, std::span<const std::int32_t> targets) {
    detail::require_host_comm<Comm>();
    detail::check_group(name_, "forward", tp, parts_);
    check(".forward", n, logits.size(), targets);
    const std::size_t local = range_.size();
    // Each row's maximum over the whole vocabulary.
    max_.assign(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) {
      const float* row = logits.data() + i * local;
      float m = row[0];
      for (std::size_t c = 1; c < local; ++c) m = row[c] > m ? row[c] : m;
      max_[i] = m;
    }
    tp.all_reduce(max_, reduce_op::max);
    // Then, in one call, the sums of exp(logit - max) and the target's logit (zero on the ranks
    // that do not hold it): [sums..., target logits...], in double.
    std::vector<double> sums(2 * n, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      const float* row = logits.data() + i * local;
      double s = 0;
      for (std::size_t c = 0; c < local; ++c) s += std::exp(static_cast<double>(row[c]) - max_[i]);
      sums[i] = s;
      const auto t = static_cast<std::size_t>(targets[i]);
      if (t >= range_.begin && t < range_.end) sums[n + i] = row[t - range_.begin];
    }
    tp.all_reduce(sums, reduce_op::sum);
    sum_.assign(sums.begin(), sums.begin() + static_cast<std::ptrdiff_t>(n));
    double total = 0;
    for (std::size_t i = 0; i < n; ++i) total += (static_cast<double>(max_[i]) + std::log(sum_[i])) - sums[n + i];
    return static_cast<float>(total / static_cast<double>(n));
  }

  //! dlogits [n, vocab / t] = dloss / n * (softmax - onehot(target)) on this rank's columns
  //! (overwritten), from the statistics of the last forward() on the same logits.
  void backward(std::size_t n, std::span<const float> logits, std::span<const std::int32_t> targets,
                std::span<float> dlogits, float dloss = 1.0f) const {
    check(".backward", n, logits.size(), targets);
    TRIDENT_EXPECT(dlogits.size() == logits.size(), name_, ".backward: dlogits have ", dlogits.size(), " elements, expected [",
                   n, ", ", range_.size(), "] = ", logits.size());
    TRIDENT_EXPECT(max_.size() == n && sum_.size() == n, name_, ".backward: expected a forward() over the same ", n,
                   " rows first (it keeps each row's statistics); the last one had ", max_.size());
    const std::size_t local = range_.size();
    const double scale = static_cast<double>(dloss) / static_cast<double>(n);
    for (std::size_t i = 0; i < n; ++i) {
      const float* row = logits.data() + i * local;
      float* grad = dlogits.data() + i * local;
      const auto t = static_cast<std::size_t>(targets[i]);
      for (std::size_t c = 0; c < local; ++c) {
        const double p = std::exp(static_cast<double>(row[c]) - max_[i]) / sum_[i];
        const double onehot = range_.begin + c == t ? 1.0 : 0.0;
        grad[c] = static_cast<float>(scale * (p - onehot));
      }
    }
  }

 private:
  void check(const char* call, std::size_t n, std::size_t logits, std::span<const std::int32_t> targets) const {
    const std::string who = name_ + call;
    TRIDENT_EXPECT(n > 0, who, ": the mean over zero rows is undefined");
    TRIDENT_EXPECT(logits == n * range_.size(), who, ": this rank's logits have ", logits, " elements, expected [n=", n,
                   ", vocab/t=", range_.size(), "] = ", n * range_.size());
    TRIDENT_EXPECT(targets.size() == n, who, ": targets have ", targets.size(), " elements, expected n = ", n);
    for (std::size_t i = 0; i < n; ++i) detail::check_token(who, i, targets[i], vocab_);
  }

  std::string name_;
  int parts_;
  std::size_t vocab_;
  sharding columns_;
  index_range range_;
  std::vector<float> max_;   // per row, over the whole vocabulary (last forward)
  std::vector<double> sum_;  // per row, of exp(logit - max) over the whole vocabulary
};

}  // namespace trident::tensor
