#pragma once
// Splitting layers into pipeline stages (issue 12): contiguous stages whose slowest one is as
// fast as it can be, given each layer's cost (measured or estimated).
//
//   struct partition        first layer of each stage (and one past the last), the cost of each
//                           stage and of the slowest
//   balanced(costs, p)      the contiguous split into p non-empty stages that minimises the
//                           slowest stage: exact (dynamic programming over prefix sums,
//                           O(p n^2)); ties are broken the same way every time (each stage,
//                           from the last, starts as early as an optimal split allows)
//   even(layers, p)         layers / p per stage, the remainder to the first stages (what a user
//                           splitting by hand would do), for comparison
//
//   auto part = trident::pipeline::balanced({1, 1, 4, 1, 1, 4, 1, 1}, 3);
//   part.bounds;   // {0, 2, 5, 8}: stages [0, 2), [2, 5), [5, 8) (the later stages start early)
//   part.slowest;  // 6
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "trident/core/error.hpp"

namespace trident::pipeline {

struct partition {
  std::vector<std::size_t> bounds;  // stage s holds layers [bounds[s], bounds[s + 1])
  std::vector<double> stage_costs;
  double slowest = 0;
  std::size_t stages() const noexcept { return bounds.empty() ? 0 : bounds.size() - 1; }
};

namespace detail {
inline partition with_costs(std::vector<std::size_t> bounds, const std::vector<double>& costs) {
  partition p{std::move(bounds), {}, 0};
  for (std::size_t s = 0; s + 1 < p.bounds.size(); ++s) {
    double c = 0;
    for (std::size_t l = p.bounds[s]; l < p.bounds[s + 1]; ++l) c += costs[l];
    p.stage_costs.push_back(c);
    p.slowest = std::max(p.slowest, c);
  }
  return p;
}
inline void check_partition(const char* who, const std::vector<double>& costs, int p) {
  TRIDENT_EXPECT(p >= 1, who, ": ", p, " stages; expected at least 1");
  TRIDENT_EXPECT(costs.size() >= static_cast<std::size_t>(p), who, ": ", costs.size(), " layers cannot fill ", p,
                 " non-empty stages");
  double total = 0;
  for (std::size_t l = 0; l < costs.size(); ++l) {
    TRIDENT_EXPECT(std::isfinite(costs[l]) && costs[l] >= 0, who, ": layer ", l, " costs ", costs[l],
                   "; expected a finite, non-negative cost");
    total += costs[l];
  }
  // The stages' costs are differences of running sums: a total that overflows to inf made
  // every split look alike (empty stages came back).
  TRIDENT_EXPECT(std::isfinite(total), who, ": the layers' costs add up to more than a double holds (", total,
                 "); scale them down");
}
}  // namespace detail

//! The contiguous split of the layers into p non-empty stages whose slowest stage is cheapest.
inline partition balanced(const std::vector<double>& costs, int p) {
  detail::check_partition("pipeline::balanced", costs, p);
  const std::size_t n = costs.size(), stages = static_cast<std::size_t>(p);
  std::vector<double> prefix(n + 1, 0.0);
  for (std::size_t l = 0; l < n; ++l) prefix[l + 1] = prefix[l] + costs[l];
  constexpr double inf = std::numeric_limits<double>::infinity();
  // best[k][j]: the cheapest slowest stage splitting layers [0, j) into k stages; cut[k][j]: the
  // first layer of the k-th stage in that split (the smallest such, for one answer).
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<std::size_t>> cut(stages + 1, std::vector<std::size_t>(n + 1, 0));
  best[0][0] = 0;
  for (std::size_t k = 1; k <= stages; ++k)
    for (std::size_t j = k; j <= n; ++j)
      for (std::size_t i = k - 1; i < j; ++i) {
        const double slowest = std::max(best[k - 1][i], prefix[j] - prefix[i]);
        if (slowest < best[k][j]) {
          best[k][j] = slowest;
          cut[k][j] = i;
        }
      }
  std::vector<std::size_t> bounds(stages + 1, 0);
  bounds[stages] = n;
  for (std::size_t k = stages; k > 0; --k) bounds[k - 1] = cut[k][bounds[k]];
  return detail::with_costs(std::move(bounds), costs);
}

//! layers / p per stage, the first layers % p stages one more.
inline partition even(const std::vector<double>& costs, int p) {
  detail::check_partition("pipeline::even", costs, p);
  const std::size_t n = costs.size(), stages = static_cast<std::size_t>(p);
  std::vector<std::size_t> bounds{0};
  for (std::size_t s = 0; s < stages; ++s) bounds.push_back(bounds.back() + n / stages + (s < n % stages ? 1 : 0));
  return detail::with_costs(std::move(bounds), costs);
}

}  // namespace trident::pipeline
