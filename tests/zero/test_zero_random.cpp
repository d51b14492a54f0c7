// Random models and call sequences for zero_optimizer on thread ranks (issue 17): legal ones must
// train like one rank on the global batch (and stages 0-3 alike, bit for bit with one micro-batch
// per step, within 1e-5 with several: stages 2-3 sum them in another order); one mistake
// (grad_ready twice, on one rank or all) must end in a usage_error on every rank. Seeded and
// budgeted: TRIDENT_RANDOM_EPISODES (default 12) from TRIDENT_RANDOM_SEED (default 1).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "trident/comm/local.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"
#include "zero/zero_training.hpp"

namespace zero = trident::zero;
namespace toy = zero_training::toy;

namespace {

long long env_or(const char* name, long long fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : fallback;
}

struct episode {
  trident::model_spec spec;
  zero::zero_options options;
  int ranks = 1;
  int micro_batches = 1;
  int steps = 2;
  toy::walk how;
  std::string text;
};

episode make_episode(std::mt19937_64& rng) {
  episode e;
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int layers = pick(1, 6);
  int tensors = 0;
  for (int l = 0; l < layers; ++l) {
    const int here = (l < 2 && pick(0, 2) == 0) ? 0 : pick(0, 3);  // leading layers often empty
    for (int t = 0; t < here; ++t) {
      const std::size_t numel = static_cast<std::size_t>(pick(1, 300));
      e.spec.add("l" + std::to_string(l) + ".t" + std::to_string(t), {numel}, l);
      ++tensors;
    }
  }
  if (tensors == 0) e.spec.add("only", {static_cast<std::size_t>(pick(1, 50))}, layers - 1);
  const int rank_choices[] = {1, 2, 3, 4};
  e.ranks = rank_choices[pick(0, 3)];
  const int rows = static_cast<int>(toy::batch) / e.ranks;
  std::vector<int> divisors;
  for (int m = 1; m <= rows; ++m)
    if (rows % m == 0) divisors.push_back(m);
  e.micro_batches = divisors[static_cast<std::size_t>(pick(0, static_cast<int>(divisors.size()) - 1))];
  e.steps = pick(1, 3);
  const std::size_t bucket_elements[] = {1, 16, 64, 300, 5000};
  e.options.bucket_bytes = bucket_elements[pick(0, 4)] * sizeof(float);
  e.options.first_bucket_bytes = bucket_elements[pick(0, 4)] * sizeof(float);
  e.options.persistence_threshold = static_cast<std::size_t>(pick(0, 1) * 200);
  e.options.prefetch = pick(0, 1) == 1;
  e.options.average = true;
  // A random backward order: any order is legal when every rank uses the same one.
  e.how = toy::default_walk(e.spec);
  std::shuffle(e.how.backward.begin(), e.how.backward.end(), rng);
  e.how.skip_empty = pick(0, 1) == 1;
  e.text = trident::detail::concat(e.spec.tensors().size(), " tensors on ", e.spec.layers(), " layers, ", e.ranks, " ranks, ",
                                   e.micro_batches, " micro-batches, ", e.steps, " steps, buckets ", e.options.bucket_bytes,
                                   "/", e.options.first_bucket_bytes, " B");
  return e;
}

template <int Stage>
std::vector<float> train_on(const episode& e, int ranks) {
  std::vector<float> result;
  trident::local_world::run(ranks, [&](trident::local_comm& comm) {
    auto p = toy::train<Stage>(comm, e.spec, trident::optim::sgd{{.lr = 0.1f, .momentum = 0.9f}}, e.options, e.steps, e.how,
                               ranks == e.ranks ? e.micro_batches : 1);
    if (comm.rank() == 0) result = p;
  });
  return result;
}

}  // namespace

TEST_CASE("random models and sequences: every stage trains like one rank; grad_ready twice fails everywhere") {
  const auto seed = static_cast<std::uint64_t>(env_or("TRIDENT_RANDOM_SEED", 1));
  const auto episodes = env_or("TRIDENT_RANDOM_EPISODES", 12);
  int mistakes = 0;
  for (long long i = 0; i < episodes; ++i) {
    std::mt19937_64 rng(seed * 7919 + static_cast<std::uint64_t>(i));
    const episode e = make_episode(rng);
    INFO("seed ", seed, " episode ", i, ": ", e.text);
    const auto serial = train_on<0>(e, 1);
    const auto s0 = train_on<0>(e, e.ranks);
    const auto s1 = train_on<1>(e, e.ranks);
    const auto s2 = train_on<2>(e, e.ranks);
    const auto s3 = train_on<3>(e, e.ranks);
    CHECK(zero_training::relative_difference(s0, serial) < 1e-5);
    CHECK(s1 == s0);  // stages 0-1 reduce the accumulated gradients once per step
    if (e.micro_batches == 1) {
      CHECK(s2 == s0);
      CHECK(s3 == s0);
    } else {  // stages 2-3 reduce every micro-batch and add the reduced pieces: another order
      CHECK(zero_training::relative_difference(s2, s0) < 1e-5);
      CHECK(zero_training::relative_difference(s3, s0) < 1e-5);
    }

    // The same episode with one mistake: a rank marks a random layer with tensors ready twice.
    const auto& tensors = e.spec.tensors();
    const int layer = tensors[std::uniform_int_distribution<std::size_t>(0, tensors.size() - 1)(rng)].layer;
    const int culprit = std::uniform_int_distribution<int>(-1, e.ranks - 1)(rng);  // -1: every rank
    std::atomic<int> failed{0};
    bool usage_rethrown = false;
    try {
      trident::local_options options;
      options.timeout = std::chrono::seconds(60);
      trident::local_world::run(e.ranks, [&](trident::local_comm& comm) {
        toy::walk how = e.how;
        const bool mine = culprit < 0 || culprit == comm.rank();
        zero::zero_optimizer<2, trident::optim::sgd, trident::local_comm> z(comm, e.spec, trident::optim::sgd{{.lr = 0.1f}},
                                                                             e.options);
        how.after_ready = [&](int l) {
          if (mine && l == layer) z.grad_ready(l);
        };
        try {
          toy::initialise(z, e.spec);
          toy::step_samples(z, e.spec, 0, comm.rank(), comm.size(), how);
          z.step();
        } catch (...) {
          ++failed;
          throw;
        }
      }, options);
    } catch (const trident::usage_error& err) {
      usage_rethrown = std::string(err.what()).find("grad_ready") != std::string::npos;
    } catch (const std::exception&) {
    }
    CHECK(usage_rethrown);
    CHECK(failed == e.ranks);
    ++mistakes;
  }
  CHECK(mistakes == episodes);
}
