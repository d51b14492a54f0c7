// Tensor parallelism on the GPU over NCCL (mpirun -np 2 or 4: ranks share GPU 0, told apart by
// NCCL_HOSTID), each against the unsharded computation on the host, which every rank does for
// itself: an MLP (column-parallel fc1 -> GELU -> row-parallel fc2); the vocabulary-parallel
// embedding and cross-entropy; a whole pre-LayerNorm transformer block (with and without
// selective recomputation and sequence parallelism), forward and backward. Skips (77) without a device, like the other
// NCCL tests.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "support/nccl_mpi_main.hpp"
#include "tensor/tensor_suite.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/exec/cuda/stream.hpp"
#include "trident/nn/cuda/cublas.hpp"
#include "trident/nn/cuda/layers.cuh"
#include "trident/comm/local.hpp"
#include "trident/parallel/tensor/cuda/block.cuh"
#include "trident/parallel/tensor/cuda/linear.cuh"
#include "trident/parallel/tensor/cuda/vocab.cuh"

namespace {

std::optional<trident::nccl_comm> world;

template <class T>
trident::buffer<T, trident::cuda_space> on_device(const std::vector<T>& host) {
  trident::buffer<T, trident::cuda_space> b(host.size());
  trident::copy(std::span<const T>(host), b);
  return b;
}
trident::buffer<float, trident::cuda_space> zeros(std::size_t n) {
  trident::buffer<float, trident::cuda_space> b(n);
  trident::fill_zero(b);
  return b;
}
std::vector<float> on_host(const trident::buffer<float, trident::cuda_space>& b) { return trident::to_vector(b); }

void mlp(bool overlap) {
  auto& tp = *world;
  const int r = tp.rank();
  const std::size_t batch = 6, hidden = 16, ffn = 48;  // ffn divides over t = 2, 3, 4
  const auto x = tensor_suite::random(batch * hidden, 7);
  const auto w1 = tensor_suite::random(ffn * hidden, 8, 0.3f), b1 = tensor_suite::random(ffn, 9, 0.1f);
  const auto w2 = tensor_suite::random(hidden * ffn, 10, 0.3f), b2 = tensor_suite::random(hidden, 11, 0.1f);
  const auto dy = tensor_suite::random(batch * hidden, 12);

  // The unsharded MLP on the host.
  const trident::nn::linear fc1{hidden, ffn}, fc2{ffn, hidden};
  std::vector<float> h(batch * ffn), a(batch * ffn), y(batch * hidden), da(batch * ffn), dh(batch * ffn), dx(batch * hidden);
  std::vector<float> dw1(w1.size()), db1(b1.size()), dw2(w2.size()), db2(b2.size());
  fc1.forward(batch, x, w1, b1, h);
  trident::nn::gelu::forward(h, a);
  fc2.forward(batch, a, w2, b2, y);
  fc2.backward(batch, a, w2, dy, da, dw2, db2);
  trident::nn::gelu::backward(h, da, dh);
  fc1.backward(batch, x, w1, dh, dx, dw1, db1);

  // The same on the GPU, each rank with its parts.
  trident::cuda_context ctx;
  trident::nn::cublas_handle blas;
  trident::tensor::cuda::column_parallel_linear pfc1(tp, hidden, ffn, "fc1");
  const trident::tensor::cuda::row_parallel_linear pfc2(tp, ffn, hidden, "fc2");
  pfc1.overlap = overlap;
  const auto& s1 = pfc1.shape();
  const auto& s2 = pfc2.shape();
  const std::size_t local = s1.local_out_features();
  auto d_x = on_device(x), d_dy = on_device(dy);
  auto d_w1 = on_device(tensor_suite::part_of(s1.weight_sharding(), r, w1));
  auto d_b1 = on_device(tensor_suite::part_of(s1.bias_sharding(), r, b1));
  auto d_w2 = on_device(tensor_suite::part_of(s2.weight_sharding(), r, w2)), d_b2 = on_device(b2);
  auto d_h = zeros(batch * local), d_a = zeros(batch * local), d_y = zeros(batch * hidden);
  auto d_da = zeros(batch * local), d_dh = zeros(batch * local), d_dx = zeros(batch * hidden);
  auto d_dw1 = zeros(d_w1.size()), d_db1 = zeros(d_b1.size()), d_dw2 = zeros(d_w2.size()), d_db2 = zeros(b2.size());
  // The uploads and clears above ran on the legacy stream; the layers run on ctx's and tp's.
  TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
  pfc1.forward(ctx, blas, tp, batch, d_x.device_handle(), d_w1.device_handle(), d_b1.device_handle(), d_h.device_handle());
  trident::nn::cuda::activation_forward<trident::nn::gelu>(d_h.device_handle(), d_a.device_handle(), ctx.stream());
  pfc2.forward(ctx, blas, tp, batch, d_a.device_handle(), d_w2.device_handle(), d_b2.device_handle(), d_y.device_handle());
  pfc2.backward(ctx, blas, tp, batch, d_a.device_handle(), d_w2.device_handle(), d_dy.device_handle(), d_da.device_handle(),
                d_dw2.device_handle(), d_db2.device_handle());
  trident::nn::cuda::activation_backward<trident::nn::gelu>(d_h.device_handle(), d_da.device_handle(), d_dh.device_handle(),
                                                            ctx.stream());
  pfc1.backward(ctx, blas, tp, batch, d_x.device_handle(), d_w1.device_handle(), d_dh.device_handle(), d_dx.device_handle(),
                d_dw1.device_handle(), d_db1.device_handle());
  ctx.synchronize();

  INFO("tensor-parallel MLP on NCCL rank ", r, " of ", tp.size(), overlap ? ", overlap" : "");
  CHECK(tensor_suite::relative_error(on_host(d_y), y) <= 1e-5);
  CHECK(tensor_suite::relative_error(on_host(d_dx), dx) <= 1e-5);
  CHECK(tensor_suite::relative_error(on_host(d_dw1), tensor_suite::part_of(s1.weight_sharding(), r, dw1)) <= 1e-5);
  CHECK(tensor_suite::relative_error(on_host(d_db1), tensor_suite::part_of(s1.bias_sharding(), r, db1)) <= 1e-5);
  CHECK(tensor_suite::relative_error(on_host(d_dw2), tensor_suite::part_of(s2.weight_sharding(), r, dw2)) <= 1e-5);
  CHECK(tensor_suite::relative_error(on_host(d_db2), db2) <= 1e-5);
}

// Under bf16 GEMMs the layers take an input already in bf16 (its producer rounded it): the same
// bits as the float input that rounds to it, forward and backward (the column layer's all-reduce
// of dx overlapped with its weight gradient, and not), and in no other math.
void bf16_inputs() {
  auto& tp = *world;
  const int r = tp.rank();
  const std::size_t batch = 6, hidden = 16, ffn = 48;
  trident::cuda_context ctx;
  trident::nn::cublas_handle blas;
  trident::nn::cuda::use_bf16_gemm(blas);
  trident::tensor::cuda::column_parallel_linear fc1(tp, hidden, ffn, "fc1");
  const trident::tensor::cuda::row_parallel_linear fc2(tp, ffn, hidden, "fc2");
  const std::size_t local = fc1.shape().local_out_features();
  const auto x = tensor_suite::random(batch * hidden, 61), a = tensor_suite::random(batch * local, 62 + static_cast<std::uint64_t>(r));
  const auto dh = tensor_suite::random(batch * local, 63), dy = tensor_suite::random(batch * hidden, 64);
  auto d_x = on_device(x), d_a = on_device(a), d_dh = on_device(dh), d_dy = on_device(dy);
  auto d_w1 = on_device(tensor_suite::part_of(fc1.shape().weight_sharding(), r, tensor_suite::random(ffn * hidden, 65, 0.3f)));
  auto d_b1 = on_device(tensor_suite::part_of(fc1.shape().bias_sharding(), r, tensor_suite::random(ffn, 66, 0.1f)));
  auto d_w2 = on_device(tensor_suite::part_of(fc2.shape().weight_sharding(), r, tensor_suite::random(hidden * ffn, 67, 0.3f)));
  auto d_b2 = on_device(tensor_suite::random(hidden, 68, 0.1f));
  trident::buffer<trident::bf16, trident::cuda_space> x16(x.size()), a16(a.size());
  TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
  trident::nn::cuda::round_to_bf16(d_x.data(), x16.data(), x.size(), ctx.stream());
  trident::nn::cuda::round_to_bf16(d_a.data(), a16.data(), a.size(), ctx.stream());
  const trident::device_span<const trident::bf16> cx16 = x16.device_handle(), ca16 = a16.device_handle();
  struct outputs {
    trident::buffer<float, trident::cuda_space> h, y, dx, dw1, db1, da, dw2, db2;
  };
  auto run = [&](bool rounded, bool overlap) {
    outputs o{zeros(batch * local), zeros(batch * hidden), zeros(batch * hidden), zeros(d_w1.size()), zeros(d_b1.size()),
              zeros(batch * local), zeros(d_w2.size()), zeros(hidden)};
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    fc1.overlap = overlap;
    if (rounded) {
      fc1.forward(ctx, blas, tp, batch, cx16, d_w1.device_handle(), d_b1.device_handle(), o.h.device_handle());
      fc2.forward(ctx, blas, tp, batch, ca16, d_w2.device_handle(), d_b2.device_handle(), o.y.device_handle());
      fc2.backward(ctx, blas, tp, batch, ca16, d_w2.device_handle(), d_dy.device_handle(), o.da.device_handle(),
                   o.dw2.device_handle(), o.db2.device_handle());
      fc1.backward(ctx, blas, tp, batch, cx16, d_w1.device_handle(), d_dh.device_handle(), o.dx.device_handle(),
                   o.dw1.device_handle(), o.db1.device_handle());
    } else {
      fc1.forward(ctx, blas, tp, batch, d_x.device_handle(), d_w1.device_handle(), d_b1.device_handle(), o.h.device_handle());
      fc2.forward(ctx, blas, tp, batch, d_a.device_handle(), d_w2.device_handle(), d_b2.device_handle(), o.y.device_handle());
      fc2.backward(ctx, blas, tp, batch, d_a.device_handle(), d_w2.device_handle(), d_dy.device_handle(), o.da.device_handle(),
                   o.dw2.device_handle(), o.db2.device_handle());
      fc1.backward(ctx, blas, tp, batch, d_x.device_handle(), d_w1.device_handle(), d_dh.device_handle(), o.dx.device_handle(),
                   o.dw1.device_handle(), o.db1.device_handle());
    }
    ctx.synchronize();
    return o;
  };
  for (const bool overlap : {true, false}) {
    const auto want = run(false, overlap), got = run(true, overlap);
    INFO("bf16 inputs on NCCL rank ", r, " of ", tp.size(), overlap ? ", overlap" : "");
    CHECK(on_host(got.h) == on_host(want.h));
    CHECK(on_host(got.y) == on_host(want.y));
    CHECK(on_host(got.dx) == on_host(want.dx));
    CHECK(on_host(got.dw1) == on_host(want.dw1));
    CHECK(on_host(got.db1) == on_host(want.db1));
    CHECK(on_host(got.da) == on_host(want.da));
    CHECK(on_host(got.dw2) == on_host(want.dw2));
    CHECK(on_host(got.db2) == on_host(want.db2));
    const auto dw1 = on_host(got.dw1);  // and not zeros by accident
    CHECK(std::any_of(dw1.begin(), dw1.end(), [](float v) { return v != 0.0f; }));
  }
  // The column layer's output gradient already in bf16 (as the cross-entropy's backward writes
  // the output head's), without a bias gradient: the bits of the float gradient rounding to it.
  trident::buffer<trident::bf16, trident::cuda_space> dh16(dh.size());
  trident::nn::cuda::round_to_bf16(d_dh.data(), dh16.data(), dh.size(), ctx.stream());
  const trident::device_span<const trident::bf16> cdh16 = dh16.device_handle();
  for (const bool overlap : {true, false}) {
    fc1.overlap = overlap;
    auto dx16 = zeros(batch * hidden), dx32 = zeros(batch * hidden), dw16 = zeros(d_w1.size()), dw32 = zeros(d_w1.size());
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    fc1.backward(ctx, blas, tp, batch, d_x.device_handle(), d_w1.device_handle(), cdh16, dx16.device_handle(), dw16.device_handle(),
                 {});
    fc1.backward(ctx, blas, tp, batch, d_x.device_handle(), d_w1.device_handle(), d_dh.device_handle(), dx32.device_handle(),
                 dw32.device_handle(), {});
    ctx.synchronize();
    INFO("bf16 output gradient on NCCL rank ", r, " of ", tp.size(), overlap ? ", overlap" : "");
    CHECK(on_host(dx16) == on_host(dx32));
    CHECK(on_host(dw16) == on_host(dw32));
    const auto dw = on_host(dw16);
    CHECK(std::any_of(dw.begin(), dw.end(), [](float v) { return v != 0.0f; }));
  }
  {
    auto dx = zeros(batch * hidden), dw = zeros(d_w1.size()), db = zeros(d_b1.size());
    CHECK_THROWS_WITH_AS(fc1.backward(ctx, blas, tp, batch, d_x.device_handle(), d_w1.device_handle(), cdh16, dx.device_handle(),
                                      dw.device_handle(), db.device_handle()),
                         doctest::Contains("fc1.backward: dy in bf16 takes no bias gradient"), trident::usage_error);
  }
  trident::nn::cublas_handle tf32;
  tf32.set_math(trident::nn::gemm_math::tf32);
  auto h = zeros(batch * local);
  CHECK_THROWS_WITH_AS(fc1.forward(ctx, tf32, tp, batch, cx16, d_w1.device_handle(), d_b1.device_handle(), h.device_handle()),
                       doctest::Contains("x in bf16 needs gemm_math::bf16"), trident::usage_error);
}

// The vocabulary-parallel embedding equals the unsharded lookup bit for bit (forward and the
// table's gradient: the other ranks add exact zeros), the cross-entropy equals
// nn::softmax_cross_entropy on the whole logits within 1e-6; a target outside the vocabulary
// makes the loss NaN on every rank.
void vocab() {
  auto& tp = *world;
  const int r = tp.rank();
  const std::size_t n = 12, vocab = 24, hidden = 5;
  std::vector<std::int32_t> tokens(n), targets(n);
  const auto pick = tensor_suite::random(2 * n, 21);
  for (std::size_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<std::int32_t>((pick[i] + 1.0f) * 0.5f * static_cast<float>(vocab)) % static_cast<std::int32_t>(vocab);
    targets[i] = static_cast<std::int32_t>((pick[n + i] + 1.0f) * 0.5f * static_cast<float>(vocab)) % static_cast<std::int32_t>(vocab);
  }
  tokens[1] = tokens[0];  // a repeated token: its gradient rows add up
  const auto table = tensor_suite::random(vocab * hidden, 22), dout = tensor_suite::random(n * hidden, 23);
  std::vector<float> x(n * hidden), dtable(vocab * hidden, 0.0f);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < hidden; ++j) {
      x[i * hidden + j] = table[static_cast<std::size_t>(tokens[i]) * hidden + j];
      dtable[static_cast<std::size_t>(tokens[i]) * hidden + j] += dout[i * hidden + j];
    }
  const auto logits = tensor_suite::random(n * vocab, 24, 4.0f);
  const float loss = trident::nn::softmax_cross_entropy::forward(n, vocab, logits, targets);
  std::vector<float> dlogits(logits.size());
  trident::nn::softmax_cross_entropy::backward(n, vocab, logits, targets, dlogits, 0.5f);

