#pragma once
// Reproducible random test data.
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace test_support {

//! n floats uniform in [lo, hi), the same for the same seed on every platform's libstdc++.
inline std::vector<float> random_vector(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace test_support
