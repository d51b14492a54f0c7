#pragma once
// Tensor parallelism, one test body per behaviour, for every host backend (thread ranks in
// test_tensor_local.cpp, MPI in test_tensor_mpi.cpp). Each body runs on every rank of a tensor
// group (all call it together). The oracle is the unsharded computation, which every rank
// does for itself from the same seed: the full weights are generated whole and each rank takes
// its part (take_part), so the model is the same whatever t is.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/random.hpp"
#include "trident/comm/communicator.hpp"
#include "trident/core/memory_ledger.hpp"
#include "trident/model/sharding.hpp"
#include "trident/nn/activation.hpp"
#include "trident/nn/linear.hpp"
#include "trident/nn/loss.hpp"
#include "trident/nn/recompute.hpp"
#include "trident/parallel/tensor/block.hpp"
#include "trident/parallel/tensor/linear.hpp"
#include "trident/parallel/tensor/regions.hpp"
#include "trident/parallel/tensor/vocab.hpp"

namespace tensor_suite {

namespace tensor = trident::tensor;

//! n values in [-scale, scale) from a seed (splitmix64): the same on every rank.
inline std::vector<float> random(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  return test_support::splitmix_vector(n, seed, scale);
}

//! max |a - b| / max |b|: the relative error of a whole tensor (0 when both are 0); infinite
//! where one has a NaN and the other not (std::max would drop it).
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale == 0 ? diff : diff / scale;
}

inline std::vector<float> part_of(const trident::sharding& s, int rank, const std::vector<float>& full) {
  std::vector<float> local(s.local_numel());
  trident::take_part<float>(s, rank, full, local);
  return local;
}

//! The four conjugate operators do what they say, forward and backward.
template <class Comm>
void regions(Comm& tp) {
  const int n = tp.size(), r = tp.rank();
  const std::size_t k = 5;  // a sequence shard's elements
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  std::vector<float> whole_ref(k * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < whole_ref.size(); ++i) whole_ref[i] = static_cast<float>(i) - 3.0f;

  // f: forward the identity (in place and into another buffer), backward the sum over ranks.
  std::vector<float> x(k, 2.0f), y(k, 0.0f);
  tensor::copy_to_region::forward(tp, x, x);
  tensor::copy_to_region::forward(tp, x, y);
  CHECK(y == x);
  std::vector<float> dx(k, static_cast<float>(r + 1));
  tensor::copy_to_region::backward(tp, dx, dx);
  CHECK(dx == std::vector<float>(k, ranks_sum));
  std::vector<float> dx2(k, static_cast<float>(r + 1));
  tensor::copy_to_region::backward_async(tp, dx2, dx2).wait();
  CHECK(dx2 == dx);

  // g: forward the sum over ranks, backward the identity.
  std::vector<float> partial(k, static_cast<float>(r + 1)), out(k);
  tensor::reduce_from_region::forward(tp, partial, out);
  CHECK(out == std::vector<float>(k, ranks_sum));
  std::vector<float> dy(k, 4.0f), dpartial(k);
  tensor::reduce_from_region::backward(tp, dy, dpartial);
  CHECK(dpartial == dy);

  // Sequence parallelism: shards in rank order make the whole; the adjoint sums each shard.
  std::vector<float> shard(whole_ref.begin() + static_cast<std::ptrdiff_t>(k * static_cast<std::size_t>(r)),
                           whole_ref.begin() + static_cast<std::ptrdiff_t>(k * static_cast<std::size_t>(r + 1)));
  std::vector<float> whole(whole_ref.size());
  tensor::gather_from_sequence::forward(tp, shard, whole);
  CHECK(whole == whole_ref);
  std::vector<float> grad_whole(whole_ref.size()), grad_shard(k);
  for (std::size_t i = 0; i < grad_whole.size(); ++i) grad_whole[i] = static_cast<float>(r + 1) * whole_ref[i];
  tensor::gather_from_sequence::backward(tp, grad_whole, grad_shard);
  for (std::size_t i = 0; i < k; ++i) CHECK(grad_shard[i] == ranks_sum * shard[i]);

  std::vector<float> summed(k);
  tensor::reduce_scatter_to_sequence::forward(tp, grad_whole, summed);
  CHECK(summed == grad_shard);
  std::vector<float> regathered(whole_ref.size());
  tensor::reduce_scatter_to_sequence::backward(tp, shard, regathered);
  CHECK(regathered == whole_ref);

  static_assert(tensor::region_operator<tensor::copy_to_region, Comm> && tensor::region_operator<tensor::reduce_from_region, Comm> &&
                tensor::region_operator<tensor::gather_from_sequence, Comm> &&
                tensor::region_operator<tensor::reduce_scatter_to_sequence, Comm>);
}

