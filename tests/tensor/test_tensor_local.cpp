// Tensor parallelism on thread ranks: the conjugate operators, and column- and row-parallel
// layers (an MLP) equal to the unsharded ones for t = 1, 2, 3, 4 and on a (t = 2, d = 2) grid.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "tensor/tensor_suite.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/process_grid.hpp"
#include "trident/core/half.hpp"
#include "trident/nn/linear.hpp"
#include "trident/parallel/tensor/linear.hpp"

using trident::local_comm;
using trident::local_world;

TEST_CASE("tensor regions: f, g and the sequence-parallel pair, forward and backward (threads, t = 1..4)") {
  for (int t = 1; t <= 4; ++t) local_world::run(t, [](local_comm& tp) { tensor_suite::regions(tp); });
}

TEST_CASE("tensor-parallel MLP = the unsharded MLP (threads, t = 1, 2, 3, 4)") {
  for (int t = 1; t <= 4; ++t) local_world::run(t, [](local_comm& tp) { tensor_suite::mlp_equals_serial(tp, 7); });
}

TEST_CASE("tensor-parallel MLP on the tensor axis of a (t = 2, d = 2) grid: each data group equals its own serial run") {
  local_world::run(4, [](local_comm& world) {
    trident::process_grid grid(world, 2, 1);
    tensor_suite::mlp_equals_serial(grid.tensor(), 100 + static_cast<std::uint64_t>(grid.coordinate(trident::grid_axis::data)));
  });
}

TEST_CASE("tensor-parallel layers: shapes that do not fit the group are usage errors naming the sizes (threads)") {
  for (int t = 1; t <= 4; ++t) local_world::run(t, [](local_comm& tp) { tensor_suite::bad_shapes(tp); });
}

TEST_CASE("vocabulary-parallel embedding and cross-entropy = the unsharded ones (threads, t = 1..4)") {
  for (int t = 1; t <= 4; ++t) local_world::run(t, [](local_comm& tp) { tensor_suite::vocab_equals_serial(tp, 21); });
}

TEST_CASE("tensor-parallel transformer block = the unsharded block (threads, t = 1, 2, 3, 4)") {
  for (int t = 1; t <= 4; ++t) local_world::run(t, [](local_comm& tp) { tensor_suite::block_equals_serial(tp, 300); });
  local_world::run(4, [](local_comm& world) {
    trident::process_grid grid(world, 2, 1);
    tensor_suite::block_equals_serial(grid.tensor(), 400 + static_cast<std::uint64_t>(grid.coordinate(trident::grid_axis::data)));
  });
}

TEST_CASE("sequence-parallel transformer block = the unsharded block (threads, t = 1, 2, 3, 4)") {
  for (int t = 1; t <= 4; ++t) local_world::run(t, [](local_comm& tp) { tensor_suite::block_equals_serial(tp, 500, true); });
}

TEST_CASE("activation bytes kept per block follow Korthikanti et al.'s counts (threads, t = 1, 2, 4; with and without "
          "sequence parallelism)") {
  for (int t : {1, 2, 4})
    for (bool sp : {false, true}) local_world::run(t, [sp](local_comm& tp) { tensor_suite::activation_bytes(tp, sp); });
}

TEST_CASE("recomputation (selective, full, both) trains bitwise as keeping everything, and keeps what the formulas say "
          "(threads, t = 1, 2, 4; with and without sequence parallelism)") {
  for (int t : {1, 2, 4})
    for (bool sp : {false, true}) local_world::run(t, [sp](local_comm& tp) { tensor_suite::recompute_equals_plain(tp, sp); });
}

TEST_CASE("bytes communicated per block and step equal the analytic volume (threads, t = 1, 2, 4)") {
  for (int t : {1, 2, 4})
    for (bool sp : {false, true}) local_world::run(t, [sp](local_comm& tp) { tensor_suite::block_traffic(tp, sp); });
}

TEST_CASE("transformer block: one seed gives one model whatever t is (threads, t = 1..4)") {
  for (int t = 1; t <= 4; ++t) local_world::run(t, [](local_comm& tp) { tensor_suite::init_independent_of_t(tp); });
}

TEST_CASE("transformer block: heads and features that t does not divide are named (threads)") {
  for (int t = 2; t <= 4; ++t) local_world::run(t, [](local_comm& tp) { tensor_suite::block_bad_shapes(tp); });
}

