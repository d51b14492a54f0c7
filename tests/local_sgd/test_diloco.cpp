// Local SGD and DiLoCo (parallel/local_sgd/diloco.hpp) on thread ranks, the MLP as the model,
// one rank per worker, on a network that counts bytes: H = 1 with an outer SGD of lr 1 is data
// parallelism; outer lr 1 without momentum is model averaging; H = 100 sends 100x fewer bytes
// than a gradient all-reduce per step; streaming DiLoCo sends one fragment at a time and its
// overlap hides the all-reduce behind inner steps on the simulated clock; bad options are errors.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "compress/compress_training.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/slow_link.hpp"
#include "trident/parallel/local_sgd/diloco.hpp"

using trident::local_comm;
using trident::local_world;
using net_type = trident::slow_link_comm<local_comm>;
namespace optim = trident::optim;
namespace local_sgd = trident::local_sgd;
namespace zero = trident::zero;

namespace {

optim::sgd plain_sgd(float lr = 0.05f) {
  optim::sgd o;
  o.opt.lr = lr;
  return o;
}

trident::cluster_map network(int n) {
  return trident::cluster_map::blocks(n, n % 2 == 0 ? n / 2 : 1, {.latency = 1e-5, .bandwidth = 1e10},
                                      {.latency = 0.05, .bandwidth = 1e7});
}

struct outcome {
  std::vector<float> parameters;  // rank's model after the run
  std::vector<double> losses;     // the workers' mean loss per step
  std::uint64_t across_bytes = 0; // what this rank sent between workers after construction
  double seconds = 0;             // simulated time
};

// `steps` steps of the MLP on rank c's rows of each batch (`ranks` ranks of 8 rows each), then
// `after()`; the losses averaged over every rank, the model, and what `net` counted.
template <class Zero, class After>
outcome run_steps(local_comm& c, Zero& z, int ranks, int steps, net_type& net, After after) {
  const mlp::dims d;
  outcome out;
  const std::size_t rows = 8;
  for (int s = 0; s < steps; ++s) {
    const std::size_t first = static_cast<std::size_t>(s) * rows * static_cast<std::size_t>(ranks) + static_cast<std::size_t>(c.rank()) * rows;
    std::vector<double> loss{mlp::train_step(z, d, first, rows, rows)};
    z.step();
    after();
    c.all_reduce(loss, trident::reduce_op::avg);
    out.losses.push_back(loss[0]);
  }
  for (auto p : local_sgd::parameters_of(z)) out.parameters.insert(out.parameters.end(), p.begin(), p.end());
  out.across_bytes = net.wire().total().bytes;
  out.seconds = net.now();
  return out;
}

// `steps` inner steps of each worker (one rank each: the inner optimizer is a ZeRO-0 optimizer on
// a communicator of one rank) on its own slice of the data, DiLoCo across the workers.
template <class Opt>
std::vector<outcome> train_diloco(int workers, Opt inner_opt, local_sgd::diloco_options o, int steps, bool count_compute = false) {
  return local_world::run(workers, [&](local_comm& c) {
    net_type across(c.split(0, c.rank()), network(workers), {.count_compute = count_compute});
    local_comm alone = c.split(c.rank(), 0);
    const mlp::dims d;
    zero::zero_optimizer<0, Opt, local_comm> inner(alone, mlp::spec(d), inner_opt, compress_training::options());
    mlp::initialise(inner, d);
    local_sgd::diloco<net_type> outer(across, local_sgd::parameters_of(inner), o);
    across.reset_wire();
    return run_steps(c, inner, workers, steps, across, [&] { outer.step(); });
  });
}

// Plain data parallelism over the same network: ZeRO-0 across all ranks.
template <class Opt>
outcome train_dp(int ranks, Opt opt, int steps) {
  return local_world::run(ranks, [&](local_comm& c) {
    net_type net(c.split(0, c.rank()), network(ranks), {.count_compute = false});
    const mlp::dims d;
    zero::zero_optimizer<0, Opt, net_type> z(net, mlp::spec(d), opt, compress_training::options());
    mlp::initialise(z, d);
    net.reset_wire();
    return run_steps(c, z, ranks, steps, net, [] {});
  })[0];
}

}  // namespace

TEST_CASE("diloco: H = 1 with an outer SGD of lr 1 is data parallelism") {
  local_sgd::diloco_options o;
  o.inner_steps = 1;
  o.outer = plain_sgd(1.0f);
  const auto diloco = train_diloco(4, plain_sgd(), o, 10);
  const auto dp = train_dp(4, plain_sgd(), 10);
  for (const auto& w : diloco) {
    CHECK(compress_training::max_relative_difference(w.parameters, dp.parameters) < 1e-5);
    for (std::size_t s = 0; s < dp.losses.size(); ++s) CHECK(w.losses[s] == doctest::Approx(dp.losses[s]).epsilon(1e-5));
  }
}