//! What a tensor-parallel MLP computed, gathered for comparison.
struct mlp_result {
  std::vector<float> y, dx, dw1, db1, dw2, db2;  // dw1, db1, dw2: this rank's parts
};

//! x [batch, hidden] -> column-parallel fc1 (hidden -> ffn) -> GELU -> row-parallel fc2
//! (ffn -> hidden) -> y, then backward from dy: equals the unsharded MLP (within 1e-5 relative,
//! every output and every gradient), and overlapping the input gradient's all-reduce changes no
//! bit of the result.
template <class Comm>
void mlp_equals_serial(Comm& tp, std::uint64_t seed, std::size_t batch = 5, std::size_t hidden = 12, std::size_t ffn = 48) {
  const int r = tp.rank();
  const auto x = random(batch * hidden, seed);
  const auto w1 = random(ffn * hidden, seed + 1, 0.3f), b1 = random(ffn, seed + 2, 0.1f);
  const auto w2 = random(hidden * ffn, seed + 3, 0.3f), b2 = random(hidden, seed + 4, 0.1f);
  const auto dy = random(batch * hidden, seed + 5);

  // The unsharded reference.
  const trident::nn::linear fc1{hidden, ffn}, fc2{ffn, hidden};
  std::vector<float> h(batch * ffn), a(batch * ffn), y(batch * hidden);
  fc1.forward(batch, x, w1, b1, h);
  trident::nn::gelu::forward(h, a);
  fc2.forward(batch, a, w2, b2, y);
  std::vector<float> da(batch * ffn), dh(batch * ffn), dx(batch * hidden);
  std::vector<float> dw1(w1.size()), db1(b1.size()), dw2(w2.size()), db2(b2.size());
  fc2.backward(batch, a, w2, dy, da, dw2, db2);
  trident::nn::gelu::backward(h, da, dh);
  fc1.backward(batch, x, w1, dh, dx, dw1, db1);

  auto run = [&](bool overlap) {
    tensor::column_parallel_linear pfc1(tp, hidden, ffn, "fc1");
    const tensor::row_parallel_linear pfc2(tp, ffn, hidden, "fc2");
    pfc1.overlap = overlap;
    const auto w1r = part_of(pfc1.weight_sharding(), r, w1), b1r = part_of(pfc1.bias_sharding(), r, b1);
    const auto w2r = part_of(pfc2.weight_sharding(), r, w2);
    const std::size_t local = pfc1.local_out_features();
    CHECK(local == ffn / static_cast<std::size_t>(tp.size()));
    CHECK(pfc2.local_in_features() == local);
    std::vector<float> hr(batch * local), ar(batch * local);
    mlp_result out{std::vector<float>(batch * hidden), std::vector<float>(batch * hidden), std::vector<float>(w1r.size()),
                   std::vector<float>(b1r.size()), std::vector<float>(w2r.size()), std::vector<float>(b2.size())};
    pfc1.forward(tp, batch, x, w1r, b1r, hr);
    trident::nn::gelu::forward(hr, ar);
    pfc2.forward(tp, batch, ar, w2r, b2, out.y);
    std::vector<float> dar(batch * local), dhr(batch * local);
    pfc2.backward(tp, batch, ar, w2r, dy, dar, out.dw2, out.db2);
    trident::nn::gelu::backward(hr, dar, dhr);
    pfc1.backward(tp, batch, x, w1r, dhr, out.dx, out.dw1, out.db1);
    return out;
  };
  const mlp_result got = run(true);
  INFO("tensor-parallel MLP on rank ", r, " of ", tp.size());
  CHECK(relative_error(got.y, y) <= 1e-5);
  CHECK(relative_error(got.dx, dx) <= 1e-5);
  const tensor::column_parallel_linear shape1(tp, hidden, ffn, "fc1");
  const tensor::row_parallel_linear shape2(tp, ffn, hidden, "fc2");
  CHECK(relative_error(got.dw1, part_of(shape1.weight_sharding(), r, dw1)) <= 1e-5);
  CHECK(relative_error(got.db1, part_of(shape1.bias_sharding(), r, db1)) <= 1e-5);
  CHECK(relative_error(got.dw2, part_of(shape2.weight_sharding(), r, dw2)) <= 1e-5);
  CHECK(relative_error(got.db2, db2) <= 1e-5);

  const mlp_result serial_comm = run(false);
  CHECK(serial_comm.dx == got.dx);
  CHECK(serial_comm.dw1 == got.dw1);
  CHECK(serial_comm.y == got.y);
}

