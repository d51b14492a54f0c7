// ZeRO stages 0-3 on thread ranks: equivalence with single-rank training, bitwise agreement
// between stages, the ZeRO paper's memory per rank, loss scaling and skipped steps.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <type_traits>
#include <vector>

#include "trident/comm/local.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"
#include "zero/zero_training.hpp"

using trident::local_comm;
using trident::local_world;
namespace zero = trident::zero;
namespace optim = trident::optim;

namespace {

using zero_training::global_batch;
using zero_training::relative_difference;
using zero_training::small_buckets;

// Trains `steps` steps on n thread ranks; returns rank 0's full fp32 parameters.
template <auto Stage, class Opt, class Precision = trident::full_precision>
std::vector<float> train(int n, Opt opt, int steps, zero::zero_options options = small_buckets()) {
  const mlp::dims d;
  auto result = local_world::run(n, [&](local_comm& comm) {
    zero::zero_optimizer<Stage, Opt, local_comm, Precision> z(comm, mlp::spec(d), opt, options);
    mlp::initialise(z, d);
    const std::size_t rows = global_batch / static_cast<std::size_t>(n);
    for (int s = 0; s < steps; ++s) {
      const std::size_t first = static_cast<std::size_t>(s) * global_batch + static_cast<std::size_t>(comm.rank()) * rows;
      mlp::train_step(z, d, first, rows, rows, z.loss_scale());
      CHECK(z.step().applied);
    }
    return z.full_master();
  });
  return result[0];
}

[[maybe_unused]] optim::sgd sgd_momentum() {
  optim::sgd o;
  o.opt.lr = 0.05f;
  o.opt.momentum = 0.9f;
  o.opt.weight_decay = 1e-4f;
  return o;
}
optim::adamw adamw() {
  optim::adamw o;
  o.opt.lr = 3e-3f;
  return o;
}

template <class Opt>
void check_equivalence(Opt opt, const char* name) {
  // Single rank on the global batch is the reference; the layouts differ only in padding, so
  // compare the real parameters by name.
  const mlp::dims d;
  const auto spec = mlp::spec(d);
  auto by_name = [&](const std::vector<float>& full, int n) {
    const trident::flat_layout layout(spec, n, small_buckets().bucket_bytes / sizeof(float), small_buckets().first_bucket_bytes / sizeof(float));
    std::vector<float> out;
    for (const auto& t : spec.tensors()) {
      const auto& p = layout.find(t.name);
      out.insert(out.end(), full.begin() + static_cast<std::ptrdiff_t>(p.offset), full.begin() + static_cast<std::ptrdiff_t>(p.offset + p.numel));
    }
    return out;
  };
  const auto serial = by_name(train<0>(1, opt, 20), 1);
  for (int n : {1, 2, 3, 4, 8}) {
    const auto s0 = train<0>(n, opt, 20);
    const auto s1 = train<1>(n, opt, 20);
    const auto s2 = train<2>(n, opt, 20);
    const auto s3 = train<3>(n, opt, 20);
    INFO(name, " on ", n, " ranks");
    CHECK(relative_difference(by_name(s0, n), serial) <= 1e-5);
    CHECK(s0 == s1);  // bit for bit
    CHECK(s0 == s2);
    CHECK(s0 == s3);
  }
#if !TRIDENT_ZERO_FEW_INSTANCES
  // A stage given as its policy type is the same optimizer as its number.
  CHECK(train<zero::stage_2{}>(3, opt, 5) == train<2>(3, opt, 5));
  CHECK(train<zero::stage_3{}>(2, opt, 5) == train<3>(2, opt, 5));
#endif
}

static_assert(std::is_same_v<zero::stage_policy_t<0>, zero::stage_0> && std::is_same_v<zero::stage_policy_t<3>, zero::stage_3>);
static_assert(std::is_same_v<zero::stage_policy_t<zero::stage_1{}>, zero::stage_1>);
static_assert(zero::zero_stage<zero::stage_2>);
// A policy whose levels do not nest (gradients sharded, optimizer states not) is not a stage.
struct not_nested {
  static constexpr int number = 9;
  static constexpr bool shards_optimizer_state = false;
  static constexpr bool shards_gradients = true;
  static constexpr bool shards_parameters = false;
};
static_assert(!zero::zero_stage<not_nested>);
static_assert(!zero::zero_stage<int>);

}  // namespace

