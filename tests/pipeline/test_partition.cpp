// The stage partitioner: exact against a brute force over every split, never worse than an even
// split, bad input named.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "trident/parallel/pipeline/partition.hpp"

namespace pipeline = trident::pipeline;

namespace {
// The slowest stage of the best contiguous split, by trying every one.
double brute_force(const std::vector<double>& costs, int p) {
  double best = std::numeric_limits<double>::infinity();
  std::function<void(std::size_t, int, double)> go = [&](std::size_t from, int left, double worst) {
    if (left == 1) {
      double c = 0;
      for (std::size_t l = from; l < costs.size(); ++l) c += costs[l];
      best = std::min(best, std::max(worst, c));
      return;
    }
    double c = 0;
    for (std::size_t to = from + 1; to + static_cast<std::size_t>(left - 1) <= costs.size(); ++to) {
      c += costs[to - 1];
      go(to, left - 1, std::max(worst, c));
    }
  };
  go(0, p, 0.0);
  return best;
}
}  // namespace

TEST_CASE("pipeline partition: the slowest stage is as cheap as any contiguous split allows") {
  const auto part = pipeline::balanced({1, 1, 4, 1, 1, 4, 1, 1}, 3);
  CHECK(part.slowest == 6.0);
  CHECK(part.stages() == 3);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + rng() % 9;
    std::vector<double> costs(n);
    for (auto& c : costs) c = static_cast<double>(rng() % 10) + (trial % 3 == 0 ? 0.5 : 0.0);
    for (int p = 1; p <= static_cast<int>(std::min<std::size_t>(n, 4)); ++p) {
      CAPTURE(trial);
      CAPTURE(p);
      const auto b = pipeline::balanced(costs, p), e = pipeline::even(costs, p);
      CHECK(b.slowest == brute_force(costs, p));
      CHECK(b.slowest <= e.slowest);
      REQUIRE(b.bounds.size() == static_cast<std::size_t>(p) + 1);
      CHECK(b.bounds.front() == 0);
      CHECK(b.bounds.back() == n);
      for (int s = 0; s < p; ++s) CHECK(b.bounds[static_cast<std::size_t>(s)] < b.bounds[static_cast<std::size_t>(s) + 1]);
      CHECK(e.bounds.back() == n);
    }
  }
  CHECK_THROWS_WITH_AS(pipeline::balanced({1, 2}, 3), doctest::Contains("2 layers cannot fill 3 non-empty stages"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(pipeline::balanced({1, -2}, 1), doctest::Contains("layer 1 costs -2"), trident::usage_error);
  // Finite costs whose sum is not (it gave empty stages and a slowest of inf).
  CHECK_THROWS_WITH_AS(pipeline::balanced({1e308, 1e308, 1e308, 1e308}, 2), doctest::Contains("add up to more than a double holds"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(pipeline::even({1e308, 1e308}, 2), doctest::Contains("add up to more than a double holds"), trident::usage_error);
}