//! Shapes that do not fit the group are usage_errors naming the layer and the sizes.
template <class Comm>
void bad_shapes(Comm& tp) {
  const int n = tp.size();
  if (n > 1) {
    const std::size_t odd = static_cast<std::size_t>(n) * 3 + 1;
    const std::string column = "qkv.weight (output features): " + std::to_string(odd) + " elements along axis 0 do not "
                               "divide into " + std::to_string(n) + " equal parts";
    const std::string row = "proj.weight (input features): " + std::to_string(odd) + " elements along axis 1";
    CHECK_THROWS_WITH_AS(tensor::column_parallel_linear(tp, 8, odd, "qkv"), doctest::Contains(column.c_str()),
                         trident::usage_error);
    CHECK_THROWS_WITH_AS(tensor::row_parallel_linear(tp, odd, 8, "proj"), doctest::Contains(row.c_str()), trident::usage_error);
  }
  // A layer built for one group and run on another of another size.
  auto alone = tp.split(tp.rank(), 0);  // every rank its own group of 1
  const tensor::column_parallel_linear fc(alone, 4, 4 * static_cast<std::size_t>(n), "fc");
  std::vector<float> x(2 * 4), w(4 * 4 * static_cast<std::size_t>(n)), b(4 * static_cast<std::size_t>(n)),
      y(2 * 4 * static_cast<std::size_t>(n));
  if (n > 1) {
    const std::string group = "fc.forward: the tensor-parallel communicator has " + std::to_string(n) +
                              " ranks, but the layer was built for 1";
    CHECK_THROWS_WITH_AS(fc.forward(tp, 2, x, w, b, y), doctest::Contains(group.c_str()), trident::usage_error);
  }
  fc.forward(alone, 2, x, w, b, y);  // the right group
  // Spans of the wrong size name the layer and the expected shape.
  std::vector<float> short_w(w.size() - 1);
  CHECK_THROWS_WITH_AS(fc.forward(alone, 2, x, short_w, b, y), doctest::Contains("fc.forward: W has"), trident::usage_error);
}