// The sanitizer build (TRIDENT_ZERO_FEW_INSTANCES, tests/zero/zero.cmake) runs the ZeRO code
// through AdamW alone: every optimizer shares the stages' code, and each optimizer type is
// another set of instantiations that CI's time cannot afford under ASan. The main build runs all.
TEST_CASE("zero: the same with AdamW") { check_equivalence(adamw(), "adamw"); }

#if !TRIDENT_ZERO_FEW_INSTANCES
TEST_CASE("zero: stages 0-3 on N ranks = one rank on the global batch; stages agree bitwise (SGD momentum)") {
  check_equivalence(sgd_momentum(), "sgd");
}

TEST_CASE("zero: the same with AdamW + AMSGrad (a third state, sharded like the others)") {
  optim::adamw_amsgrad o;
  o.opt.lr = 3e-3f;
  check_equivalence(o, "adamw_amsgrad");
  CHECK(train<0>(1, o, 10) != train<0>(1, adamw(), 10));  // the maximum matters within 10 steps
}
#endif

TEST_CASE("zero: the stage must be 0-3 (compile-time) and the model must make sense (run-time)") {
  local_world::run(1, [](local_comm& comm) {
    trident::model_spec empty;
    CHECK_THROWS_AS((zero::zero_optimizer<1, optim::sgd, local_comm>(comm, empty, optim::sgd{})), trident::usage_error);
    trident::model_spec spec = mlp::spec({});
    zero::zero_optimizer<2, optim::sgd, local_comm> z(comm, spec, optim::sgd{});
    CHECK_THROWS_WITH_AS(z.set_parameter("l0.bias", std::vector<float>(3)), doctest::Contains("expected 24"), trident::usage_error);
    CHECK_THROWS_WITH_AS((void)z.gradients("nope"), doctest::Contains("no tensor named 'nope'"), trident::usage_error);
    CHECK_THROWS_WITH_AS((void)z.step(), doctest::Contains("were not reduced"), trident::usage_error);
    CHECK_THROWS_AS(z.set_gradient_sync(false), trident::usage_error);
  });
}

// ZeRO paper, mixed-precision Adam: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N bytes per rank for
// parameters + gradients + optimizer states, with Ψ the padded parameter count.
template <int Stage>
void check_memory(int n) {
  const mlp::dims d{64, 128, 16};
  local_world::run(n, [&](local_comm& comm) {
    auto ledger = std::make_shared<trident::memory_ledger>("rank " + std::to_string(comm.rank()));
    trident::scoped_ledger use{ledger};
    zero::zero_options options;
    options.bucket_bytes = 16 << 10;
    options.first_bucket_bytes = 4 << 10;
    options.persistence_threshold = 0;
    zero::zero_optimizer<Stage, optim::adamw, local_comm, trident::mixed_precision<trident::bf16>> z(comm, mlp::spec(d), adamw(), options);
    mlp::initialise(z, d);
    const std::size_t rows = 16 / static_cast<std::size_t>(n);
    mlp::train_step(z, d, static_cast<std::size_t>(comm.rank()) * rows, rows, rows);
    z.step();
    const double psi = static_cast<double>(z.layout().full_size());
    const double nn = n;
    const double expected[] = {16 * psi, 4 * psi + 12 * psi / nn, 2 * psi + 14 * psi / nn, 16 * psi / nn};
    using trident::mem_category;
    using trident::space_kind;
    const auto held = static_cast<double>(ledger->bytes(space_kind::host, mem_category::parameters) +
                                          ledger->bytes(space_kind::host, mem_category::gradients) +
                                          ledger->bytes(space_kind::host, mem_category::optimizer_state));
    INFO("stage ", Stage, " rank ", comm.rank(), "/", n, "\n", ledger->report());
    CHECK(held == expected[Stage]);
    // The policy's own formula says the same (2 + 2 bytes of bf16, 4 of master, 8 of AdamW state).
    CHECK(held == psi * zero::stage_bytes<zero::stage_policy_t<Stage>>(2, 4, 8, n));
    if (comm.rank() == 0 && n == 4)
      std::printf("stage %d, %d ranks, %zu parameters (+%zu padding): %.0f bytes held = %.3f x padded params (ZeRO: %.3f); "
                  "peak communication buffers %zu bytes\n",
                  Stage, n, z.layout().parameters(), z.layout().padding(), held, held / psi, expected[Stage] / psi,
                  ledger->peak(space_kind::host, mem_category::communication));
  });
}

