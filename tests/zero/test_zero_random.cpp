// Random models and call sequences for zero_optimizer on thread ranks (issue 17): legal ones must
// train like one rank on the global batch (and stages 0-3 alike, bit for bit with one micro-batch
// per step, within 1e-5 with several: stages 2-3 sum them in another order). Then, in every stage,
// two mistakes:
//   * grad_ready twice for a random layer, on one rank or all: the rank that makes it gets a
//     usage_error naming grad_ready(layer); a rank that does not (or that has not got to it yet)
//     gets the thread backend's error naming the failed rank; run() rethrows the usage_error;
//   * one rank touches the layers in another order (data-dependent control flow) in a model whose
//     buckets are all the same size, prefetch off: no collective can tell, so step() must throw
//     the same usage_error on every rank, naming the order and the rank, and apply nothing (a
//     legal step afterwards gives what one legal step from the start gives).
// Seeded and budgeted: TRIDENT_RANDOM_EPISODES (default 12) from TRIDENT_RANDOM_SEED (default 1);
// episode i of seed s is seeded with the pair (s, i), so the runs of different seeds never repeat
// each other's episodes.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "trident/comm/local.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"
#include "zero/zero_training.hpp"

namespace zero = trident::zero;
namespace toy = zero_training::toy;
using zero_training::for_each_stage;

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

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// What one rank threw.
struct outcome {
  enum kind_t { nothing, usage_error, error, other } kind = nothing;
  std::string what;
};

// Runs f, writing what it throws (if anything) to `out`, and rethrows it.
template <class F>
void recorded(outcome& out, F&& f) {
  try {
    f();
  } catch (const trident::usage_error& e) {
    out = {outcome::usage_error, e.what()};
    throw;
  } catch (const trident::error& e) {
    out = {outcome::error, e.what()};
    throw;
  } catch (const std::exception& e) {
    out = {outcome::other, e.what()};
    throw;
  }
}

// Mistake 1: a random layer with tensors marked ready twice, by one rank or by all.
template <int Stage>
void grad_ready_twice(const episode& e, std::mt19937_64& rng) {
  const auto& tensors = e.spec.tensors();
  const int layer = tensors[std::uniform_int_distribution<std::size_t>(0, tensors.size() - 1)(rng)].layer;
  const int culprit = std::uniform_int_distribution<int>(-1, e.ranks - 1)(rng);  // -1: every rank
  INFO("stage ", Stage, ": grad_ready(", layer, ") twice on ", culprit < 0 ? std::string("every rank") : "rank " + std::to_string(culprit));
  std::vector<outcome> seen(static_cast<std::size_t>(e.ranks));
  outcome rethrown;
  try {
    trident::local_options options;
    options.timeout = std::chrono::seconds(60);
    trident::local_world::run(e.ranks, [&](trident::local_comm& comm) {
      recorded(seen[static_cast<std::size_t>(comm.rank())], [&] {
        toy::walk how = e.how;
        const bool mine = culprit < 0 || culprit == comm.rank();
        zero::zero_optimizer<Stage, trident::optim::sgd, trident::local_comm> z(comm, e.spec, trident::optim::sgd{{.lr = 0.1f}},
                                                                                 e.options);
        how.after_ready = [&](int l) {
          if (mine && l == layer) z.grad_ready(l);
        };
        toy::initialise(z, e.spec);
        toy::step_samples(comm, z, e.spec, 0, how);
        z.step();
      });
    }, options);
  } catch (...) {
    try {
      recorded(rethrown, [] { throw; });
    } catch (...) {
    }
  }
  const std::string named = trident::detail::concat("grad_ready(", layer, "): layer ", layer, " was already marked ready");
  // run() rethrows the root cause: the usage_error of a rank that made the mistake.
  INFO("run() rethrew: ", rethrown.what);
  CHECK(rethrown.kind == outcome::usage_error);
  CHECK(contains(rethrown.what, named));
  int named_it = 0;
  for (int r = 0; r < e.ranks; ++r) {
    const auto& o = seen[static_cast<std::size_t>(r)];
    INFO("rank ", r, " threw: ", o.what);
    const bool made_it = culprit < 0 || culprit == r;
    if (o.kind == outcome::usage_error) {
      // Only a rank that made the mistake names it; it is the one error it may throw.
      CHECK(made_it);
      CHECK(contains(o.what, named));
      ++named_it;
    } else {
      // Aborted while waiting for a peer that failed: the thread backend's error names that peer.
      CHECK(o.kind == outcome::error);
      CHECK(contains(o.what, culprit < 0 ? std::string("aborted because rank ")
                                         : trident::detail::concat("aborted because rank ", culprit, " failed: ")));
      CHECK(!(culprit >= 0 && made_it));  // the lone culprit is never aborted before its own mistake
    }
  }
  CHECK(named_it >= 1);
}

// Mistake 2: ranks touch the layers in different orders. Every bucket holds one layer of the same
// size, so each collective matches one of the same size and kind on every rank (the thread
// backend compares kind, size, type, op and root): only step() can tell.
struct order_episode {
  trident::model_spec spec;
  zero::zero_options options;
  int ranks = 2;
  int culprit = 0;
  std::vector<int> order, other_order;  // forward orders (backward is the reverse): everyone, the culprit
  int with_tensors = 0;
  std::string text;
};