//! The vocabulary-parallel embedding equals the unsharded lookup bit for bit (forward and the
//! table's gradient), and the vocabulary-parallel cross-entropy equals nn::softmax_cross_entropy
//! on the whole logits (loss and gradient within 1e-6 relative), which no rank holds.
template <class Comm>
void vocab_equals_serial(Comm& tp, std::uint64_t seed, std::size_t n = 12, std::size_t vocab = 24, std::size_t hidden = 5) {
  const int r = tp.rank();
  std::vector<std::int32_t> tokens(n), targets(n);
  const auto pick = random(2 * n, seed);
  for (std::size_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<std::int32_t>((pick[i] + 1.0f) * 0.5f * static_cast<float>(vocab)) % static_cast<std::int32_t>(vocab);
    targets[i] = static_cast<std::int32_t>((pick[n + i] + 1.0f) * 0.5f * static_cast<float>(vocab)) % static_cast<std::int32_t>(vocab);
  }
  tokens[1] = tokens[0];  // a repeated token: its gradient rows add up
  const auto table = random(vocab * hidden, seed + 1);
  const auto dout = random(n * hidden, seed + 2);

  // Serial lookup and its gradient.
  std::vector<float> x(n * hidden), dtable(vocab * hidden, 0.0f);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < hidden; ++j) {
      x[i * hidden + j] = table[static_cast<std::size_t>(tokens[i]) * hidden + j];
      dtable[static_cast<std::size_t>(tokens[i]) * hidden + j] += dout[i * hidden + j];
    }
  const tensor::vocab_parallel_embedding wte(tp, vocab, hidden, "wte");
  const auto part = part_of(wte.weight_sharding(), r, table);
  std::vector<float> got(n * hidden, -1.0f), dpart(part.size(), 0.0f);
  wte.forward(tp, tokens, part, got);
  CHECK(got == x);
  wte.backward(tp, tokens, dout, dpart);
  CHECK(dpart == part_of(wte.weight_sharding(), r, dtable));

  // Sequence parallelism: this rank's rows of the same lookup, and the same table gradient.
  if (n % static_cast<std::size_t>(tp.size()) == 0) {
    const std::size_t m = n / static_cast<std::size_t>(tp.size());
    std::vector<float> whole(n * hidden), shard(m * hidden), dshard_table(part.size(), 0.0f);
    wte.forward_to_sequence(tp, tokens, part, whole, shard);
    CHECK(shard == std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(r * m * hidden),
                                      x.begin() + static_cast<std::ptrdiff_t>((r + 1) * m * hidden)));
    const std::vector<float> dout_rows(dout.begin() + static_cast<std::ptrdiff_t>(r * m * hidden),
                                       dout.begin() + static_cast<std::ptrdiff_t>((r + 1) * m * hidden));
    wte.backward_from_sequence(tp, tokens, dout_rows, whole, dshard_table);
    CHECK(dshard_table == dpart);
  }

  // Cross-entropy over logits split by columns.
  const auto logits = random(n * vocab, seed + 3, 4.0f);
  const float loss = trident::nn::softmax_cross_entropy::forward(n, vocab, logits, targets);
  std::vector<float> dlogits(logits.size());
  trident::nn::softmax_cross_entropy::backward(n, vocab, logits, targets, dlogits, 0.5f);
  const auto columns = trident::sharding::split_exact({n, vocab}, 1, tp.size(), "logits");
  tensor::vocab_parallel_cross_entropy ce(tp, vocab, "lm_head");
  CHECK(ce.vocab_range().size() == vocab / static_cast<std::size_t>(tp.size()));
  const auto mine = part_of(columns, r, logits);
  const float got_loss = ce.forward(tp, n, mine, targets);
  INFO("vocabulary-parallel cross-entropy on rank ", r, " of ", tp.size(), ": ", got_loss, " vs ", loss);
  CHECK(std::abs(got_loss - loss) <= 1e-6 * std::abs(loss));
  std::vector<float> dmine(mine.size());
  ce.backward(n, mine, targets, dmine, 0.5f);
  CHECK(relative_error(dmine, part_of(columns, r, dlogits)) <= 1e-6);

  // Bad input: on every rank alike, before anything is communicated.
  auto bad_targets = targets;
  bad_targets[3] = static_cast<std::int32_t>(vocab);
  const std::string outside = "lm_head.forward: token " + std::to_string(vocab) + " at position 3 is outside the vocabulary";
  CHECK_THROWS_WITH_AS(ce.forward(tp, n, mine, bad_targets), doctest::Contains(outside.c_str()), trident::usage_error);
  const tensor::vocab_parallel_cross_entropy fresh(tp, vocab, "head");
  CHECK_THROWS_WITH_AS(fresh.backward(n, mine, targets, dmine), doctest::Contains("expected a forward() over the same"),
                       trident::usage_error);
  if (tp.size() > 1) {
    const std::size_t odd = 4 * static_cast<std::size_t>(tp.size()) + 1;
    const std::string message = "wte.weight (vocabulary): " + std::to_string(odd) + " elements along axis 0 do not divide";
    CHECK_THROWS_WITH_AS(tensor::vocab_parallel_embedding(tp, odd, hidden, "wte"), doctest::Contains(message.c_str()),
                         trident::usage_error);
  }
}