  trident::cuda_context ctx;
  const trident::tensor::cuda::vocab_parallel_embedding wte(tp, vocab, hidden, "wte");
  const auto part = tensor_suite::part_of(wte.shape().weight_sharding(), r, table);
  auto d_tokens = on_device(tokens), d_targets = on_device(targets);
  auto d_part = on_device(part), d_dout = on_device(dout);
  auto d_x = zeros(n * hidden), d_dpart = zeros(part.size());
  const auto columns = trident::sharding::split_exact({n, vocab}, 1, tp.size(), "logits");
  const auto mine = tensor_suite::part_of(columns, r, logits);
  auto d_mine = on_device(mine), d_dmine = zeros(mine.size()), d_loss = zeros(1);
  trident::tensor::cuda::vocab_parallel_cross_entropy ce(tp, vocab, "lm_head");
  TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads ran on the legacy stream
  wte.forward(ctx, tp, d_tokens.device_handle(), d_part.device_handle(), d_x.device_handle());
  wte.backward(ctx, tp, d_tokens.device_handle(), d_dout.device_handle(), d_dpart.device_handle());
  ce.forward(ctx, tp, n, d_mine.device_handle(), d_targets.device_handle(), d_loss.device_handle());
  ce.backward(ctx, n, d_mine.device_handle(), d_targets.device_handle(), d_dmine.device_handle(), 0.5f);
  ctx.synchronize();
  INFO("vocabulary-parallel layers on NCCL rank ", r, " of ", tp.size());
  CHECK(on_host(d_x) == x);
  CHECK(on_host(d_dpart) == tensor_suite::part_of(wte.shape().weight_sharding(), r, dtable));
  const float got_loss = on_host(d_loss)[0];
  INFO("loss ", got_loss, " vs ", loss);
  CHECK(std::abs(got_loss - loss) <= 1e-6 * std::abs(loss));
  CHECK(tensor_suite::relative_error(on_host(d_dmine), tensor_suite::part_of(columns, r, dlogits)) <= 1e-6);
  // The gradient in bf16 (for an output head on bf16 GEMMs): each value the float one rounded,
  // bit for bit, from the same forward's statistics; never over the logits it reads.
  {
    trident::buffer<trident::bf16, trident::cuda_space> d16(mine.size());
    ce.backward(ctx, n, d_mine.device_handle(), d_targets.device_handle(), d16.device_handle(), 0.5f);
    ctx.synchronize();
    const auto want = on_host(d_dmine);
    const auto got16 = trident::to_vector(d16);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < want.size(); ++i) wrong += got16[i].bits() != trident::bf16(want[i]).bits();
    CHECK(wrong == 0);
    const trident::device_span<trident::bf16> over(reinterpret_cast<trident::bf16*>(d_mine.data()), mine.size());
    CHECK_THROWS_WITH_AS(ce.backward(ctx, n, d_mine.device_handle(), d_targets.device_handle(), over, 0.5f),
                         doctest::Contains("bf16 dlogits must not overlap the logits"), trident::usage_error);
  }

  // A wider vocabulary (each thread of a row's block takes several columns, so its running max
  // moves and its sum is rescaled), with -inf logits: a row's first half (a whole rank's columns
  // at t = 2), the first column of each rank's slice, every third column; and the row's max on
  // one rank at a time, so that the others' sums are rescaled after the max's all-reduce.
  {
    const std::size_t wide = 2400;  // divisible by t = 1, 2, 3 and 4
    auto wide_logits = tensor_suite::random(n * wide, 25, 4.0f);
    std::vector<std::int32_t> wide_targets(n);
    const float inf = std::numeric_limits<float>::infinity();
    for (std::size_t i = 0; i < n; ++i) wide_targets[i] = static_cast<std::int32_t>(1501 + 3 * i);  // never a -inf logit
    for (std::size_t c = 0; c < wide / 2; ++c) wide_logits[2 * wide + c] = -inf;
    for (const std::size_t c : {std::size_t{0}, wide / 4, wide / 3, wide / 2, 2 * wide / 3, 3 * wide / 4}) wide_logits[5 * wide + c] = -inf;
    for (std::size_t c = 0; c < wide; c += 3) wide_logits[7 * wide + c] = -inf;
    for (std::size_t i = 8; i < n; ++i) wide_logits[i * wide + (i * 617) % wide] = 30.0f;  // the max somewhere else per row
    const float wide_loss = trident::nn::softmax_cross_entropy::forward(n, wide, wide_logits, wide_targets);
    std::vector<float> wide_dlogits(wide_logits.size());
    trident::nn::softmax_cross_entropy::backward(n, wide, wide_logits, wide_targets, wide_dlogits, 0.5f);
    const auto wide_columns = trident::sharding::split_exact({n, wide}, 1, tp.size(), "logits");
    auto d_wide = on_device(tensor_suite::part_of(wide_columns, r, wide_logits));
    auto d_wide_targets = on_device(wide_targets);
    auto d_wide_grad = zeros(d_wide.size()), d_wide_loss = zeros(1);
    trident::tensor::cuda::vocab_parallel_cross_entropy wide_ce(tp, wide, "lm_head");
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    wide_ce.forward(ctx, tp, n, d_wide.device_handle(), d_wide_targets.device_handle(), d_wide_loss.device_handle());
    wide_ce.backward(ctx, n, d_wide.device_handle(), d_wide_targets.device_handle(), d_wide_grad.device_handle(), 0.5f);
    ctx.synchronize();
    const float got = on_host(d_wide_loss)[0];
    INFO("wide vocabulary: loss ", got, " vs ", wide_loss);
    CHECK(std::isfinite(got));
    CHECK(std::abs(got - wide_loss) <= 1e-6 * std::abs(wide_loss));
    const auto grad = on_host(d_wide_grad);
    CHECK(std::all_of(grad.begin(), grad.end(), [](float v) { return std::isfinite(v); }));
    CHECK(tensor_suite::relative_error(grad, tensor_suite::part_of(wide_columns, r, wide_dlogits)) <= 1e-6);
    // A +inf logit makes the loss NaN, as on the host, wherever the rest of its row lies: two in
    // one row (columns on one rank or on two, by t), then one alone in that row.
    wide_logits[4 * wide + 10] = wide_logits[4 * wide + 1290] = inf;
    auto d_inf = on_device(tensor_suite::part_of(wide_columns, r, wide_logits));
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    wide_ce.forward(ctx, tp, n, d_inf.device_handle(), d_wide_targets.device_handle(), d_wide_loss.device_handle());
    ctx.synchronize();
    CHECK(std::isnan(trident::nn::softmax_cross_entropy::forward(n, wide, wide_logits, wide_targets)));
    CHECK(std::isnan(on_host(d_wide_loss)[0]));
    wide_logits[4 * wide + 1290] = 0.0f;  // one +inf alone in its row
    d_inf = on_device(tensor_suite::part_of(wide_columns, r, wide_logits));
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    wide_ce.forward(ctx, tp, n, d_inf.device_handle(), d_wide_targets.device_handle(), d_wide_loss.device_handle());
    ctx.synchronize();
    CHECK(std::isnan(on_host(d_wide_loss)[0]));
  }

  // A target outside the vocabulary cannot be thrown from the device: the loss is NaN everywhere.
  auto bad = targets;
  bad[3] = static_cast<std::int32_t>(vocab);
  auto d_bad = on_device(bad);
  TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
  ce.forward(ctx, tp, n, d_mine.device_handle(), d_bad.device_handle(), d_loss.device_handle());
  ctx.synchronize();
  CHECK(std::isnan(on_host(d_loss)[0]));
  // Sizes are checked on the host, before anything is launched or communicated.
  CHECK_THROWS_WITH_AS(ce.forward(ctx, tp, n + 1, d_mine.device_handle(), d_targets.device_handle(), d_loss.device_handle()),
                       doctest::Contains("lm_head.forward: this rank's logits have"), trident::usage_error);
}