namespace {

// One block's forward and backward on this rank (t = tp's size) with attention `kind` (0: plain,
// 1: flash TF32 tiles, 2: flash bf16 tiles, both emulated on the host), and bf16 GEMM operands
// (emulated) or not: y, dx and the gradients, gathered over the group, and the size of the saved
// "probs".
struct block_run {
  std::vector<float> y, dx, grads;
  std::size_t saved_probs = 0;
};
block_run run_block(local_comm& tp, int kind, bool sp, bool bf16_gemm = false) {
  namespace tensor = trident::tensor;
  const tensor::block_config config{.seq = 70, .batch = 2, .hidden = 64, .heads = 2, .ffn = 128, .eps = 1e-5f,
                                    .sequence_parallel = sp, .flash_attention = kind > 0, .flash_bf16 = kind == 2,
                                    .bf16_gemm = bf16_gemm};
  const tensor::transformer_block block(tp, config, "h0");
  auto w = block.init_parameters(31, 1);
  std::vector<std::vector<float>> g;
  for (const auto& p : w) g.emplace_back(p.size(), 0.0f);
  const std::size_t numel = block.input_numel(), first = sp ? static_cast<std::size_t>(tp.rank()) * numel : 0;
  const auto x_all = tensor_suite::random(numel * (sp ? static_cast<std::size_t>(tp.size()) : 1), 32);
  const auto dy_all = tensor_suite::random(x_all.size(), 33);
  const std::vector<float> x(x_all.begin() + static_cast<std::ptrdiff_t>(first), x_all.begin() + static_cast<std::ptrdiff_t>(first + numel));
  const std::vector<float> dy(dy_all.begin() + static_cast<std::ptrdiff_t>(first), dy_all.begin() + static_cast<std::ptrdiff_t>(first + numel));
  std::vector<float> y(numel), dx(numel);
  auto saved = block.make_activations();
  block.forward(tp, tensor::block_tensors<const float>::over(w), x, y, saved);
  block.backward(tp, tensor::block_tensors<const float>::over(w), saved, dy, dx, tensor::block_tensors<float>::over(g));
  block_run r;
  r.saved_probs = saved.probs.size();
  auto gathered = [&](const std::vector<float>& mine) {  // every rank's part, in rank order
    std::vector<float> all(mine.size() * static_cast<std::size_t>(tp.size()));
    tp.all_gather(std::span<const float>(mine), std::span<float>(all));
    return all;
  };
  r.y = gathered(y);
  r.dx = gathered(dx);
  for (const auto& p : g) {
    const auto all = gathered(p);
    r.grads.insert(r.grads.end(), all.begin(), all.end());
  }
  return r;
}
// The largest difference relative to the largest element of want.
double apart(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return worst / scale;
}

}  // namespace

TEST_CASE("transformer block with flash attention on the host: the GPU tiles' emulation, within their rounding of the plain "
          "block, keeping lse instead of the probabilities (threads, t = 1, 2, with and without sequence parallelism)") {
  for (int t : {1, 2})
    for (bool sp : {false, true})
      local_world::run(t, [sp](local_comm& tp) {
        const auto plain = run_block(tp, 0, sp), tf32 = run_block(tp, 1, sp), bf16 = run_block(tp, 2, sp);
        const std::size_t lse = 2 * (2 / static_cast<std::size_t>(tp.size())) * 70;  // [batch, heads / t, seq]
        CHECK(plain.saved_probs == lse * 70);
        CHECK(tf32.saved_probs == lse);
        CHECK(bf16.saved_probs == lse);
        const double err[2][3] = {{apart(tf32.y, plain.y), apart(tf32.dx, plain.dx), apart(tf32.grads, plain.grads)},
                                  {apart(bf16.y, plain.y), apart(bf16.dx, plain.dx), apart(bf16.grads, plain.grads)}};
        const std::string where = sp ? ", sequence parallel" : "";
        INFO("t = ", tp.size(), where, ": TF32 tiles y ", err[0][0], ", dx ", err[0][1],
             ", grads ", err[0][2], "; bf16 tiles y ", err[1][0], ", dx ", err[1][1], ", grads ", err[1][2]);
        for (int i = 0; i < 3; ++i) {
          CHECK(err[0][i] > 0);  // the tiles ran, with their roundings (TF32: 2^-11, bf16: 2^-9 relative)
          CHECK(err[0][i] <= 2e-4);
          CHECK(err[1][i] > err[0][i]);
          CHECK(err[1][i] <= 1e-3);
        }
        if (tp.rank() == 0 && !sp) MESSAGE("t = ", tp.size(), ": TF32 tiles y ", err[0][0], ", dx ", err[0][1], ", grads ", err[0][2],
                                           "; bf16 tiles y ", err[1][0], ", dx ", err[1][1], ", grads ", err[1][2]);
      });
}