//! A pre-LayerNorm transformer block with t ranks equals the same block on one rank (the
//! unsharded one: every collective over a group of one is the identity): the output and the
//! input's and every parameter's gradient, within 1e-5 relative.
//! With sequence parallelism the parallel block takes and gives this rank's rows (seq / t
//! positions) of x, y, dx and dy.
template <class Comm>
void block_equals_serial(Comm& tp, std::uint64_t seed, bool sequence_parallel = false) {
  tensor::block_config config{.seq = 12, .batch = 2, .hidden = 24, .heads = 12, .ffn = 48};
  const int r = tp.rank();
  auto alone = tp.split(r, 0);
  const tensor::transformer_block serial(alone, config, "h0");
  config.sequence_parallel = sequence_parallel;
  const tensor::transformer_block parallel(tp, config, "h0");
  const std::size_t n = serial.rows(), h = config.hidden;

  // The full parameters from the seed (norm weights near 1), and each one's part on this rank.
  const auto specs = serial.parameters();
  REQUIRE(specs.size() == tensor::block_tensors<float>::count);
  std::vector<std::vector<float>> full, part;
  std::uint64_t k = seed;
  for (const auto& p : parallel.parameters()) {
    auto v = random(p.split.numel(), ++k, 0.3f);
    if (p.name.find(".ln") != std::string::npos && p.name.find("weight") != std::string::npos)
      for (auto& e : v) e += 1.0f;
    part.push_back(part_of(p.split, r, v));
    full.push_back(std::move(v));
  }
  auto zeros_like = [](const std::vector<std::vector<float>>& vs) {
    std::vector<std::vector<float>> z;
    for (const auto& v : vs) z.emplace_back(v.size(), 0.0f);
    return z;
  };
  const auto x = random(n * h, seed + 100), dy = random(n * h, seed + 101);

  std::vector<float> y_ref(n * h), dx_ref(n * h);
  auto grads_ref = zeros_like(full);
  auto saved_ref = serial.make_activations();
  serial.forward(alone, tensor::block_tensors<const float>::over(full), x, y_ref, saved_ref);
  serial.backward(alone, tensor::block_tensors<const float>::over(full), saved_ref, dy, dx_ref,
                  tensor::block_tensors<float>::over(grads_ref));

  // This rank's rows: all of them, or its sequence shard (rows are sequence-major).
  const std::size_t m = parallel.local_rows(), first = sequence_parallel ? static_cast<std::size_t>(r) * m : 0;
  auto rows_of = [&](const std::vector<float>& v) {
    return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(first * h),
                              v.begin() + static_cast<std::ptrdiff_t>((first + m) * h));
  };
  const auto x_mine = rows_of(x), dy_mine = rows_of(dy);
  std::vector<float> y(m * h), dx(m * h);
  auto grads = zeros_like(part);
  auto saved = parallel.make_activations();
  // A backward on activations no forward filled returned gradients of nothing, silently.
  CHECK_THROWS_WITH_AS(parallel.backward(tp, tensor::block_tensors<const float>::over(part), saved, dy_mine, dx,
                                         tensor::block_tensors<float>::over(grads)),
                       doctest::Contains("never filled by a forward"), trident::usage_error);
  parallel.forward(tp, tensor::block_tensors<const float>::over(part), x_mine, y, saved);
  parallel.backward(tp, tensor::block_tensors<const float>::over(part), saved, dy_mine, dx,
                    tensor::block_tensors<float>::over(grads));

  INFO("transformer block on rank ", r, " of ", tp.size(), sequence_parallel ? ", sequence parallel" : "");
  CHECK(relative_error(y, rows_of(y_ref)) <= 1e-5);
  CHECK(relative_error(dx, rows_of(dx_ref)) <= 1e-5);
  const auto params = parallel.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].name);
    CHECK(relative_error(grads[i], part_of(params[i].split, r, grads_ref[i])) <= 1e-5);
  }
}

//! The activation bytes a rank keeps per block, measured by its memory ledger, against
//! Korthikanti et al.'s per-layer counts (their Table 2) for this block: fp32 (4 bytes, where
//! they count 2) and without dropout (their masks, 2sbh bytes, and the dropout output of the
//! softmax, 2as^2b bytes, do not exist here), i.e. in elements
//!   no parallelism      16 sbh + as^2 b            (their 34 sbh + 5 as^2 b bytes)
//!   tensor parallelism  (4 + 12/t) sbh + as^2 b/t  (their sbh (10 + 24/t) + 5 as^2 b/t)
//!   + sequence par.     (16 sbh + as^2 b) / t      (their (34 sbh + 5 as^2 b) / t)
//! counting: the input of each LayerNorm (x, the residual sum), the QKV input (the first norm's
//! output), Q K V, the softmax, the output projection's input, fc1's input (the second norm's
//! output), GELU's input and output. Beside them the norms keep 2 floats per row each (mean,
//! 1/std), which the paper leaves out (4 sb / t' floats). Exact equality, printed side by side.
template <class Comm>
void activation_bytes(Comm& tp, bool sequence_parallel) {
  const tensor::block_config config{.seq = 12, .batch = 2, .hidden = 24, .heads = 4, .ffn = 96, .eps = 1e-5f,
                                    .sequence_parallel = sequence_parallel};
  const tensor::transformer_block block(tp, config, "h0");
  const auto ledger = trident::current_ledger();
  const std::size_t before = ledger->bytes(trident::space_kind::host, trident::mem_category::activations);
  const auto saved = block.make_activations();
  const std::size_t measured = ledger->bytes(trident::space_kind::host, trident::mem_category::activations) - before;
  const double t = tp.size(), s = static_cast<double>(config.seq), b = static_cast<double>(config.batch),
               h = static_cast<double>(config.hidden), a = static_cast<double>(config.heads);
  const double sbh = s * b * h, as2b = a * s * s * b;
  double elements = 0;
  if (t == 1) elements = 16 * sbh + as2b;
  else if (!sequence_parallel) elements = (4 + 12 / t) * sbh + as2b / t;
  else elements = (16 * sbh + as2b) / t;
  const double norm_stats = 4 * s * b / (sequence_parallel ? t : 1.0);
  const double formula = 4 * (elements + norm_stats);
  const std::string report = std::string("activations kept per block, t = ") + std::to_string(tp.size()) +
            (sequence_parallel ? " with" : " without") + " sequence parallelism: measured " + std::to_string(measured) +
            " B, formula " + std::to_string(static_cast<long>(formula)) + " B (Korthikanti's elements " +
            std::to_string(static_cast<long>(elements)) + " x 4 B, + norm statistics " +
            std::to_string(static_cast<long>(norm_stats)) + " x 4 B)";
  if (tp.rank() == 0) MESSAGE(report);
  CHECK(static_cast<double>(measured) == formula);
}

