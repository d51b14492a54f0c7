// Gradient compression (compress/) through zero_optimizer on thread ranks, on a network that
// counts bytes (slow_link_comm): the hook itself is exact; fp16/bf16 casting halves the bytes;
// PowerSGD at full rank equals the plain all-reduce, at low rank sends its factors; 1-bit sends
// 32x fewer bytes after its warm-up; every method reaches the plain run's loss within 2%, and
// without error feedback they fall short; bad input is an error.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "compress/compress_training.hpp"
#include "trident/comm/local.hpp"
#include "trident/compress/cast.hpp"
#include "trident/compress/onebit.hpp"
#include "trident/compress/powersgd.hpp"

using trident::local_comm;
using trident::local_world;
using net_type = trident::slow_link_comm<local_comm>;
namespace compress = trident::compress;
namespace optim = trident::optim;
using compress_training::run;
using compress_training::train;

namespace {

optim::sgd sgd() {
  optim::sgd o;
  o.opt.lr = 0.05f;
  o.opt.momentum = 0.9f;
  return o;
}

// Runs f(net) on n thread ranks over a two-cluster network; rank 0's result.
template <class F>
auto on_network(int n, F f) {
  return local_world::run(n, [&](local_comm& c) {
    auto map = trident::cluster_map::blocks(n, n % 2 == 0 ? n / 2 : 1, {}, {.latency = 0.01, .bandwidth = 1e8});
    net_type net(c.split(0, c.rank()), map);
    return f(net);
  })[0];
}

// Each rank makes its own reducer (they keep per-rank state): `make()` returns a shared_ptr.
template <int Stage, class Make, class Opt = optim::sgd>
run train_with(int n, Make make, int steps = 8, Opt opt = sgd()) {
  return on_network(n, [&](net_type& net) { return train<Stage>(net, opt, steps, make()); });
}

template <class R, class... A>
auto maker(A... a) {
  return [=] { return std::make_shared<R>(a...); };
}
auto plain_reduction() {
  return [] { return std::shared_ptr<compress::exact>(); };
}

}  // namespace

TEST_CASE("compress: the exact reducer through the hook trains bitwise as without it, ZeRO 0-3") {
  auto exact = maker<compress::exact>();
  auto none = plain_reduction();
  CHECK(train_with<0>(4, exact).parameters == train_with<0>(4, none).parameters);
  CHECK(train_with<1>(4, exact).parameters == train_with<1>(4, none).parameters);
  CHECK(train_with<2>(3, exact).parameters == train_with<2>(3, none).parameters);
  CHECK(train_with<3>(2, exact).parameters == train_with<3>(2, none).parameters);
}

TEST_CASE("compress: fp16 and bf16 casting halve the bytes and train close to fp32") {
  const auto plain = train_with<0>(4, maker<compress::exact>());
  for (auto [name, r] : {std::pair<const char*, run>{"fp16", train_with<0>(4, maker<compress::cast<trident::fp16>>())},
                         {"bf16", train_with<0>(4, maker<compress::cast<trident::bf16>>())}}) {
    INFO(name, ": ", r.gradient_bytes, " bytes against ", plain.gradient_bytes);
    CHECK(2 * r.gradient_bytes == plain.gradient_bytes);
    CHECK(r.parameters != plain.parameters);  // rounded on the wire
    CHECK(compress_training::max_relative_difference(r.parameters, plain.parameters) < (name[0] == 'b' ? 2e-2 : 2e-3));
  }
}

