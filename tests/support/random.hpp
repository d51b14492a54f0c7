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

//! n values in [-scale, scale) from a seed by splitmix64: the same on every rank, platform and
//! compiler (no <random> distribution involved), so every rank can generate a whole tensor
//! and take its part.
inline std::vector<float> splitmix_vector(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (auto& x : v) {
    s += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x = scale * (static_cast<float>(z >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
  }
  return v;
}

}  // namespace test_support