//! Activation recomputation (issue 14): a stack of `layers` blocks, forward through all, then
//! backward through all, with each block's activations kept (none), only its attention
//! probabilities recomputed (selective), only its input kept (full: nn::checkpointed), or
//! both. The outputs, input gradients and parameter gradients must be bitwise those of keeping
//! everything. What each keeps is measured by the ledger (the peak of mem_category::
//! activations over the whole forward and backward) against the formulas of activation_bytes:
//! per block, in floats, with K = the kept elements of one block (activation_bytes' formula)
//!   none       layers x K
//!   selective  layers x (K - as^2b/t)  + one workspace: as^2b/t (the recomputed probabilities)
//!   full       layers x sbh/t'         + one workspace: K + sbh/t' (a block's activations and
//!              output), where t' = t with sequence parallelism, else 1
//! with s, b, h, a, t as in activation_bytes.
enum class recompute { none, selective, full, full_selective };
inline const char* name_of(recompute r) {
  switch (r) {
    case recompute::none: return "none";
    case recompute::selective: return "selective";
    case recompute::full: return "full";
    case recompute::full_selective: return "full + selective";
  }
  return "?";
}

struct stack_result {
  std::vector<float> y, dx;
  std::vector<std::vector<float>> grads;  // per block, per parameter
  std::size_t peak_activation_bytes = 0;
};

template <class Comm>
stack_result run_stack(Comm& tp, recompute mode, bool sequence_parallel, int layers, std::uint64_t seed) {
  const bool selective = mode == recompute::selective || mode == recompute::full_selective;
  const bool full = mode == recompute::full || mode == recompute::full_selective;
  const tensor::block_config config{.seq = 12, .batch = 2, .hidden = 24, .heads = 4, .ffn = 96, .eps = 1e-5f,
                                    .sequence_parallel = sequence_parallel, .selective_recompute = selective};
  // From here on: the blocks' selective workspace is activation memory too.
  const auto ledger = trident::current_ledger();
  const std::size_t before = ledger->bytes(trident::space_kind::host, trident::mem_category::activations);
  ledger->reset_peaks();
  std::vector<tensor::transformer_block> blocks;
  for (int l = 0; l < layers; ++l) {
    std::string name = "h";  // not "h" + to_string: GCC 12's -Wrestrict misfires on it at -O3
    name += std::to_string(l);
    blocks.emplace_back(tp, config, name);
    if (selective && l > 0) blocks.back().share_attention_workspace(blocks.front());
  }
  std::vector<std::vector<std::vector<float>>> weights, grads;
  for (int l = 0; l < layers; ++l) {
    weights.push_back(blocks[static_cast<std::size_t>(l)].init_parameters(seed + static_cast<std::uint64_t>(l), layers));
    std::vector<std::vector<float>> g;
    for (const auto& w : weights.back()) g.emplace_back(w.size(), 0.0f);
    grads.push_back(std::move(g));
  }
  const std::size_t numel = blocks.front().input_numel();
  // The same input and output gradient on every rank of the group (each takes its rows).
  const std::size_t first = sequence_parallel ? static_cast<std::size_t>(tp.rank()) * numel : 0;
  const auto x_all = random(numel * static_cast<std::size_t>(sequence_parallel ? tp.size() : 1), seed + 100);
  const auto dy_all = random(x_all.size(), seed + 101);
  const std::vector<float> x(x_all.begin() + static_cast<std::ptrdiff_t>(first), x_all.begin() + static_cast<std::ptrdiff_t>(first + numel));
  const std::vector<float> dy(dy_all.begin() + static_cast<std::ptrdiff_t>(first), dy_all.begin() + static_cast<std::ptrdiff_t>(first + numel));
  auto w_of = [&](int l) {
    std::array<std::span<const float>, tensor::block_tensors<float>::count> s;
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = weights[static_cast<std::size_t>(l)][i];
    return tensor::block_tensors<const float>::from(s);
  };
  auto g_of = [&](int l) { return tensor::block_tensors<float>::over(grads[static_cast<std::size_t>(l)]); };

  stack_result out;
  {
    std::vector<float> cur = x, next(numel), g = dy, dx(numel);
    if (full) {
      using ckpt = trident::nn::checkpointed<tensor::transformer_block>;
      const auto ws = ckpt::make_workspace(blocks.front());
      std::vector<ckpt> stack;
      std::vector<ckpt::activations> kept;
      for (const auto& b : blocks) {
        stack.emplace_back(b, ws);
        kept.push_back(stack.back().make_activations());
      }
      for (int l = 0; l < layers; ++l, std::swap(cur, next)) stack[static_cast<std::size_t>(l)].forward(tp, w_of(l), cur, next, kept[static_cast<std::size_t>(l)]);
      for (int l = layers; l-- > 0; std::swap(g, dx)) stack[static_cast<std::size_t>(l)].backward(tp, w_of(l), kept[static_cast<std::size_t>(l)], g, dx, g_of(l));
    } else {
      std::vector<tensor::block_activations> kept;
      for (const auto& b : blocks) kept.push_back(b.make_activations());
      for (int l = 0; l < layers; ++l, std::swap(cur, next)) blocks[static_cast<std::size_t>(l)].forward(tp, w_of(l), cur, next, kept[static_cast<std::size_t>(l)]);
      for (int l = layers; l-- > 0; std::swap(g, dx)) blocks[static_cast<std::size_t>(l)].backward(tp, w_of(l), kept[static_cast<std::size_t>(l)], g, dx, g_of(l));
    }
    out.y = cur;
    out.dx = g;
  }
  // The selective workspace lives with the blocks: it is part of the peak.
  out.peak_activation_bytes = ledger->peak(trident::space_kind::host, trident::mem_category::activations) - before;
  for (auto& per_block : grads)
    for (auto& v : per_block) out.grads.push_back(std::move(v));
  return out;
}