TEST_CASE("transformer block with bf16 GEMM operands on the host (gemm_math::bf16 emulated): within bf16's rounding of "
          "the plain block, further off than TF32 tiles; t = 2 = t = 1 to that rounding (threads, with and without sequence "
          "parallelism)") {
  std::vector<float> y1, dx1;  // t = 1's, for t = 2 to compare with
  for (int t : {1, 2})
    for (bool sp : {false, true})
      local_world::run(t, [&](local_comm& tp) {
        const auto plain = run_block(tp, 0, sp), tf32 = run_block(tp, 1, sp), bf16 = run_block(tp, 0, sp, true);
        const auto both = run_block(tp, 2, sp, true);  // bf16 tiles and GEMMs: the GPU's fastest block
        const double err[3] = {apart(bf16.y, plain.y), apart(bf16.dx, plain.dx), apart(bf16.grads, plain.grads)};
        const double tiles[3] = {apart(tf32.y, plain.y), apart(tf32.dx, plain.dx), apart(tf32.grads, plain.grads)};
        const std::string where = sp ? ", sequence parallel" : "";
        INFO("t = ", tp.size(), where, ": bf16 GEMMs y ", err[0], ", dx ", err[1], ", grads ", err[2], " (TF32 tiles ", tiles[0],
             ", ", tiles[1], ", ", tiles[2], "); with bf16 tiles y ", apart(both.y, plain.y));
        for (int i = 0; i < 3; ++i) {
          CHECK(err[i] > 4 * tiles[i]);  // the operands were rounded (2^-9 relative), more than TF32 tiles round theirs
          CHECK(err[i] <= 2e-3);         // measured 2.0e-4 (y), 1.7e-4 (dx), 6.3e-4 (grads)
        }
        CHECK(apart(both.y, plain.y) <= 2e-3);
        if (t == 1 && !sp && tp.rank() == 0) {
          y1 = bf16.y;
          dx1 = bf16.dx;
        }
        if (t == 2 && !sp) {
          // The same block split over two ranks: the same roundings of the same operands, the sums
          // in another order, so now and then an operand rounds the other way: bf16's rounding of
          // one element, not the plain block's distance. y and dx are whole on each rank (their
          // gathers hold two copies): rank 0's copy.
          const auto first = [](const std::vector<float>& v) { return std::vector<float>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2)); };
          const double y_apart = apart(first(bf16.y), y1), dx_apart = apart(first(bf16.dx), dx1);
          INFO("t = 2 from t = 1 with bf16 GEMMs: y ", y_apart, ", dx ", dx_apart, " (from the plain block: ", err[0], ", ", err[1], ")");
          CHECK(y_apart <= 1e-5);  // measured 5.8e-8
          CHECK(dx_apart <= 1e-5);
          CHECK(y_apart < err[0] / 4);
          if (tp.rank() == 0) MESSAGE("t = 2 from t = 1 with bf16 GEMMs: y ", y_apart, ", dx ", dx_apart);
        }
        if (tp.rank() == 0 && !sp) MESSAGE("t = ", tp.size(), ": bf16 GEMMs y ", err[0], ", dx ", err[1], ", grads ", err[2],
                                           " (TF32 tiles y ", tiles[0], ")");
      });
}

