// The parameter server (parallel/ps/parameter_server.hpp) on thread ranks: synchronous equals
// data parallelism bit for bit; staleness 0 equals synchronous; staleness s keeps every pull at
// most s steps behind and, with stragglers, finishes sooner; bad input is an error.
#include <doctest/doctest.h>

#include "ps/ps_suite.hpp"

using trident::local_comm;
using trident::local_world;
namespace optim = trident::optim;
namespace ps = trident::ps;

namespace {

optim::sgd sgd() {
  optim::sgd o;
  o.opt.lr = 0.05f;
  o.opt.momentum = 0.9f;
  return o;
}
optim::adamw adamw() {
  optim::adamw o;
  o.opt.lr = 3e-3f;
  return o;
}

// The model after training, assembled from the servers' shards (rank order is shard order).
template <class Opt>
std::vector<float> model_after(int servers, int workers, Opt opt, ps::options o, int steps) {
  const auto all = local_world::run(servers + workers, [&](local_comm& c) {
    return ps_suite::train(c, servers, opt, o, steps, ps_suite::no_delay).shard;
  });
  std::vector<float> out;
  for (int k = 0; k < servers; ++k) out.insert(out.end(), all[static_cast<std::size_t>(k)].begin(), all[static_cast<std::size_t>(k)].end());
  return out;
}

}  // namespace

TEST_CASE("ps: synchronous equals data parallelism bit for bit (SGD with momentum, AdamW; 1 and 2 servers)") {
  for (int servers : {1, 2}) {
    CAPTURE(servers);
    CHECK(model_after(servers, 3, sgd(), {}, 6) == ps_suite::data_parallel(3, sgd(), 6));
    CHECK(model_after(servers, 4, adamw(), {}, 6) == ps_suite::data_parallel(4, adamw(), 6));
  }
}

TEST_CASE("ps: staleness 0 equals synchronous bit for bit") {
  CHECK(model_after(2, 3, adamw(), {.staleness = 0}, 8) == model_after(2, 3, adamw(), {}, 8));
  CHECK(model_after(1, 4, sgd(), {.staleness = 0}, 8) == model_after(1, 4, sgd(), {}, 8));
}

TEST_CASE("ps: bounded staleness keeps pulls at most s steps behind and lets stragglers overlap") {
  const int steps = 40, workers = 4;
  auto run = [&](ps::options o) {
    return local_world::run(1 + workers, [&](local_comm& c) { return ps_suite::train(c, 1, adamw(), o, steps, ps_suite::stragglers); });
  };
  const auto sync = run({});
  const auto stale = run({.staleness = 2});
  double sync_time = 0, stale_time = 0;
  for (int w = 1; w <= workers; ++w) {
    const auto& s = sync[static_cast<std::size_t>(w)];
    const auto& a = stale[static_cast<std::size_t>(w)];
    for (int t = 0; t < steps; ++t) {
      CHECK(s.versions[static_cast<std::size_t>(t)] == t);
      CHECK(a.versions[static_cast<std::size_t>(t)] >= t - 2);
      CHECK(a.versions[static_cast<std::size_t>(t)] <= t);
    }
    CHECK(a.last_loss < a.first_loss);
    sync_time = std::max(sync_time, s.seconds);
    stale_time = std::max(stale_time, a.seconds);
  }
  MESSAGE("stragglers (8 ms on a quarter of the steps), 4 workers, 40 steps: synchronous ", sync_time, " s, staleness 2 ",
          stale_time, " s");
  CHECK(stale_time < 0.8 * sync_time);
}

TEST_CASE("ps: bad input is a usage error naming it") {
  local_world::run(3, [](local_comm& c) {
    const auto init = ps_suite::initial();
    using P = ps::parameter_server<local_comm, optim::sgd>;
    CHECK_THROWS_WITH_AS(P(c, 3, init, sgd()), doctest::Contains("3 servers in a world of 3 ranks"), trident::usage_error);
    CHECK_THROWS_WITH_AS(P(c, 0, init, sgd()), doctest::Contains("0 servers"), trident::usage_error);
    CHECK_THROWS_WITH_AS(P(c, 1, init, sgd(), {.staleness = -1}), doctest::Contains("staleness -1"), trident::usage_error);
    P ps(c, 1, init, sgd());
    std::vector<float> wrong(init.size() + 1);
    if (ps.serving()) {
      CHECK_THROWS_WITH_AS(ps.pull(wrong), doctest::Contains("a server; call serve() there"), trident::usage_error);
    } else {
      CHECK_THROWS_WITH_AS(ps.push(wrong), doctest::Contains("elements; expected the model's"), trident::usage_error);
      CHECK_THROWS_WITH_AS(ps.serve(1), doctest::Contains("a worker; call pull() and push() there"), trident::usage_error);
    }
  });
}

TEST_CASE("ps: a worker that pushes before pulling, or pulls twice, is told at once (it waited for the timeout)") {
  for (const ps::options o : {ps::options{}, ps::options{.staleness = 1}}) {
    local_world::run(3, [&](local_comm& c) {
      const auto init = ps_suite::initial();
      ps::parameter_server<local_comm, optim::sgd> ps(c, 1, init, sgd(), o);
      if (ps.serving()) {
        ps.serve(1);
        return;
      }
      std::vector<float> params(init.size()), grad(init.size(), 0.5f);
      CHECK_THROWS_WITH_AS(ps.push(grad), doctest::Contains("no pull() before it"), trident::usage_error);
      ps.pull(params);
      CHECK(params == init);
      CHECK_THROWS_WITH_AS(ps.pull(params), doctest::Contains("pulled again without a push"), trident::usage_error);
      ps.push(grad);  // the step goes on: the server's one step completes
    });
  }
}