order_episode make_order_episode(std::mt19937_64& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  order_episode o;
  o.ranks = pick(2, 4);
  o.with_tensors = pick(2, 4);
  std::vector<bool> has(static_cast<std::size_t>(o.with_tensors), true);
  has.resize(has.size() + static_cast<std::size_t>(pick(0, 2)), false);  // layers without tensors
  std::shuffle(has.begin(), has.end(), rng);
  while (!has.back()) has.pop_back();  // a model's last layer is its last layer with tensors
  const std::size_t numel = static_cast<std::size_t>(pick(2, 80));
  for (std::size_t l = 0; l < has.size(); ++l) {
    if (!has[l]) continue;
    const int layer = static_cast<int>(l);
    if (pick(0, 1) == 0) {
      o.spec.add("l" + std::to_string(l), {numel}, layer);
    } else {  // two tensors that fill the bucket together
      const std::size_t first = static_cast<std::size_t>(pick(1, static_cast<int>(numel) - 1));
      o.spec.add("l" + std::to_string(l) + ".a", {first}, layer);
      o.spec.add("l" + std::to_string(l) + ".b", {numel - first}, layer);
    }
  }
  o.options.bucket_bytes = numel * sizeof(float);
  o.options.first_bucket_bytes = numel * sizeof(float);
  o.options.persistence_threshold = 0;  // stage 3 gathers every bucket
  o.options.prefetch = false;           // with it, stage 3 would gather one bucket more on some rank
  o.options.average = pick(0, 1) == 1;
  o.culprit = pick(0, o.ranks - 1);
  for (int l = 0; l < static_cast<int>(has.size()); ++l) o.order.push_back(l);
  std::shuffle(o.order.begin(), o.order.end(), rng);
  auto layers_with_tensors = [&](const std::vector<int>& order) {
    std::vector<int> out;
    for (int l : order)
      if (has[static_cast<std::size_t>(l)]) out.push_back(l);
    return out;
  };
  o.other_order = o.order;
  while (layers_with_tensors(o.other_order) == layers_with_tensors(o.order)) std::shuffle(o.other_order.begin(), o.other_order.end(), rng);
  auto text_of = [](const std::vector<int>& order) {
    std::string t;
    for (int l : order) t += (t.empty() ? "" : " ") + std::to_string(l);
    return t;
  };
  o.text = trident::detail::concat(o.spec.tensors().size(), " tensors on ", has.size(), " layers, buckets of ", numel, " elements, ",
                                   o.ranks, " ranks; forward ", text_of(o.order), ", rank ", o.culprit, ": ",
                                   text_of(o.other_order));
  return o;
}

template <int Stage>
void different_orders(const order_episode& o) {
  INFO("stage ", Stage, ": ", o.text);
  using optimizer = zero::zero_optimizer<Stage, trident::optim::sgd, trident::local_comm>;
  const trident::optim::sgd sgd{{.lr = 0.1f, .momentum = 0.9f}};
  std::vector<outcome> seen(static_cast<std::size_t>(o.ranks));
  trident::local_options options;
  options.timeout = std::chrono::seconds(60);
  trident::local_world::run(o.ranks, [&](trident::local_comm& comm) {
    const auto expected = toy::train<Stage>(comm, o.spec, sgd, o.options, 1);
    optimizer z(comm, o.spec, sgd, o.options);
    CHECK(static_cast<int>(z.layout().buckets().size()) == o.with_tensors);  // one layer per bucket, all alike
    toy::initialise(z, o.spec);
    toy::walk data_dependent;
    data_dependent.forward = comm.rank() == o.culprit ? o.other_order : o.order;
    try {
      recorded(seen[static_cast<std::size_t>(comm.rank())], [&] {
        toy::step_samples(comm, z, o.spec, 0, data_dependent);
        z.step();
      });
    } catch (const trident::usage_error&) {  // every rank throws it, so the world goes on
    }
    // Nothing was applied: the same step in the same order now gives what it gives from the start.
    toy::step_samples(comm, z, o.spec, 0);
    z.step();
    CHECK(toy::parameters(z, o.spec) == expected);
  }, options);
  // The first rank whose sequence differs from rank 0's: the culprit, or rank 1 if rank 0 is it.
  const int named = o.culprit == 0 ? 1 : o.culprit;
  for (int r = 0; r < o.ranks; ++r) {
    const auto& got = seen[static_cast<std::size_t>(r)];
    INFO("rank ", r, " threw: ", got.what);
    CHECK(got.kind == outcome::usage_error);
    CHECK(contains(got.what, "step: the ranks issued their bucket collectives in different orders"));
    CHECK(contains(got.what, trident::detail::concat(" on rank ", named, ", so data of one bucket went into another")));
    CHECK(contains(got.what, "Nothing was applied"));
    CHECK(got.what == seen[0].what);  // the same verdict everywhere
  }
}

}  // namespace

TEST_CASE("random models and sequences: every stage trains like one rank; mistakes fail on every rank, in every stage") {
  const auto seed = static_cast<std::uint64_t>(env_or("TRIDENT_RANDOM_SEED", 1));
  const auto episodes = env_or("TRIDENT_RANDOM_EPISODES", 12);
  int mistakes = 0;
  for (long long i = 0; i < episodes; ++i) {
    // The pair (seed, episode), not seed * k + episode: seeds s and s + 1 would share episodes.
    const auto episode_number = static_cast<std::uint64_t>(i);
    std::seed_seq seeds{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                        static_cast<std::uint32_t>(episode_number), static_cast<std::uint32_t>(episode_number >> 32)};
    std::mt19937_64 rng(seeds);
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

    // The same episode with one mistake, in every stage.
    for_each_stage([&](auto stage) {
      grad_ready_twice<decltype(stage)::value>(e, rng);
      ++mistakes;
    });
    const order_episode o = make_order_episode(rng);
    for_each_stage([&](auto stage) {
      different_orders<decltype(stage)::value>(o);
      ++mistakes;
    });
  }
  CHECK(mistakes == 8 * episodes);
}
