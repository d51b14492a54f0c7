#pragma once
// Initialisation that does not depend on how a tensor is divided: element i of a tensor (its
// row-major index in the global shape) takes its value from (seed, i) alone, through a
// counter-based generator, so a tensor-parallel rank fills its part directly, without making
// the whole tensor, and every tensor-parallel size gives the same model (and a checkpoint
// resharded to another layout finds the same values).
//
//   struct init_normal  { mean, std }       Box-Muller over two counter-based uniforms
//   struct init_uniform { low, high }       [low, high)
//   struct init_constant { value }          (LayerNorm weights: 1, biases: 0)
//   init_part(sharding, part, seed, dist, local)   this part's elements (padding zero)
//   init_whole(shape, seed, dist)                   the whole tensor (what init_part cuts from)
//
//   auto w = trident::sharding::split_exact({4 * h, h}, 0, t, "fc1.weight");
//   std::vector<float> mine(w.local_numel());
//   trident::init_part(w, rank, seed_of("fc1.weight"), trident::init_normal{0.0f, 0.02f}, mine);
//
// The generator is splitmix64 of (seed, index), the values are rounded from double once; they
// are the same on every platform, not the values torch.nn.init would draw (that depends on
// torch's generator and the order it is consumed in, which is a layout).
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/core/error.hpp"
#include "trident/model/sharding.hpp"

namespace trident {

//! Normal(mean, std), e.g. GPT-2's N(0, 0.02).
struct init_normal {
  float mean = 0.0f;
  float std = 0.02f;
};
//! Uniform on [low, high).
struct init_uniform {
  float low = 0.0f;
  float high = 1.0f;
};
//! Every element `value`.
struct init_constant {
  float value = 0.0f;
};

namespace detail {

TRIDENT_HOST_DEVICE constexpr std::uint64_t splitmix64(std::uint64_t z) noexcept {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// A uniform double in (0, 1) from (seed, index, stream): 53 random bits, never 0.
inline double counter_uniform(std::uint64_t seed, std::uint64_t index, std::uint64_t stream) noexcept {
  const std::uint64_t bits = splitmix64(splitmix64(seed ^ (stream * 0xD1B54A32D192ED03ull)) + index);
  return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
}

inline float init_value(const init_normal& d, std::uint64_t seed, std::uint64_t i) noexcept {
  const double u1 = counter_uniform(seed, i, 0), u2 = counter_uniform(seed, i, 1);
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  return static_cast<float>(static_cast<double>(d.mean) + static_cast<double>(d.std) * z);
}
inline float init_value(const init_uniform& d, std::uint64_t seed, std::uint64_t i) noexcept {
  const double u = counter_uniform(seed, i, 0) - 0x1.0p-54;  // [0, 1)
  return static_cast<float>(static_cast<double>(d.low) + (static_cast<double>(d.high) - d.low) * u);
}
inline float init_value(const init_constant& d, std::uint64_t, std::uint64_t) noexcept { return d.value; }

inline void check_distribution(const init_normal& d) {
  TRIDENT_EXPECT(std::isfinite(d.mean) && std::isfinite(d.std) && d.std >= 0, "init_normal: mean ", d.mean, " and std ", d.std,
                 "; expected finite values and std >= 0");
}
inline void check_distribution(const init_uniform& d) {
  TRIDENT_EXPECT(std::isfinite(d.low) && std::isfinite(d.high) && d.low <= d.high, "init_uniform: [", d.low, ", ", d.high,
                 "); expected finite bounds with low <= high");
}
inline void check_distribution(const init_constant& d) {
  TRIDENT_EXPECT(std::isfinite(d.value), "init_constant: ", d.value, " is not finite");
}

}  // namespace detail

//! The distributions above: what init_part accepts.
template <class D>
concept init_distribution = requires(const D& d, std::uint64_t seed, std::uint64_t i) {
  { detail::init_value(d, seed, i) } -> std::same_as<float>;
};

//! Fills `local` (s.local_numel() elements) with part `part`'s elements of the tensor that
//! init_whole(s.shape(), seed, d) would make; its padding with zeros.
template <init_distribution D>
void init_part(const sharding& s, int part, std::uint64_t seed, const D& d, std::span<float> local) {
  detail::check_distribution(d);
  TRIDENT_EXPECT(local.size() == s.local_numel(), "init_part(", part, "): the local array has ", local.size(),
                 " elements; expected ", s.local_numel());
  for (float& v : local) v = 0.0f;
  detail::for_each_run(s, part, [&](std::size_t g, std::size_t l, std::size_t n) {
    for (std::size_t k = 0; k < n; ++k) local[l + k] = detail::init_value(d, seed, g + k);
  });
}

//! The whole tensor of `shape`, element i from (seed, i).
template <init_distribution D>
std::vector<float> init_whole(std::vector<std::size_t> shape, std::uint64_t seed, const D& d) {
  const auto s = sharding::replicated(std::move(shape));
  std::vector<float> v(s.numel());
  init_part(s, 0, seed, d, v);
  return v;
}

}  // namespace trident