TEST_CASE("compress: PowerSGD at full rank equals the plain all-reduce; at rank 1 it sends its factors") {
  const auto plain = train_with<0>(4, maker<compress::exact>());
  compress::powersgd_options full;
  full.rank = 64;  // above every side of the MLP's matrices: P Q^T is the average exactly
  full.clamp_rank = true;
  full.start_iter = 2;
  full.min_compression_rate = 0;
  for (bool feedback : {true, false}) {
    full.error_feedback = feedback;
    const auto r = train_with<0>(4, maker<compress::powersgd>(full));
    INFO("error feedback ", feedback);
    CHECK(compress_training::max_relative_difference(r.parameters, plain.parameters) < 1e-5);
  }
  // Summed gradients (average = false): each rank's error is against its share of the sum.
  {
    auto summed = compress_training::options();
    summed.average = false;
    optim::sgd small = sgd();
    small.opt.lr = 0.01f;
    auto run_sum = [&](auto make) {
      return on_network(4, [&](net_type& net) { return train<0>(net, small, 8, make(), 32, {}, summed); });
    };
    const auto exact_sum = run_sum(maker<compress::exact>());
    const auto psgd_sum = run_sum(maker<compress::powersgd>(full));
    CHECK(compress_training::max_relative_difference(psgd_sum.parameters, exact_sum.parameters) < 1e-5);
  }
  // Stage 2 keeps its piece of the reduced bucket.
  full.error_feedback = true;
  const auto stage2 = train_with<2>(4, maker<compress::powersgd>(full));
  CHECK(compress_training::max_relative_difference(stage2.parameters, train_with<2>(4, maker<compress::exact>()).parameters) < 1e-5);

  // Rank 1 after 2 plain steps: the matrices go as factors, the biases whole.
  compress::powersgd_options low;
  low.rank = 1;
  low.start_iter = 2;
  std::shared_ptr<compress::powersgd> p;  // rank 0's, for its statistics
  const auto r = on_network(4, [&](net_type& net) {
    auto mine = std::make_shared<compress::powersgd>(low);
    if (net.rank() == 0) p = mine;
    return train<0>(net, sgd(), 8, mine);
  });
  const mlp::dims d;
  const std::uint64_t matrices = (d.hidden + d.in) + (d.hidden + d.hidden) + (d.out + d.hidden);
  const std::uint64_t biases = d.hidden + d.hidden + d.out;
  CHECK(p->numel_after() == 6 * (matrices + biases));  // 8 steps, 2 of them plain
  CHECK(p->numel_before() == 6 * mlp::spec(d).parameters());
  // After the 2 plain steps, bytes per step against the plain all-reduce's.
  const std::uint64_t per_step = plain.gradient_bytes / 8;
  const double ratio = static_cast<double>(6 * per_step) / static_cast<double>(r.gradient_bytes - 2 * per_step);
  MESSAGE("PowerSGD rank 1 on the MLP: ", ratio, "x fewer bytes per step than the fp32 all-reduce");
  CHECK(ratio > 4.0);
  for (std::size_t s = 0; s <= 2; ++s) CHECK(r.losses[s] == plain.losses[s]);  // the plain steps are the plain all-reduce
  CHECK(r.losses[3] != plain.losses[3]);
}

TEST_CASE("compress: PowerSGD starts afresh when a bucket's layout of tensors changes (as on a device)") {
  // Layout a for two calls, then b (the same bucket size, tensors moved): the third call must
  // equal a fresh reducer's first call on b, not add a's error to b's elements.
  const std::vector<compress::tensor_part> a = {{"w", 0, 16, 12}, {"v", 192, 8, 1}};
  const std::vector<compress::tensor_part> b = {{"v", 0, 8, 1}, {"w", 8, 16, 12}};
  auto input = [](int rank, int call) {
    std::vector<float> g(200);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(rank * 13 + call)) % 23) / 11.0f - 1.0f;
    return g;
  };
  const auto results = local_world::run(2, [&](local_comm& c) {
    compress::powersgd_options o;
    o.rank = 2;
    o.start_iter = 0;
    compress::powersgd used(o), fresh(o);
    for (int call = 0; call < 2; ++call) {
      auto g = input(c.rank(), call);
      used.all_reduce(c, compress::bucket_view<float, trident::host_space>{0, trident::space_span<float, trident::host_space>(g), a,
                                                                          trident::reduce_op::avg, call + 1});
    }
    auto g1 = input(c.rank(), 2), g2 = g1;
    used.all_reduce(c, compress::bucket_view<float, trident::host_space>{0, trident::space_span<float, trident::host_space>(g1), b,
                                                                        trident::reduce_op::avg, 3});
    fresh.all_reduce(c, compress::bucket_view<float, trident::host_space>{0, trident::space_span<float, trident::host_space>(g2), b,
                                                                         trident::reduce_op::avg, 3});
    return std::pair{g1, g2};
  });
  for (const auto& [after_change, first] : results) CHECK(after_change == first);
}