template <class Comm>
void recompute_equals_plain(Comm& tp, bool sequence_parallel) {
  constexpr int layers = 3;
  const auto plain = run_stack(tp, recompute::none, sequence_parallel, layers, 900);
  const double t = tp.size(), s = 12, b = 2, h = 24, a = 4;
  const double sbh = s * b * h, as2b = a * s * s * b, tp_rows = sequence_parallel ? t : 1.0;
  const double kept = (t == 1 ? 16 * sbh + as2b : sequence_parallel ? (16 * sbh + as2b) / t : (4 + 12 / t) * sbh + as2b / t) +
                      4 * s * b / tp_rows;  // activation_bytes' formula with the norms' statistics
  const double input = sbh / tp_rows;
  for (const auto mode : {recompute::selective, recompute::full, recompute::full_selective}) {
    const auto r = run_stack(tp, mode, sequence_parallel, layers, 900);
    const std::string where = std::string("recompute ") + name_of(mode) + ", t = " + std::to_string(tp.size()) +
                              (sequence_parallel ? ", sequence parallel" : "");
    INFO(where);
    CHECK(r.y == plain.y);  // bitwise
    CHECK(r.dx == plain.dx);
    CHECK(r.grads == plain.grads);
    double floats = 0;
    if (mode == recompute::selective) floats = layers * (kept - as2b / t) + as2b / t;
    else if (mode == recompute::full) floats = layers * input + kept + input;
    else floats = layers * input + (kept - as2b / t) + input + as2b / t;
    const std::string report = where + ", " + std::to_string(layers) + " blocks, activation bytes at peak: " +
                               std::to_string(r.peak_activation_bytes) + " (formula " + std::to_string(static_cast<long>(4 * floats)) +
                               "), keeping everything " + std::to_string(plain.peak_activation_bytes);
    if (tp.rank() == 0) MESSAGE(report);
    CHECK(static_cast<double>(r.peak_activation_bytes) == 4 * floats);
  }
  CHECK(static_cast<double>(plain.peak_activation_bytes) == 4 * layers * kept);
}