TEST_CASE("zero: per-rank bytes match the ZeRO paper's formulas (mixed-precision AdamW)") {
  for (int n : {1, 2, 4, 8}) {
    check_memory<0>(n);
    check_memory<1>(n);
    check_memory<2>(n);
    check_memory<3>(n);
  }
}

TEST_CASE("zero: an inf gradient on one rank skips the step on every rank; the scale halves after hysteresis") {
  const mlp::dims d;
  local_world::run(3, [&](local_comm& comm) {
    zero::zero_optimizer<2, optim::adamw, local_comm, trident::mixed_precision<trident::fp16>> z(comm, mlp::spec(d), adamw(), small_buckets());
    mlp::initialise(z, d);
    const auto before = z.full_master();
    CHECK(z.loss_scale() == 65536.0f);
    const std::size_t rows = 8;
    const std::size_t first = static_cast<std::size_t>(comm.rank()) * rows;
    mlp::train_step(z, d, first, rows, rows, z.loss_scale(), /*inject_inf=*/comm.rank() == 1);
    auto r = z.step();
    CHECK_FALSE(r.applied);
    CHECK(z.full_master() == before);   // nothing moved, on any rank
    CHECK(z.loss_scale() == 65536.0f);  // hysteresis 2: the first overflow only uses it up
    mlp::train_step(z, d, first, rows, rows, z.loss_scale(), comm.rank() == 2);
    r = z.step();
    CHECK_FALSE(r.applied);
    CHECK(z.loss_scale() == 32768.0f);
    mlp::train_step(z, d, first, rows, rows, z.loss_scale());
    CHECK(z.step().applied);
    CHECK(z.full_master() != before);
    CHECK(z.steps_taken() == 1);
  });
}

// The loss scaler on its own: tests/precision/test_loss_scaler.cpp (against DeepSpeed's traces).

TEST_CASE("zero: bf16 and fp16 training reach the fp32 loss within 2% after 200 steps") {
  const mlp::dims d;
  auto final_loss = [&](auto precision_tag) {
    using P = decltype(precision_tag);
    auto losses = local_world::run(2, [&](local_comm& comm) {
      zero::zero_optimizer<2, optim::adamw, local_comm, P> z(comm, mlp::spec(d), adamw(), small_buckets());
      mlp::initialise(z, d);
      const std::size_t rows = 12;
      for (int s = 0; s < 200; ++s) {
        const std::size_t first = static_cast<std::size_t>(s % 10) * global_batch + static_cast<std::size_t>(comm.rank()) * rows;
        mlp::train_step(z, d, first, rows, rows, z.loss_scale());
        z.step();
      }
      // The loss over the whole training set (240 samples) with the final weights.
      const double last = mlp::train_step(z, d, 0, 10 * global_batch, 10 * global_batch, z.loss_scale());
      std::vector<double> l{last};
      comm.all_reduce(l, trident::reduce_op::avg);
      return l[0];
    });
    return losses[0];
  };
  const double fp32 = final_loss(trident::full_precision{});
  const double bf16 = final_loss(trident::mixed_precision<trident::bf16>{});
  const double fp16 = final_loss(trident::mixed_precision<trident::fp16>{});
  std::printf("loss after 200 steps: fp32 %.6f, bf16 %.6f, fp16 %.6f\n", fp32, bf16, fp16);
  CHECK(fp32 < 0.05);  // it learned something
  CHECK(std::fabs(bf16 - fp32) <= 0.02 * fp32);
  CHECK(std::fabs(fp16 - fp32) <= 0.02 * fp32);
}