TEST_CASE("compress: 1-bit after its warm-up sends at least 16x fewer bytes; before it, the plain all-reduce") {
  const int steps = 12, warmup = 4;
  const auto plain = train_with<0>(4, maker<compress::exact>(), steps);
  compress::onebit_options o;
  o.warmup = warmup;
  const auto r = train_with<0>(4, maker<compress::onebit>(o), steps);
  for (int s = 0; s <= warmup; ++s) CHECK(r.losses[static_cast<std::size_t>(s)] == plain.losses[static_cast<std::size_t>(s)]);
  // The bytes after the warm-up, against the plain run's for the same steps.
  const auto plain_warm = train_with<0>(4, maker<compress::exact>(), warmup);
  const double ratio = static_cast<double>(plain.gradient_bytes - plain_warm.gradient_bytes) /
                       static_cast<double>(r.gradient_bytes - plain_warm.gradient_bytes);
  MESSAGE("1-bit: ", ratio, "x fewer bytes than the fp32 all-reduce after the warm-up");
  CHECK(ratio >= 16.0);
}

TEST_CASE("compress: 1-bit Adam compresses the momentum after the freeze; before it, the plain all-reduce") {
  // 1-bit Adam needs a warm-up long enough that every parameter's second moment is set before
  // it freezes (DeepSpeed advises 15-25% of training): a unit whose gradients were 0 until the
  // freeze would take steps of m / eps after it.
  const int steps = 40, freeze = 10;
  compress::onebit_adam adam;
  adam.opt.lr = 3e-3f;
  adam.opt.freeze_step = freeze;
  const auto plain = train_with<0>(4, maker<compress::exact>(), steps, adam);
  compress::onebit_options o;
  o.warmup = freeze;
  o.momentum = adam.opt.beta1;
  const auto r = train_with<0>(4, maker<compress::onebit>(o), steps, adam);
  for (int s = 0; s <= freeze; ++s) CHECK(r.losses[static_cast<std::size_t>(s)] == plain.losses[static_cast<std::size_t>(s)]);
  CHECK(r.losses[freeze + 1] != plain.losses[freeze + 1]);
  CHECK(r.losses.back() < r.losses.front());
  const auto plain_warm = train_with<0>(4, maker<compress::exact>(), freeze, adam);
  const double ratio = static_cast<double>(plain.gradient_bytes - plain_warm.gradient_bytes) /
                       static_cast<double>(r.gradient_bytes - plain_warm.gradient_bytes);
  MESSAGE("1-bit Adam: ", ratio, "x fewer bytes than the fp32 all-reduce after the freeze; loss ", r.losses.back(), " against ",
          plain.losses.back(), " with the plain all-reduce");
  CHECK(ratio >= 16.0);
  // Its own bad input: a bucket twice in one step (ZeRO 2-3 with accumulation), momentum 1.
  local_world::run(2, [&](local_comm& c) {
    compress::onebit ob(o);
    std::vector<float> g(64, 1.0f);
    const compress::tensor_part part{"w", 0, 64, 1};
    const compress::bucket_view<float, trident::host_space> b{0, trident::space_span<float, trident::host_space>(g), {&part, 1},
                                                              trident::reduce_op::avg, 3};
    ob.all_reduce(c, b);
    CHECK_THROWS_WITH_AS(ob.all_reduce(c, b), doctest::Contains("bucket 0 came twice for step 3"), trident::usage_error);
  });
  o.momentum = 1.0f;
  CHECK_THROWS_WITH_AS(compress::onebit{o}, doctest::Contains("momentum 1"), trident::usage_error);
}