TEST_CASE("tensor-parallel linear layers with bf16_operands: the GEMMs of nn::linear on bf16-rounded copies, the bias and "
          "its gradient from the float values (threads, t = 1, 2)") {
  for (int t : {1, 2})
    local_world::run(t, [](local_comm& tp) {
      namespace tensor = trident::tensor;
      const std::size_t batch = 5, in = 12, out = 8;
      tensor::column_parallel_linear col(tp, in, out, "col");
      tensor::row_parallel_linear row(tp, out, in, "row");
      col.bf16_operands = row.bf16_operands = true;
      const std::size_t lo = col.local_out_features();
      const auto x = tensor_suite::random(batch * in, 41), wc = tensor_suite::random(lo * in, 42), bc = tensor_suite::random(lo, 43);
      const auto dyc = tensor_suite::random(batch * lo, 44), wr = tensor_suite::random(in * lo, 45), br = tensor_suite::random(in, 46);
      const auto dyr = tensor_suite::random(batch * in, 47);
      auto rounded = [](std::vector<float> v) {
        for (auto& e : v) e = static_cast<float>(trident::bf16(e));
        return v;
      };
      // Column: forward, then backward's weight gradients (no dx: no communication to reproduce).
      std::vector<float> y(batch * lo), want(batch * lo), dw(lo * in, 0.0f), db(lo, 0.0f), want_dw(lo * in, 0.0f), want_db(lo, 0.0f);
      col.forward(tp, batch, x, wc, bc, y);
      col.local().forward(batch, rounded(x), rounded(wc), bc, want);
      std::vector<float> plain(batch * lo), unused(lo * in, 0.0f), unused_row(in * lo, 0.0f);
      col.local().forward(batch, x, wc, bc, plain);
      CHECK(y == want);
      CHECK(y != plain);  // the rounding happened
      col.backward(tp, batch, x, wc, dyc, {}, dw, db);
      col.local().backward(batch, rounded(x), {}, rounded(dyc), {}, want_dw, {});
      col.local().backward(batch, x, {}, dyc, {}, unused, want_db);
      CHECK(dw == want_dw);
      CHECK(db == want_db);  // from the float dy
      // Row: x_r is this rank's slice of the column layer's output; forward sums over the group.
      std::vector<float> yr(batch * in), dx(batch * lo), dwr(in * lo, 0.0f), dbr(in, 0.0f);
      std::vector<float> want_dx(batch * lo), want_dwr(in * lo, 0.0f), want_dbr(in, 0.0f), part(batch * in);
      row.forward(tp, batch, y, wr, br, yr);
      row.local().forward(batch, rounded(y), rounded(wr), {}, part);
      tp.all_reduce(std::span<float>(part), trident::reduce_op::sum);
      trident::nn::detail::add_bias_rows(part.data(), br.data(), batch, in);
      CHECK(yr == part);
      row.backward(tp, batch, y, wr, dyr, dx, dwr, dbr);
      row.local().backward(batch, rounded(y), rounded(wr), rounded(dyr), want_dx, want_dwr, {});
      row.local().backward(batch, y, {}, dyr, {}, unused_row, want_dbr);
      CHECK(dx == want_dx);
      CHECK(dwr == want_dwr);
      CHECK(dbr == want_dbr);
    });
}

TEST_CASE("transformer block: flash attention's head_dim and tile choice are checked, naming them") {
  local_world::run(1, [](local_comm& tp) {
    namespace tensor = trident::tensor;
    tensor::transformer_block plain(tp, {.seq = 4, .batch = 1, .hidden = 64, .heads = 2}, "h0");
    const tensor::transformer_block flash(tp, {.seq = 4, .batch = 1, .hidden = 64, .heads = 2, .flash_attention = true}, "h1");
    CHECK_THROWS_WITH_AS(plain.share_backward_workspace(flash),
                         doctest::Contains("h0: share_backward_workspace with h1, a block of other sizes (or attention"),
                         trident::usage_error);
    CHECK_THROWS_WITH_AS(tensor::transformer_block(tp, {.seq = 4, .batch = 1, .hidden = 48, .heads = 1, .flash_attention = true}),
                         doctest::Contains("flash attention takes head_dim 32 or 64; hidden 48 over 1 heads is 48"),
                         trident::usage_error);
    CHECK_THROWS_WITH_AS(tensor::transformer_block(tp, {.seq = 4, .batch = 1, .hidden = 64, .heads = 2, .flash_bf16 = true}),
                         doctest::Contains("block_config::flash_bf16 chooses flash attention's tiles; expected "
                                           "flash_attention = true with it"),
                         trident::usage_error);
  });
}

