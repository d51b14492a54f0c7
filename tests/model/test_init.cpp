// Initialisation by global index (model/init.hpp): every division of a tensor gives the same
// values, so tensor-parallel ranks fill their parts directly and every t makes one model.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "trident/model/init.hpp"
#include "trident/model/sharding.hpp"

using trident::sharding;

TEST_CASE("init: every part of every division is the whole tensor's, padding zero") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::size_t> shape(1 + rng() % 3);
    for (auto& d : shape) d = 1 + rng() % 7;
    const std::size_t axis = rng() % shape.size();
    const int parts = 1 + static_cast<int>(rng() % 5);
    const auto s = trial % 2 ? sharding::split(shape, axis, parts) : sharding::split(shape, axis, parts, 2);
    const auto whole = trident::init_whole(shape, 42 + static_cast<std::uint64_t>(trial), trident::init_normal{0.5f, 2.0f});
    std::vector<float> rebuilt(whole.size(), NAN);
    for (int p = 0; p < parts; ++p) {
      std::vector<float> local(s.local_numel(), NAN);
      trident::init_part(s, p, 42 + static_cast<std::uint64_t>(trial), trident::init_normal{0.5f, 2.0f}, local);
      std::vector<float> expected(s.local_numel());
      trident::take_part<float>(s, p, whole, expected);  // the whole tensor's part, padding zero
      CAPTURE(trial);
      CHECK(local == expected);
      trident::put_part<float>(s, p, local, rebuilt);
    }
    CHECK(rebuilt == whole);
  }
}

TEST_CASE("init: the distributions have the moments they say, and seeds differ") {
  const auto n = trident::init_whole({200'000}, 7, trident::init_normal{0.0f, 0.02f});
  double sum = 0, squares = 0;
  for (float v : n) {
    sum += v;
    squares += static_cast<double>(v) * v;
  }
  const double mean = sum / static_cast<double>(n.size()), std = std::sqrt(squares / static_cast<double>(n.size()) - mean * mean);
  CHECK(std::abs(mean) < 0.02 * 0.01);
  CHECK(std::abs(std - 0.02) < 0.02 * 0.01);
  const auto u = trident::init_whole({100'000}, 7, trident::init_uniform{-1.0f, 3.0f});
  double usum = 0;
  for (float v : u) {
    CHECK_UNARY(v >= -1.0f);
    CHECK_UNARY(v < 3.0f);
    usum += v;
  }
  CHECK(std::abs(usum / static_cast<double>(u.size()) - 1.0) < 0.02);
  CHECK(trident::init_whole({4}, 1, trident::init_constant{1.0f}) == std::vector<float>(4, 1.0f));
  CHECK(trident::init_whole({64}, 1, trident::init_normal{}) != trident::init_whole({64}, 2, trident::init_normal{}));
  CHECK(trident::init_whole({64}, 1, trident::init_normal{}) == trident::init_whole({64}, 1, trident::init_normal{}));
  CHECK_THROWS_AS(trident::init_whole({4}, 1, trident::init_normal{0.0f, -1.0f}), trident::usage_error);
  CHECK_THROWS_AS(trident::init_whole({4}, 1, trident::init_uniform{2.0f, 1.0f}), trident::usage_error);
}