TEST_CASE("compress: a step the optimizer skips (an inf on one rank) leaves no trace in the reducer's state") {
  // Two finite steps, then step 3 with an inf on rank 0 (fp16's overflow), which the optimizer
  // skips and reports through step_skipped, then step 3 again, finite. The retried step must
  // reduce as a reducer that never saw the inf would: PowerSGD and 1-bit as a fresh one (their
  // error feedback and warm start start over), 1-bit Adam's momentum as one that never saw step 3.
  const std::vector<compress::tensor_part> parts = {{"w", 0, 16, 12}, {"v", 192, 8, 1}};
  auto input = [](int rank, int step) {
    std::vector<float> g(200);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(rank * 13 + step)) % 23) / 11.0f - 1.0f;
    return g;
  };
  auto reduce = [&](auto& r, local_comm& c, std::vector<float>& g, std::int64_t step) {
    r.all_reduce(c, compress::bucket_view<float, trident::host_space>{0, trident::space_span<float, trident::host_space>(g), parts,
                                                                      trident::reduce_op::avg, step});
  };
  // used: steps 1, 2, 3 with the inf, skipped, 3 again; reference: `steps_before` first, then 3.
  auto compare = [&](auto make, int steps_before, const char* what) {
    INFO(std::string(what));
    const auto results = local_world::run(2, [&](local_comm& c) {
      auto used = make(), reference = make();
      for (std::int64_t step = 1; step <= 2; ++step) {
        auto g = input(c.rank(), static_cast<int>(step));
        reduce(used, c, g, step);
      }
      auto bad = input(c.rank(), 3);
      if (c.rank() == 0) bad[5] = std::numeric_limits<float>::infinity();
      reduce(used, c, bad, 3);
      bool reached = false;  // the inf went through the compressed reduction to every rank
      for (float x : bad) reached = reached || !std::isfinite(x);
      used.step_skipped(c);
      for (std::int64_t step = 1; step <= steps_before; ++step) {
        auto g = input(c.rank(), static_cast<int>(step));
        reduce(reference, c, g, step);
      }
      auto again = input(c.rank(), 3), expected = again;
      reduce(used, c, again, 3);
      reduce(reference, c, expected, 3);
      return std::tuple{reached, again, expected};
    });
    for (const auto& [reached, again, expected] : results) {
      CHECK(reached);
      CHECK(again == expected);
    }
  };
  compress::powersgd_options p;
  p.rank = 2;
  p.start_iter = 0;
  compare([&] { return compress::powersgd(p); }, 0, "powersgd");
  compress::onebit_options b;
  b.warmup = 0;
  compare([&] { return compress::onebit(b); }, 0, "onebit");
  compress::onebit_options m;
  m.warmup = 1;  // the momentum follows the plain all-reduce at step 1, then is compressed
  m.momentum = 0.9f;
  m.error_feedback = false;  // the errors start over (above); this checks that the momentum does not
  compare([&] { return compress::onebit(m); }, 2, "onebit, momentum");
}

TEST_CASE("compress: fp16 training with an overflowing step goes on with every reducer") {
  // The loss scaler skips a step with an inf gradient on one rank; the reducer must not keep it
  // (it did: every later step overflowed until the scale reached its minimum).
  using trident::fp16;
  auto steps_taken = [](auto make) {
    return local_world::run(2, [&](local_comm& comm) {
      trident::model_spec spec;
      spec.add("w", {16, 16}, 0).add("b", {16}, 0);
      trident::zero::zero_options o;
      o.persistence_threshold = 0;
      optim::adamw opt;
      opt.opt.lr = 1e-3f;
      trident::zero::zero_optimizer<0, optim::adamw, local_comm, trident::mixed_precision<fp16>> z(
          comm, spec, opt, o, trident::dynamic_loss_scaler({.initial_scale = 1024.0, .window = 3, .hysteresis = 1}));
      for (const auto& t : spec.tensors()) z.set_parameter(t.name, std::vector<float>(t.numel, 0.1f));
      z.reduce_gradients_with(make());
      int skipped = 0;
      for (int step = 0; step < 12; ++step) {
        for (const auto& t : spec.tensors()) {
          auto g = z.gradients(z.handle(t.name));
          for (std::size_t i = 0; i < g.size(); ++i) g.data()[i] = static_cast<fp16>(0.01f * z.loss_scale() * static_cast<float>(i % 7 + 1));
          if (step == 3 && comm.rank() == 0 && t.name == "w") g.data()[0] = static_cast<fp16>(std::numeric_limits<float>::infinity());
        }
        z.release(0);
        z.grad_ready(0);
        if (!z.step().applied) ++skipped;
      }
      bool finite = true;
      for (float x : z.full_master()) finite = finite && std::isfinite(x);
      return std::tuple{skipped, z.steps_taken(), finite};
    })[0];
  };
  compress::powersgd_options p;
  p.rank = 1;
  p.start_iter = 0;
  compress::onebit_options b;
  b.warmup = 0;
  for (const auto& [skipped, taken, finite] : {steps_taken(maker<compress::powersgd>(p)), steps_taken(maker<compress::onebit>(b))}) {
    CHECK(skipped == 1);
    CHECK(taken == 11);
    CHECK(finite);
  }
}