namespace {

// Central differences of L = sum(out * weights) against the analytic gradient at `samples`
// coordinates of `at`: what shows that a backward is the forward's derivative (the block's
// equivalence tests compare t ranks with one, so they could not see a wrong formula).
template <class Loss>
double finite_difference_error(std::vector<float>& at, const std::vector<float>& analytic, Loss&& loss, std::size_t samples) {
  double worst = 0, scale = 0;
  for (float g : analytic) scale = std::max(scale, std::abs(static_cast<double>(g)));
  for (std::size_t s = 0; s < samples; ++s) {
    const std::size_t i = (s * 7919) % at.size();
    const float keep = at[i];
    const float e = 1e-2f;
    at[i] = keep + e;
    const double plus = loss();
    at[i] = keep - e;
    const double minus = loss();
    at[i] = keep;
    worst = std::max(worst, std::abs((plus - minus) / (2.0 * e) - analytic[i]));
  }
  return worst / std::max(scale, 1e-3);
}

}  // namespace

TEST_CASE("transformer block and RMSNorm: backward = the forward's finite differences (one rank)") {
  local_world::run(1, [](local_comm& tp) {
    const trident::tensor::block_config config{.seq = 3, .batch = 2, .hidden = 8, .heads = 2, .ffn = 16};
    const trident::tensor::transformer_block blk(tp, config, "b");
    const std::size_t n = blk.rows(), h = config.hidden;
    std::vector<std::vector<float>> w;
    std::uint64_t k = 50;
    for (const auto& p : blk.parameters()) {
      auto v = tensor_suite::random(p.split.numel(), ++k, 0.5f);
      if (p.name.find(".ln") != std::string::npos && p.name.find("weight") != std::string::npos)
        for (auto& e : v) e += 1.0f;
      w.push_back(std::move(v));
    }
    auto x = tensor_suite::random(n * h, 60), weights = tensor_suite::random(n * h, 61);
    auto view = [&] { return trident::tensor::block_tensors<const float>::over(w); };
    auto saved = blk.make_activations();
    auto loss = [&] {
      std::vector<float> y(n * h);
      blk.forward(tp, view(), x, y, saved);
      double l = 0;
      for (std::size_t i = 0; i < y.size(); ++i) l += static_cast<double>(y[i]) * weights[i];
      return l;
    };
    std::vector<float> y(n * h), dx(n * h);
    std::vector<std::vector<float>> g;
    for (const auto& v : w) g.emplace_back(v.size(), 0.0f);
    blk.forward(tp, view(), x, y, saved);
    blk.backward(tp, view(), saved, weights, dx, trident::tensor::block_tensors<float>::over(g));
    CHECK(finite_difference_error(x, dx, loss, 24) <= 1e-2);
    const auto params = blk.parameters();
    for (std::size_t i = 0; i < w.size(); ++i) {
      INFO(params[i].name);
      CHECK(finite_difference_error(w[i], g[i], loss, 12) <= 1e-2);
    }

    // RMSNorm is not in the block: on its own.
    const trident::nn::rms_norm norm{h, 1e-6f};
    auto gamma = tensor_suite::random(h, 70, 0.5f);
    for (auto& e : gamma) e += 1.0f;
    std::vector<float> out(n * h), rrms(n), dnx(n * h), dgamma(h, 0.0f);
    auto norm_loss = [&] {
      std::vector<float> o(n * h), r(n);
      norm.forward(n, x, gamma, o, r);
      double l = 0;
      for (std::size_t i = 0; i < o.size(); ++i) l += static_cast<double>(o[i]) * weights[i];
      return l;
    };
    norm.forward(n, x, gamma, out, rrms);
    norm.backward(n, x, gamma, rrms, weights, dnx, dgamma);
    CHECK(finite_difference_error(x, dnx, norm_loss, 24) <= 1e-2);
    CHECK(finite_difference_error(gamma, dgamma, norm_loss, 8) <= 1e-2);
  });
}

#include "tensor/zero_suite.hpp"

TEST_CASE("two tensor-parallel blocks with ZeRO-1 and ZeRO-3 on a (t = 2, d = 2) grid, clipping on = one rank, 20 steps") {
  local_world::run(4, [](local_comm& world) { tensor_zero_suite::zero_equals_serial<1>(world, 2); });
  local_world::run(4, [](local_comm& world) { tensor_zero_suite::zero_equals_serial<3>(world, 2); });
}

TEST_CASE("ZeRO with a model-parallel group that is not the grid's tensor axis is a usage error (threads)") {
  local_world::run(4, [](local_comm& world) { tensor_zero_suite::wrong_model_group(world); });
}