//! Bytes communicated per block and step (forward + backward), counted by the communicator,
//! against the analytic volume. Without sequence parallelism Megatron's four all-reduces of
//! [seq x batch, hidden]; with it the same volume as four reduce-scatters and four all-gathers
//! (an all-reduce is one of each), plus what this block adds on purpose: two all-gathers that
//! fetch the norms' outputs again in backward (Korthikanti et al. 4.2.2: memory / t for it) and
//! one all-reduce of the norms' 4 x hidden weight gradients. Nothing else moves.
template <class Comm>
void block_traffic(Comm& tp, bool sequence_parallel) {
  const tensor::block_config config{.seq = 12, .batch = 2, .hidden = 24, .heads = 4, .ffn = 96, .eps = 1e-5f,
                                    .sequence_parallel = sequence_parallel};
  const tensor::transformer_block block(tp, config, "h0");
  std::vector<std::vector<float>> w, g;
  std::uint64_t k = 700;
  for (const auto& p : block.parameters()) {
    w.push_back(random(p.split.local_numel(), ++k, 0.3f));
    g.emplace_back(p.split.local_numel(), 0.0f);
  }
  const auto ws = tensor::block_tensors<const float>::over(w);
  const auto gs = tensor::block_tensors<float>::over(g);
  const std::size_t m = block.local_rows() * config.hidden;
  const auto x = random(m, 710), dy = random(m, 711);
  std::vector<float> y(m), dx(m);
  auto saved = block.make_activations();
  tp.reset_traffic();
  block.forward(tp, ws, x, y, saved);
  block.backward(tp, ws, saved, dy, dx, gs);
  using count = trident::traffic_counters::count;
  const auto& t = tp.traffic();
  const std::uint64_t sbh = config.seq * config.batch * config.hidden * sizeof(float);
  const std::uint64_t norms = 4 * config.hidden * sizeof(float);
  if (!sequence_parallel) {
    CHECK(t.of(trident::collective::all_reduce) == count{4, 4 * sbh});
    CHECK(t.total() == count{4, 4 * sbh});
  } else {
    CHECK(t.of(trident::collective::reduce_scatter) == count{4, 4 * sbh});
    CHECK(t.of(trident::collective::all_gather) == count{4 + 2, (4 + 2) * sbh});
    CHECK(t.of(trident::collective::all_reduce) == count{1, norms});
    CHECK(t.total() == count{11, 10 * sbh + norms});
  }
  const std::string report = std::string("bytes per block and step, t = ") + std::to_string(tp.size()) +
                             (sequence_parallel ? " with" : " without") + " sequence parallelism: counted " +
                             std::to_string(t.total().bytes) + " B in " + std::to_string(t.total().calls) + " calls; " +
                             (sequence_parallel ? "analytic 4 reduce-scatters + 4 all-gathers of sbh = " + std::to_string(8 * sbh) +
                                                      " B, + 2 re-gathers (" + std::to_string(2 * sbh) + " B) + the norms' "
                                                      "gradients (" + std::to_string(norms) + " B)"
                                                : "analytic 4 all-reduces of sbh = " + std::to_string(4 * sbh) + " B");
  if (tp.rank() == 0) MESSAGE(report);
}

//! One seed, one model: the block's initialisation on t ranks is the parts of the one on a
//! single rank, and it has GPT-2's shape (norm weights 1, biases 0, weights with std 0.02).
template <class Comm>
void init_independent_of_t(Comm& tp) {
  const tensor::block_config config{.seq = 4, .batch = 1, .hidden = 24, .heads = 12, .ffn = 96};
  auto alone = tp.split(tp.rank(), 0);
  const tensor::transformer_block whole(alone, config, "h0"), parted(tp, config, "h0");
  const auto full = whole.init_parameters(99, 12), mine = parted.init_parameters(99, 12);
  const auto params = parted.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].name);
    CHECK(mine[i] == part_of(params[i].split, tp.rank(), full[i]));
  }
  CHECK(full[0] == std::vector<float>(config.hidden, 1.0f));   // ln1.weight
  CHECK(full[1] == std::vector<float>(config.hidden, 0.0f));   // ln1.bias
  double squares = 0;
  for (float v : full[8]) squares += static_cast<double>(v) * v;  // fc1.weight
  CHECK(std::abs(std::sqrt(squares / static_cast<double>(full[8].size())) - 0.02) < 0.002);
}

//! Heads, MLP features or a fused weight that t does not divide are named as such.
template <class Comm>
void block_bad_shapes(Comm& tp) {
  const int t = tp.size();
  if (t < 2) return;
  const std::string heads = "h0: " + std::to_string(2 * t + 1) + " attention heads do not divide over a tensor-parallel group of " +
                            std::to_string(t);
  const std::size_t hd = 2, odd_heads = 2 * static_cast<std::size_t>(t) + 1;
  CHECK_THROWS_WITH_AS(tensor::transformer_block(tp, {.seq = 2, .batch = 1, .hidden = odd_heads * hd, .heads = odd_heads}, "h0"),
                       doctest::Contains(heads.c_str()), trident::usage_error);
  const std::string ffn = "h0: the MLP's " + std::to_string(4 * t + 1) + " features do not divide";
  CHECK_THROWS_WITH_AS(tensor::transformer_block(tp, {.seq = 2, .batch = 1, .hidden = 4 * static_cast<std::size_t>(t),
                                                      .heads = static_cast<std::size_t>(t), .ffn = 4 * static_cast<std::size_t>(t) + 1},
                                                 "h0"),
                       doctest::Contains(ffn.c_str()), trident::usage_error);
}

}  // namespace tensor_suite