TEST_CASE("diloco: outer lr 1 without momentum averages the workers' models every H steps (local SGD)") {
  local_sgd::diloco_options o;
  o.inner_steps = 5;
  o.outer = plain_sgd(1.0f);
  const auto at_sync = train_diloco(3, plain_sgd(), o, 10);  // ends on a sync
  for (const auto& w : at_sync) CHECK(w.parameters == at_sync[0].parameters);
  const auto between = train_diloco(3, plain_sgd(), o, 12);  // two local steps after it
  CHECK(between[0].parameters != between[1].parameters);
  // At the sync every worker holds the mean of the models the workers reached on their own:
  // the same 5 steps with H = 1000 never sync, and average to it.
  local_sgd::diloco_options never = o;
  never.inner_steps = 1000;
  const auto once = train_diloco(3, plain_sgd(), o, 5);
  const auto apart5 = train_diloco(3, plain_sgd(), never, 5);
  std::vector<float> mean(apart5[0].parameters.size(), 0.0f);
  for (const auto& w : apart5)
    for (std::size_t i = 0; i < mean.size(); ++i) mean[i] += w.parameters[i];
  for (float& x : mean) x /= 3.0f;
  CHECK(apart5[0].parameters != apart5[1].parameters);
  CHECK(compress_training::max_relative_difference(once[0].parameters, mean) < 1e-6);
}

TEST_CASE("diloco: H = 100 sends at least 100x fewer bytes than data parallelism") {
  local_sgd::diloco_options o;
  o.inner_steps = 100;
  const int steps = 200;
  optim::adamw adamw;
  adamw.opt.lr = 3e-3f;
  const auto diloco = train_diloco(4, adamw, o, steps);
  const auto dp = train_dp(4, adamw, steps);
  const double ratio = static_cast<double>(dp.across_bytes) / static_cast<double>(diloco[0].across_bytes);
  MESSAGE("DiLoCo H = 100: ", ratio, "x fewer bytes than a gradient all-reduce per step; simulated time ", diloco[0].seconds,
          " s against ", dp.seconds, " s; final loss ", diloco[0].losses.back(), " against ", dp.losses.back());
  CHECK(ratio >= 100.0);
  CHECK(diloco[0].seconds * 50 < dp.seconds);
}

TEST_CASE("diloco: streaming sends one fragment at a time; overlap hides it behind inner steps") {
  local_sgd::diloco_options o;
  o.inner_steps = 8;
  o.fragments = 4;
  const int steps = 32;
  const auto whole = train_diloco(4, plain_sgd(), {.inner_steps = 8}, steps);
  const auto streaming = train_diloco(4, plain_sgd(), o, steps);
  // The same bytes in all (each fragment once per H steps), in four pieces.
  CHECK(streaming[0].across_bytes <= whole[0].across_bytes + 64);
  CHECK(streaming[0].across_bytes * 10 >= whole[0].across_bytes * 9);
  // Overlapped by 2 inner steps: the all-reduces finish behind compute (modelled: 0.3 s a step).
  auto timed = [&](local_sgd::diloco_options opts) {
    return local_world::run(4, [&](local_comm& c) {
      net_type across(c.split(0, c.rank()), network(4), {.count_compute = false});
      std::vector<float> model(4000, static_cast<float>(c.rank()));
      local_sgd::diloco<net_type> outer(across, {std::span<float>(model)}, opts);
      const auto ledger = trident::current_ledger();  // this thread's
      const auto made = ledger->allocations(trident::space_kind::host);
      for (int s = 0; s < steps; ++s) {
        across.advance(0.3);
        for (float& x : model) x += 0.001f;
        outer.step();
      }
      CHECK(ledger->allocations(trident::space_kind::host) == made);  // the constructor made every buffer
      return across.now();
    })[0];
  };
  auto overlapped = o;
  overlapped.overlap = 2;
  overlapped.mixing = 0.5f;
  const double blocking = timed(o), hidden = timed(overlapped);
  MESSAGE("streaming DiLoCo, 32 steps of 0.3 s: ", blocking, " s blocking, ", hidden, " s with overlap 2");
  CHECK(blocking > steps * 0.3 + 1.0);  // 16 syncs over a 50 ms link, each paid in full
  CHECK(hidden == doctest::Approx(steps * 0.3).epsilon(0.01));
}