TEST_CASE("zero: sharded<T> partitions with padding and round-trips through the collectives") {
  for (int n = 1; n <= 5; ++n)
    local_world::run(n, [&](local_comm& comm) {
      trident::sharded<float> w(10, comm.rank(), comm.size(), trident::mem_category::parameters);
      CHECK(w.padded_size() % static_cast<std::size_t>(n) == 0);
      CHECK(w.padded_size() - w.size() < static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < w.shard_size(); ++i) w.shard()[i] = static_cast<float>(w.shard_begin() + i);
      std::vector<float> full(w.padded_size());
      w.all_gather(comm, full);
      for (std::size_t i = 0; i < full.size(); ++i) CHECK(full[i] == static_cast<float>(i));
      w.reduce_scatter(comm, full, trident::reduce_op::sum);
      for (std::size_t i = 0; i < w.shard_size(); ++i) CHECK(w.shard()[i] == static_cast<float>(n) * static_cast<float>(w.shard_begin() + i));
      std::vector<float> wrong(w.padded_size() + 1);
      CHECK_THROWS_WITH_AS(w.all_gather(comm, wrong), doctest::Contains("expected the padded size"), trident::usage_error);
    });
}

TEST_CASE("zero: global-norm clipping across shards matches single-rank clipping; stages agree bitwise") {
  auto clipped = small_buckets();
  clipped.max_grad_norm = 0.05f;  // well below the gradient norm of the first steps: clipping is active
  const auto serial = train<0>(1, adamw(), 10, clipped);
  const auto unclipped = train<0>(1, adamw(), 10);
  CHECK(relative_difference(serial, unclipped) > 1e-4);  // clipping changed the trajectory
  for (int n : {2, 3}) {
    const auto s0 = train<0>(n, adamw(), 10, clipped);
    const auto s2 = train<2>(n, adamw(), 10, clipped);
    const auto s3 = train<3>(n, adamw(), 10, clipped);
    CHECK(s0 == s2);
    CHECK(s0 == s3);
    // Same tensors, different padding: compare parameter by parameter.
    const mlp::dims d;
    const auto spec = mlp::spec(d);
    const trident::flat_layout one(spec, 1, clipped.bucket_bytes / sizeof(float), clipped.first_bucket_bytes / sizeof(float));
    const trident::flat_layout many(spec, n, clipped.bucket_bytes / sizeof(float), clipped.first_bucket_bytes / sizeof(float));
    std::vector<float> a, b;
    for (const auto& t : spec.tensors()) {
      const auto& p = one.find(t.name);
      const auto& q = many.find(t.name);
      a.insert(a.end(), serial.begin() + static_cast<std::ptrdiff_t>(p.offset), serial.begin() + static_cast<std::ptrdiff_t>(p.offset + p.numel));
      b.insert(b.end(), s0.begin() + static_cast<std::ptrdiff_t>(q.offset), s0.begin() + static_cast<std::ptrdiff_t>(q.offset + q.numel));
    }
    INFO(n, " ranks");
    CHECK(relative_difference(b, a) <= 1e-5);
  }
}

// Two micro-batches per step (no_sync on the first in stages 0-1; stages 2-3 reduce both and
// accumulate their shards) equal one step on the whole batch.
template <int Stage>
std::vector<float> train_accumulated(int n, int micro_batches) {
  const mlp::dims d;
  return local_world::run(n, [&](local_comm& comm) {
    zero::zero_optimizer<Stage, optim::adamw, local_comm> z(comm, mlp::spec(d), adamw(), small_buckets());
    mlp::initialise(z, d);
    const std::size_t rows = global_batch / static_cast<std::size_t>(n);
    const std::size_t micro = rows / static_cast<std::size_t>(micro_batches);
    for (int s = 0; s < 10; ++s)
      for (int m = 0; m < micro_batches; ++m) {
        if constexpr (Stage < 2) z.set_gradient_sync(m + 1 == micro_batches);
        const std::size_t first = static_cast<std::size_t>(s) * global_batch + static_cast<std::size_t>(comm.rank()) * rows +
                                  static_cast<std::size_t>(m) * micro;
        mlp::train_step(z, d, first, micro, rows, z.loss_scale());  // each micro-batch: its share of the mean
        if (m + 1 == micro_batches) CHECK(z.step().applied);
      }
    return z.full_master();
  })[0];
}

TEST_CASE("zero: gradient accumulation over micro-batches equals one step on the whole batch") {
  for (int n : {1, 2, 3}) {
    INFO(n, " ranks");
    const auto whole = train_accumulated<0>(n, 1);
    CHECK(relative_difference(train_accumulated<0>(n, 2), whole) <= 1e-5);
    CHECK(relative_difference(train_accumulated<1>(n, 2), whole) <= 1e-5);
    CHECK(relative_difference(train_accumulated<2>(n, 4), whole) <= 1e-5);
    CHECK(relative_difference(train_accumulated<3>(n, 2), whole) <= 1e-5);
  }
}

