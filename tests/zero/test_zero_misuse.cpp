// zero_optimizer and flat_layout under bad input (issue 17) on thread ranks: every mistake is a
// clear usage_error on every rank, before anything is corrupted, and never a crash or a hang;
// input that is legal (layers without tensors) trains exactly like one rank. The bodies shared
// with MPI are in misuse_suite.hpp; here also what only the thread backend can show: one rank's
// mistake failing its peers at once, and errors of communication still in flight.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "trident/comm/local.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"
#include "zero/misuse_suite.hpp"

using trident::local_comm;
using trident::local_world;
namespace zero = trident::zero;
namespace optim = trident::optim;
namespace toy = zero_training::toy;
using misuse_suite::buckets_of;
using misuse_suite::contains;
using misuse_suite::for_each_stage;
using misuse_suite::sgd;
using misuse_suite::three_layers;

namespace {

// What one rank ended with.
struct outcome {
  bool threw = false, usage = false;
  std::string what;
};
struct world_outcome {
  std::vector<outcome> ranks;
  std::string root_cause;  // what run() rethrew, if it was a usage_error
};

// Runs fn on n thread ranks, each of which must end in an exception, within seconds: nobody
// hangs. run() must rethrow the root cause, a usage_error.
template <class Fn>
world_outcome fails_everywhere(int n, Fn fn) {
  world_outcome out;
  out.ranks.resize(static_cast<std::size_t>(n));
  trident::local_options options;
  options.timeout = std::chrono::seconds(60);
  const auto start = std::chrono::steady_clock::now();
  try {
    local_world::run(
        n,
        [&](local_comm& comm) {
          auto& me = out.ranks[static_cast<std::size_t>(comm.rank())];
          try {
            fn(comm);
          } catch (const trident::usage_error& e) {
            me = {true, true, e.what()};
            throw;
          } catch (const std::exception& e) {
            me = {true, false, e.what()};
            throw;
          }
        },
        options);
  } catch (const trident::usage_error& e) {
    out.root_cause = e.what();
  } catch (...) {
  }
  CHECK(!out.root_cause.empty());
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
  for (std::size_t r = 0; r < out.ranks.size(); ++r) {
    INFO("rank ", r);
    CHECK(out.ranks[r].threw);
  }
  return out;
}

}  // namespace

TEST_CASE("zero misuse: grad_ready twice for a layer alone in its bucket, by every rank: usage_error, nothing reduced twice") {
  for (int n : {1, 2, 3})
    for_each_stage([&](auto stage) {
      INFO("stage ", stage.value, ", ", n, " ranks");
      local_world::run(n, [](local_comm& c) { misuse_suite::grad_ready_twice<decltype(stage)::value>(c); });
    });
}

TEST_CASE("zero misuse: grad_ready twice by one rank only: the same usage_error there, the others fail at once naming it") {
  for_each_stage([](auto stage) {
    constexpr int Stage = decltype(stage)::value;
    INFO("stage ", Stage);
    auto options = buckets_of(32);
    options.average = false;
    const auto spec = three_layers();
    std::mutex mutex;
    std::vector<std::string> lost;  // what the peers' destructors could not throw
    options.on_destructor_error = [&](const std::string& what) {
      std::lock_guard lock(mutex);
      lost.push_back(what);
    };
    const auto out = fails_everywhere(3, [&](local_comm& comm) {
      toy::walk how;
      zero::zero_optimizer<Stage, optim::sgd, local_comm> z(comm, spec, sgd(), options);
      toy::initialise(z, spec);
      how.after_ready = [&](int layer) {
        if (comm.rank() == 1 && layer == 2) z.grad_ready(2);
      };
      toy::micro_batch(comm, z, spec, static_cast<std::size_t>(comm.rank()) * 4, 4, 4, how);
      z.step();
    });
    // Rank 1 throws the usage_error, which run() rethrows; the others fail at once with a
    // trident::error naming rank 1. (What the thread backend tells them of rank 1's failure is
    // its business: the usage_error's text, or that an exception left rank 1 with asynchronous
    // work queued.)
    for (const auto& what : {out.ranks[1].what, out.root_cause}) {
      INFO(what);
      CHECK(contains(what, "grad_ready(2): layer 2 was already marked ready"));
      CHECK(contains(what, "bucket 2 of 3 (layers 2..2)"));
    }
    CHECK(out.ranks[1].usage);
    for (int r : {0, 2}) {
      INFO(out.ranks[static_cast<std::size_t>(r)].what);
      CHECK(contains(out.ranks[static_cast<std::size_t>(r)].what, "rank 1 failed"));
      CHECK(!contains(out.ranks[static_cast<std::size_t>(r)].what, "float64"));  // not an unrelated mismatch
    }
    // Reductions the peers had queued fail in their destructors: reported, naming the cause.
    for (const auto& what : lost) CHECK(contains(what, "rank 1 failed"));
  });
}