TEST_CASE("diloco: a worker of k ranks sends each fragment across once, bitwise as each rank sending all of it") {
  // 2 workers (the clusters) of 2 data-parallel ranks each; the outer step either split over
  // the worker's ranks (inside) or done by each of them on the whole model.
  auto run = [](bool split) {
    return local_world::run(4, [&](local_comm& c) {
      net_type net(c.split(0, c.rank()), network(4), {.count_compute = false});
      auto inside = net.split(net.cluster(), net.rank());
      auto across = net.split(inside.rank(), net.cluster());
      const mlp::dims d;
      zero::zero_optimizer<1, optim::sgd, net_type> inner(inside, mlp::spec(d), plain_sgd(), compress_training::options());
      mlp::initialise(inner, d);
      local_sgd::diloco_options o;
      o.inner_steps = 3;
      o.fragments = 3;
      auto outer = split ? local_sgd::diloco<net_type>(across, inside, local_sgd::parameters_of(inner), o)
                         : local_sgd::diloco<net_type>(across, local_sgd::parameters_of(inner), o);
      net.reset_wire();
      const auto ledger = trident::current_ledger();
      for (int s = 0; s < 9; ++s) {
        mlp::train_step(inner, d, static_cast<std::size_t>(s * 32 + c.rank() * 8), 8, 8);
        inner.step();
        const auto made = ledger->allocations(trident::space_kind::host);
        outer.step();
        CHECK(ledger->allocations(trident::space_kind::host) == made);
      }
      outcome out;
      for (auto sp : local_sgd::parameters_of(inner)) out.parameters.insert(out.parameters.end(), sp.begin(), sp.end());
      out.across_bytes = net.wire().across.bytes;
      return out;
    });
  };
  const auto split = run(true), whole = run(false);
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(split[r].parameters == whole[r].parameters);
    CHECK(split[r].parameters == split[r & ~std::size_t{1}].parameters);  // the worker's ranks agree
  }
  std::uint64_t a = 0, b = 0;
  for (std::size_t r = 0; r < 4; ++r) {
    a += split[r].across_bytes;
    b += whole[r].across_bytes;
  }
  MESSAGE("across the slow link in 9 steps: ", a, " bytes split over the worker, ", b, " bytes whole");
  CHECK(2 * a <= b + 64);
  CHECK(2 * a + 64 >= b);
}

TEST_CASE("diloco: bad options are usage errors naming them") {
  local_world::run(2, [](local_comm& c) {
    std::vector<float> p(10);
    using D = local_sgd::diloco<local_comm>;
    CHECK_THROWS_WITH_AS(D(c, {std::span<float>(p)}, {.inner_steps = 0}), doctest::Contains("inner_steps (H) is 0"),
                         trident::usage_error);
    CHECK_THROWS_WITH_AS(D(c, {std::span<float>(p)}, {.inner_steps = 4, .fragments = 5}), doctest::Contains("5 fragments"),
                         trident::usage_error);
    CHECK_THROWS_WITH_AS(D(c, {std::span<float>(p)}, {.inner_steps = 4, .overlap = 4}), doctest::Contains("overlap 4"),
                         trident::usage_error);
    CHECK_THROWS_WITH_AS(D(c, {std::span<float>(p)}, {.inner_steps = 4, .mixing = 1.5f}), doctest::Contains("mixing 1.5"),
                         trident::usage_error);
    std::vector<float> two(2);
    CHECK_THROWS_WITH_AS(D(c, {std::span<float>(two)}, {.inner_steps = 4, .fragments = 3}), doctest::Contains("do not split"),
                         trident::usage_error);
    // Ranks that disagree (each option alone valid): every rank is told, naming the option.
    // Different H paired the all-reduces of different steps; a different outer lr or model size
    // ran on without an error.
    const int r = c.rank();
    CHECK_THROWS_WITH_AS(D(c, {std::span<float>(p)}, {.inner_steps = 2 + r}),
                         doctest::Contains("inner_steps is 3 on rank 1 and 2 on rank 0"), trident::usage_error);
    local_sgd::diloco_options lr;
    lr.outer.opt.lr = r == 0 ? 0.7f : 0.5f;
    CHECK_THROWS_WITH_AS(D(c, {std::span<float>(p)}, lr), doctest::Contains("outer lr is 0.5 on rank 1"), trident::usage_error);
    std::vector<float> sized(10 + static_cast<std::size_t>(r));
    CHECK_THROWS_WITH_AS(D(c, {std::span<float>(sized)}), doctest::Contains("parameters is 11 on rank 1 and 10 on rank 0"),
                         trident::usage_error);
    CHECK_NOTHROW(D(c, {std::span<float>(p)}, {.inner_steps = 4}));  // and the group still works
  });
}