TEST_CASE("compress: every rank holds the same parameters with every reducer") {
  compress::powersgd_options p;
  p.start_iter = 1;
  compress::onebit_options b;
  b.warmup = 1;
  auto check = [](auto make) {
    const auto all = local_world::run(4, [&](local_comm& c) {
      net_type net(c.split(0, c.rank()), trident::cluster_map::blocks(4, 2, {}, {}));
      return train<1>(net, sgd(), 5, make()).parameters;
    });
    for (const auto& x : all) CHECK(x == all[0]);
  };
  check(maker<compress::powersgd>(p));
  check(maker<compress::onebit>(b));
  check(maker<compress::cast<trident::bf16>>());
  compress::onebit_options m;
  m.warmup = 1;
  m.momentum = 0.9f;
  compress::onebit_adam adam;
  adam.opt.freeze_step = 1;
  const auto all = local_world::run(4, [&](local_comm& c) {
    net_type net(c.split(0, c.rank()), trident::cluster_map::blocks(4, 2, {}, {}));
    return train<1>(net, adam, 5, std::make_shared<compress::onebit>(m)).parameters;
  });
  for (const auto& x : all) CHECK(x == all[0]);
}

TEST_CASE("compress: bad options and a reducer swapped mid-step are usage errors") {
  compress::powersgd_options p;
  p.rank = 0;
  CHECK_THROWS_WITH_AS(compress::powersgd{p}, doctest::Contains("rank 0; expected at least 1"), trident::usage_error);
  p.rank = 1;
  p.start_iter = -1;
  CHECK_THROWS_WITH_AS(compress::powersgd{p}, doctest::Contains("start_iter -1"), trident::usage_error);
  // A rank above a matrix's side: an error naming the tensor (when compression starts), unless
  // clamped as PyTorch does.
  p.start_iter = 0;
  p.rank = 5;  // l2.weight is 4 x 24
  CHECK_THROWS_WITH_AS(train_with<0>(2, maker<compress::powersgd>(p)),
                       doctest::Contains("the gradient reducer refused bucket 2 of 3: compress::powersgd: rank 5 is above the "
                                         "smaller side of tensor 'l2.weight' (4 x 24)"),
                       trident::usage_error);
  p.clamp_rank = true;
  CHECK_NOTHROW(train_with<0>(2, maker<compress::powersgd>(p)));
  compress::onebit_options b;
  b.warmup = -3;
  CHECK_THROWS_WITH_AS(compress::onebit{b}, doctest::Contains("warmup -3"), trident::usage_error);
  // A reducer set while a bucket's reduction is in flight (the thread backend reduces in the
  // background) would leave that bucket to the old rule: refused.
  local_world::run(2, [](local_comm& comm) {
    trident::zero::zero_optimizer<0, optim::sgd, local_comm> z(comm, mlp::spec({}), sgd(), compress_training::options());
    z.grad_ready(2);
    CHECK_THROWS_WITH_AS(z.reduce_gradients_with(std::make_shared<compress::exact>()), doctest::Contains("in flight"),
                         trident::usage_error);
    z.grad_ready(1);
    z.grad_ready(0);
    z.step();
    z.reduce_gradients_with(std::make_shared<compress::exact>());  // between steps: fine
  });
  // A bucket whose tensor runs past its data (it was read and written out of bounds), and one
  // whose rows x cols overflows.
  local_world::run(2, [](local_comm& comm) {
    std::vector<float> g(16, 1.0f);
    const std::vector<compress::tensor_part> past = {{"w", 8, 4, 4}};
    const std::vector<compress::tensor_part> huge = {{"w", 0, std::size_t{1} << 33, std::size_t{1} << 33}};
    for (const auto* parts : {&past, &huge}) {
      const compress::bucket_view<float, trident::host_space> b{0, trident::space_span<float, trident::host_space>(g), *parts,
                                                                trident::reduce_op::avg, 1};
      compress::powersgd p({.start_iter = 0});
      compress::onebit o({.warmup = 0});
      CHECK_THROWS_WITH_AS(p.all_reduce(comm, b), doctest::Contains("does not fit in the bucket's 16 elements"), trident::usage_error);
      CHECK_THROWS_WITH_AS(o.all_reduce(comm, b), doctest::Contains("does not fit in the bucket's 16 elements"), trident::usage_error);
    }
  });
  // 1-bit Adam's step checks its sizes as every optimizer does.
  std::vector<float> params(8, 1.0f), grads(2, 0.5f), m(3), v(8);
  CHECK_THROWS_WITH_AS(compress::onebit_adam{}.step(std::span<float>(params), grads, {std::span<float>(m), std::span<float>(v)}, 1),
                       doctest::Contains("8 parameters but 2 gradients"), trident::usage_error);
  grads.resize(8);
  CHECK_THROWS_WITH_AS(compress::onebit_adam{}.step(std::span<float>(params), grads, {std::span<float>(m), std::span<float>(v)}, 1),
                       doctest::Contains("state 0 has 3 elements, expected 8"), trident::usage_error);
}