TEST_CASE("zero misuse: zero_options out of range is a usage_error at construction naming the option and the value") {
  local_world::run(1, [](local_comm& comm) {
    const auto spec = three_layers();
    auto make = [&](zero::zero_options o) { zero::zero_optimizer<2, optim::sgd, local_comm> z(comm, spec, sgd(), o); };
    zero::zero_options o;
    o.max_grad_norm = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH_AS(make(o), doctest::Contains("zero_options::max_grad_norm = nan; expected 0 (no clipping) or a positive norm"), trident::usage_error);
    o.max_grad_norm = -1.0f;
    CHECK_THROWS_WITH_AS(make(o), doctest::Contains("zero_options::max_grad_norm = -1;"), trident::usage_error);
    o.max_grad_norm = std::numeric_limits<float>::infinity();  // never clips, as in PyTorch
    CHECK_NOTHROW(make(o));
    o = {};
    o.bucket_bytes = 0;
    CHECK_THROWS_WITH_AS(make(o), doctest::Contains("zero_options::bucket_bytes = 0; expected at least one element (4 bytes)"), trident::usage_error);
    o = {};
    o.first_bucket_bytes = 3;
    CHECK_THROWS_WITH_AS(make(o), doctest::Contains("zero_options::first_bucket_bytes = 3; expected at least one element (4 bytes)"), trident::usage_error);
  });
}

TEST_CASE("zero misuse: bad hyperparameters are a usage_error at construction on every rank, naming the value") {
  local_world::run(2, [](local_comm& comm) {
    const auto spec = three_layers();
    optim::sgd bad_lr = sgd();
    bad_lr.opt.lr = std::numeric_limits<float>::quiet_NaN();
    const std::string expected = "zero_optimizer on rank " + std::to_string(comm.rank()) + " (step 1): sgd: lr = nan is out of range";
    CHECK_THROWS_WITH_AS((zero::zero_optimizer<2, optim::sgd, local_comm>(comm, spec, bad_lr)), doctest::Contains(expected.c_str()),
                         trident::usage_error);
    bad_lr.opt.lr = -0.1f;
    CHECK_THROWS_WITH_AS((zero::zero_optimizer<0, optim::sgd, local_comm>(comm, spec, bad_lr)),
                         doctest::Contains("lr = -0.1 is out of range"), trident::usage_error);
    optim::adamw bad_beta;
    bad_beta.opt.beta2 = 1.0f;
    CHECK_THROWS_WITH_AS((zero::zero_optimizer<3, optim::adamw, local_comm>(comm, spec, bad_beta)),
                         doctest::Contains("beta2 = 1 is out of range; expected a finite value in [0, 1)"), trident::usage_error);
  });
}

TEST_CASE("zero misuse: grad_ready twice inside a bucket of several layers; stages 0-1 reducing a bucket twice in a step") {
  for_each_stage([](auto stage) {
    INFO("stage ", stage.value);
    local_world::run(2, [](local_comm& c) { misuse_suite::grad_ready_twice_in_shared_bucket<decltype(stage)::value>(c); });
  });
}

TEST_CASE("zero misuse: layers without tensors are legal and train exactly like one rank on the global batch") {
  const auto models = misuse_suite::empty_layer_models();
  for (std::size_t m = 0; m < models.size(); ++m)
    for (bool skip_empty : {false, true}) {
      toy::walk how;
      how.skip_empty = skip_empty;
      const auto options = buckets_of(models[m].bucket_elements);
      const auto serial = local_world::run(1, [&](local_comm& c) { return toy::train<0>(c, models[m].spec, sgd(), options, 4, how); })[0];
      for (int n : {1, 2, 3}) {
        INFO("model ", m, (skip_empty ? ", empty layers skipped" : ", empty layers marked ready"), ", ", n, " ranks");
        const auto stage0 = local_world::run(n, [&](local_comm& c) { return toy::train<0>(c, models[m].spec, sgd(), options, 4, how); })[0];
        for_each_stage([&](auto stage) {
          local_world::run(n, [&](local_comm& c) {
            misuse_suite::layers_without_tensors<decltype(stage)::value>(c, models[m], skip_empty, serial, stage0);
          });
        });
      }
    }
}