// A pre-LayerNorm transformer block split over the group equals the unsharded block on the host:
// the output, the input's gradient and every parameter's (this rank's parts, accumulated over two
// passes, the overlap on and off), within 1e-5. With sequence parallelism the parallel block
// takes and gives this rank's rows (seq / t positions).
// With flash attention (TF32 products, head_dim 32: a wider block over 72 positions, two
// tiles of 64, the second partial) the same within 1e-2, TF32's rounding; with its bf16 tiles
// (q, k, v, dout, P and dS rounded to bf16) within 5e-2.
// With bf16 GEMMs (block_config::bf16_gemm) the host block emulates them (operands rounded to
// bf16 the same way), and the flash attention's TF32 tiles too (the unfused attention would run
// its products in TF32 under the block's bf16 math, which the host does not emulate): within
// 2e-3, where an operand computed a little differently on the GPU rounds to the neighbouring
// bf16 (without sequence parallelism the norms and GELU write those operands in bf16 themselves;
// with it the GEMMs round them).
void block(bool selective, bool sequence_parallel, bool flash = false, bool bf16 = false, bool bf16_gemm = false) {
  auto& tp = *world;
  const int r = tp.rank();
  namespace tensor = trident::tensor;
  tensor::block_config config = flash ? tensor::block_config{.seq = 72, .batch = 2, .hidden = 128, .heads = 4, .ffn = 64}
                                      : tensor::block_config{.seq = 12, .batch = 2, .hidden = 24, .heads = 12, .ffn = 48};
  const std::size_t n = config.seq * config.batch, h = config.hidden;
  std::vector<std::vector<float>> full, part;
  std::vector<float> y_ref(n * h), dx_ref(n * h);
  std::vector<std::vector<float>> grads_ref;
  const auto x = tensor_suite::random(n * h, 31), dy = tensor_suite::random(n * h, 32);
  // The unsharded block, on one host rank.
  config.bf16_gemm = bf16_gemm;  // the serial block emulates them too
  if (bf16_gemm) config.flash_attention = flash;  // and the tiles
  const auto serial_config = config;
  config.selective_recompute = selective;
  config.sequence_parallel = sequence_parallel;
  config.flash_attention = flash;
  config.flash_bf16 = bf16;
  // bf16 GEMMs with the unfused attention: its products run in TF32 under the block's bf16 math,
  // which the host does not emulate, and that flips bf16 roundings downstream (1e-2, as TF32).
  const double tolerance = bf16 ? 5e-2 : bf16_gemm ? (flash ? 2e-3 : 1e-2) : flash ? 1e-2 : 1e-5;
  tensor::cuda::transformer_block dev(tp, config, "h0");
  std::uint64_t k = 40;
  for (const auto& p : dev.shape().parameters()) {
    auto v = tensor_suite::random(p.split.numel(), ++k, 0.3f);
    if (p.name.find(".ln") != std::string::npos && p.name.find("weight") != std::string::npos)
      for (auto& e : v) e += 1.0f;
    part.push_back(tensor_suite::part_of(p.split, r, v));
    grads_ref.emplace_back(v.size(), 0.0f);
    full.push_back(std::move(v));
  }
  trident::local_world::run(1, [&](trident::local_comm& alone) {
    const tensor::transformer_block serial(alone, serial_config, "h0");
    auto saved = serial.make_activations();
    serial.forward(alone, tensor::block_tensors<const float>::over(full), x, y_ref, saved);
    for (int pass = 0; pass < 2; ++pass)  // the gradients accumulate over both
      serial.backward(alone, tensor::block_tensors<const float>::over(full), saved, dy, dx_ref,
                      tensor::block_tensors<float>::over(grads_ref));
  });

  // This rank's rows: all of them, or its sequence shard (rows are sequence-major).
  const std::size_t m = dev.shape().local_rows(), first = sequence_parallel ? static_cast<std::size_t>(r) * m : 0;
  auto rows_of = [&](const std::vector<float>& v) {
    return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(first * h),
                              v.begin() + static_cast<std::ptrdiff_t>((first + m) * h));
  };
  trident::cuda_context ctx;
  trident::nn::cublas_handle blas;
  std::vector<trident::buffer<float, trident::cuda_space>> d_w, d_g;
  for (const auto& v : part) {
    d_w.push_back(on_device(v));
    d_g.push_back(zeros(v.size()));
  }
  auto d_x = on_device(rows_of(x)), d_dy = on_device(rows_of(dy)), d_y = zeros(m * h), d_dx = zeros(m * h);
  auto saved = dev.make_activations();
  TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads ran on the legacy stream
  const auto w = tensor::block_tensors<const float, trident::cuda_space>::over(d_w);
  const auto g = tensor::block_tensors<float, trident::cuda_space>::over(d_g);
  // Two passes that accumulate into the same gradients: the block with the overlap on, then a
  // second block sharing its backward workspace with the overlap off.
  tensor::cuda::transformer_block second(tp, config, "h0");
  second.share_backward_workspace(dev);
  second.set_overlap(false);
  for (auto* b : {&dev, &second}) {
    b->forward(ctx, blas, tp, w, d_x.device_handle(), d_y.device_handle(), saved);
    b->backward(ctx, blas, tp, w, saved, d_dy.device_handle(), d_dx.device_handle(), g);
  }
  ctx.synchronize();

  INFO("transformer block on NCCL rank ", r, " of ", tp.size(), selective ? ", selective recomputation" : "",
       sequence_parallel ? ", sequence parallel" : "", flash ? ", flash attention" : "", bf16 ? " (bf16 tiles)" : "",
       bf16_gemm ? ", bf16 GEMMs" : "");
  const double y_error = tensor_suite::relative_error(on_host(d_y), rows_of(y_ref));
  if (flash || bf16_gemm)
    MESSAGE("block", std::string(flash ? ", flash attention" : ""), std::string(bf16 ? " (bf16 tiles)" : ""),
            std::string(bf16_gemm ? ", bf16 GEMMs" : ""), std::string(sequence_parallel ? ", sequence parallel" : ""), ": y ",
            y_error, ", dx ",
            tensor_suite::relative_error(on_host(d_dx), rows_of(dx_ref)));
  CHECK(y_error <= tolerance);
  CHECK(tensor_suite::relative_error(on_host(d_dx), rows_of(dx_ref)) <= tolerance);
  const auto params = dev.shape().parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].name);
    CHECK(tensor_suite::relative_error(on_host(d_g[i]), tensor_suite::part_of(params[i].split, r, grads_ref[i])) <= tolerance);
  }
}

}  // namespace