TEST_CASE("zero: stage 3 releases per layer: a bucket of two layers stays gathered until both are released") {
  local_world::run(2, [](local_comm& comm) {
    trident::model_spec spec;
    spec.add("a", {16}, 0).add("b", {16}, 1).add("c", {16}, 2);
    zero::zero_options options;
    options.bucket_bytes = 1 << 20;
    options.first_bucket_bytes = 16 * sizeof(float);  // layer 2 alone; layers 0 and 1 share a bucket
    options.persistence_threshold = 0;
    options.prefetch = false;
    options.check_usage = true;  // released buckets are poisoned with NaN: what this test looks at
    zero::zero_optimizer<3, optim::sgd, local_comm> z(comm, spec, optim::sgd{}, options);
    REQUIRE(z.layout().bucket_of_layer(0) == z.layout().bucket_of_layer(1));
    REQUIRE(z.layout().bucket_of_layer(1) != z.layout().bucket_of_layer(2));
    for (const char* name : {"a", "b", "c"}) z.set_parameter(name, std::vector<float>(16, 0.5f));
    auto finite = [](auto span) {
      for (std::size_t i = 0; i < span.size(); ++i)
        if (!std::isfinite(static_cast<float>(span.data()[i]))) return false;
      return true;
    };
    auto nan = [](auto span) {
      for (std::size_t i = 0; i < span.size(); ++i)
        if (!std::isnan(static_cast<float>(span.data()[i]))) return false;
      return true;
    };
    auto a = z.parameters("a");
    auto b = z.parameters("b");
    CHECK(b.data() == a.data() + 16);  // one gathered bucket
    z.release(0);
    CHECK(finite(a));  // layer 1 still needs the bucket
    CHECK(finite(b));
    z.release(0);      // again: nothing more
    CHECK(finite(b));
    z.release(2);      // a layer whose bucket is not gathered: nothing
    CHECK(finite(a));
    z.release(1);      // the last layer of the bucket: now it goes
    CHECK(nan(a));
    CHECK(nan(b));
    // Gathered again, the count starts over.
    auto again = z.parameters("b");
    CHECK(finite(again));
    z.release(1);
    CHECK(finite(again));
    z.release(0);
    CHECK(nan(again));
  });
}

// On CUDA every allocation is a cudaMalloc (and a free an implicit device synchronisation): a
// step must allocate nothing once warm. The ledger counts allocations, whatever the space.
template <int Stage>
void check_no_allocation_when_warm(bool prefetch) {
  const mlp::dims d;
  local_world::run(2, [&](local_comm& comm) {
    auto options = small_buckets();
    options.check_usage = false;
    options.prefetch = prefetch;
    options.persistence_threshold = 0;  // stage 3 gathers and releases every bucket
    zero::zero_optimizer<Stage, optim::adamw, local_comm, trident::mixed_precision<trident::bf16>> z(comm, mlp::spec(d), adamw(),
                                                                                                     options);
    mlp::initialise(z, d);
    const std::size_t rows = global_batch / 2;
    auto train = [&](int s) {
      mlp::train_step(z, d, static_cast<std::size_t>(s) * global_batch + static_cast<std::size_t>(comm.rank()) * rows, rows, rows,
                      z.loss_scale());
      CHECK(z.step().applied);
    };
    for (int s = 0; s < 3; ++s) train(s);  // warm: the pools have met their peaks
    const std::size_t before = comm.ledger()->allocations(trident::space_kind::host);
    for (int s = 3; s < 8; ++s) train(s);
    INFO("stage ", Stage, ", prefetch ", prefetch, ", rank ", comm.rank());
    CHECK(comm.ledger()->allocations(trident::space_kind::host) == before);
  });
}

TEST_CASE("zero: once warm, a step allocates nothing (stages 0-3, with and without prefetch)") {
  for (bool prefetch : {false, true}) {
    check_no_allocation_when_warm<0>(prefetch);
    check_no_allocation_when_warm<1>(prefetch);
    check_no_allocation_when_warm<2>(prefetch);
    check_no_allocation_when_warm<3>(prefetch);
  }
}