TEST_CASE("zero misuse: ranks that touch layers in different orders get a usage_error naming both buckets, and nothing moves") {
  for (int n : {2, 3})
    for_each_stage([&](auto stage) {
      INFO("stage ", stage.value, ", ", n, " ranks");
      local_world::run(n, [](local_comm& c) { misuse_suite::different_orders<decltype(stage)::value>(c); });
    });
}

TEST_CASE("zero misuse: stage 3 with prefetch, ranks in different orders: an all-gather meets a reduce-scatter, and every rank "
          "still gets the usage_error naming both buckets, within seconds, and goes on") {
  for (int n : {2, 3}) {
    INFO(n, " ranks");
    trident::local_options options;
    options.timeout = std::chrono::seconds(60);  // a rank left waiting would fail the test, not stall it
    const auto start = std::chrono::steady_clock::now();
    local_world::run(n, [](local_comm& c) { misuse_suite::different_orders<3>(c, true); }, options);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
  }
}

TEST_CASE("zero checked mode: gradients written after grad_ready are a usage_error at step() on every rank, naming rank and bucket") {
  for (bool old_span : {true, false})
    for_each_stage([&](auto stage) {
      INFO("stage ", stage.value, (old_span ? ", through a span held from before" : ", through a new gradients() call"));
      local_world::run(3, [&](local_comm& c) { misuse_suite::written_after_ready<decltype(stage)::value>(c, true, old_span); });
    });
  // Without checked mode, stages 2-3 still catch gradients of a micro-batch that is never reduced.
  local_world::run(3, [](local_comm& c) { misuse_suite::written_after_ready<2>(c, false, false); });
  local_world::run(3, [](local_comm& c) { misuse_suite::written_after_ready<3>(c, false, false); });
}

TEST_CASE("zero checked mode: a stage-3 parameters() span read after release() holds NaN, never another bucket's values") {
  for (int n : {1, 2}) local_world::run(n, [](local_comm& c) { misuse_suite::stale_parameters_read_nan(c); });
}

TEST_CASE("zero checked mode trains bit for bit like unchecked mode, with micro-batches too") {
  for (int n : {1, 3})
    for_each_stage([&](auto stage) {
      INFO("stage ", stage.value, ", ", n, " ranks");
      local_world::run(n, [](local_comm& c) { misuse_suite::checked_mode_is_exact<decltype(stage)::value>(c); });
    });
}

TEST_CASE("zero: handles resolve a tensor once and see the same memory as names") {
  for_each_stage([](auto stage) {
    INFO("stage ", stage.value);
    local_world::run(2, [](local_comm& c) { misuse_suite::handles<decltype(stage)::value>(c); });
  });
}

TEST_CASE("zero: an error in communication still in flight reaches finish(), or the destructor's hook, never nowhere") {
  const auto spec = three_layers();
  for (bool call_finish : {false, true}) {
    INFO((call_finish ? "finish() before destruction" : "destroyed with reductions in flight"));
    std::vector<std::string> lost, finish_errors;
    auto options = buckets_of(32);
    options.on_destructor_error = [&](const std::string& what) { lost.push_back(what); };  // rank 0 only reports
    CHECK_THROWS_WITH_AS(local_world::run(2,
                                          [&](local_comm& comm) {
                                            zero::zero_optimizer<2, optim::sgd, local_comm> z(comm, spec, sgd(), options);
                                            toy::walk how;
                                            how.backward = {2, 1};  // layer 0's gradients never come
                                            how.after_ready = [&](int layer) {
                                              if (comm.rank() == 1 && layer == 2) throw std::runtime_error("loss is NaN");
                                            };
                                            toy::step_samples(comm, z, spec, 0, how);
                                            // Rank 0 has bucket 1's reduction queued, which rank 1 never joins.
                                            // finish() throws the first failure; what it did
                                            // not wait for yet, a second call waits for.
                                            for (int calls = 0; call_finish && calls < 8; ++calls) {
                                              try {
                                                z.finish();
                                                break;
                                              } catch (const trident::error& e) {
                                                finish_errors.push_back(e.what());
                                              }
                                            }
                                          }),
                         "loss is NaN", std::runtime_error);
    // Each failure says that rank 1 failed (the thread backend may or may not add its reason).
    if (call_finish) {
      REQUIRE(!finish_errors.empty());
      for (const auto& what : finish_errors) CHECK(contains(what, "aborted because rank 1 failed"));
      CHECK(lost.empty());  // nothing was left for the destructor
    } else {
      REQUIRE(!lost.empty());
      for (const auto& what : lost) {
        CHECK(contains(what, "zero_optimizer destroyed with communication in flight, which failed"));
        CHECK(contains(what, "aborted because rank 1 failed"));
        CHECK(contains(what, "call finish()"));
      }
    }
  }
}