TEST_CASE("vocabulary-parallel embedding and cross-entropy on NCCL = the unsharded ones") { vocab(); }

TEST_CASE("a transformer block on NCCL = the unsharded block (selective recomputation, sequence parallelism)") {
  block(false, false);
  block(true, false);
  block(false, true);
  block(true, true);
}

TEST_CASE("a transformer block on NCCL with flash attention = the unsharded block to TF32's rounding") {
  int major = 0;
  TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 8) {
    MESSAGE("compute capability ", major, ".x: flash attention needs 8.0; not run");
    return;
  }
  block(false, false, true);
  block(true, false, true);
  block(false, true, true);
  block(false, false, true, true);  // the bf16 tiles (nn::cuda::flash_attention_bf16)
  block(false, true, true, true);
  // head_dim 2 (the other cases' block) is refused when the block is made, naming it.
  CHECK_THROWS_WITH_AS(trident::tensor::cuda::transformer_block(*world, {.seq = 12, .batch = 2, .hidden = 24, .heads = 12,
                                                                          .flash_attention = true}),
                       doctest::Contains("flash attention takes head_dim 32 or 64; hidden 24 over 12 heads is 2"),
                       trident::usage_error);
}

TEST_CASE("a transformer block on NCCL with bf16 GEMMs = the unsharded block emulating them") {
  int major = 0;
  TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 8) {
    MESSAGE("compute capability ", major, ".x: bf16 GEMMs need 8.0; not run");
    return;
  }
  block(false, false, true, false, true);  // the norms and GELU write the GEMMs' inputs in bf16
  block(false, true, true, false, true);   // sequence parallelism: the GEMMs round them
  block(true, false, false, false, true);  // the unfused attention (TF32 products), recomputed
}

TEST_CASE("tensor-parallel layers on NCCL under bf16 GEMMs: an input already in bf16 gives the float input's bits") {
  int major = 0;
  TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 8) {
    MESSAGE("compute capability ", major, ".x: bf16 GEMMs need 8.0; not run");
    return;
  }
  bf16_inputs();
}

TEST_CASE("tensor-parallel MLP on NCCL = the unsharded MLP (overlap on and off)") {
  mlp(true);
  mlp(false);
}

TEST_CASE("tensor-parallel layers on NCCL: a layer built for another group size is named") {
  auto& tp = *world;
  auto alone = tp.split(tp.rank(), 0);
  const trident::tensor::cuda::row_parallel_linear fc(alone, 4, 4, "fc");
  trident::cuda_context ctx;
  trident::nn::cublas_handle blas;
  trident::device_span<float> none;
  if (tp.size() > 1)
    CHECK_THROWS_WITH_AS(fc.backward(ctx, blas, tp, 1, none, none, none, none, none, none),
                         doctest::Contains("fc.backward: the tensor-parallel communicator has"), trident::usage_error);
}

int main(int argc, char** argv) { return test_support::nccl_mpi_doctest_main(argc, argv, world); }
