// trident/core/half.hpp — the 16-bit floating-point number types fp16 and bf16.
//
// Synopsis
//   struct fp16;   IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits
//   struct bf16;   bfloat16: 1 sign, 8 exponent, 7 mantissa bits (the top half of a float)
//     explicit fpXX(float)            rounds to nearest, ties to even
//     operator float() const          exact
//     static fpXX from_bits(uint16_t), uint16_t bits() const
//   std::numeric_limits<fp16>, std::numeric_limits<bf16>
//
// Both are usable in host code without CUDA (constexpr, bit-exact software conversions), and are
// layout-compatible with CUDA's __half and __nv_bfloat16 (two bytes, two-byte aligned, the same
// bit layout), so a buffer<bf16, cuda_space> can be handed to a kernel that reads __nv_bfloat16.
// Under nvcc, device code converts with the hardware instructions, which round identically;
// only the payload of a NaN may differ between host and device (a NaN stays a NaN).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "trident/core/config.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace trident {

namespace detail {

template <class To, class From>
TRIDENT_HOST_DEVICE constexpr To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs types of the same size");
  return __builtin_bit_cast(To, from);
}

//! binary32 -> binary16, round to nearest even; overflow to infinity, underflow through the
//! subnormals to signed zero; a NaN keeps its sign and top payload bits and becomes quiet.
TRIDENT_HOST_DEVICE constexpr std::uint16_t float_to_fp16_bits(float value) noexcept {
#if defined(__CUDA_ARCH__)
  if (!__builtin_is_constant_evaluated()) return __half_as_ushort(__float2half_rn(value));
#endif
  const std::uint32_t x = bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // infinity or NaN
    const std::uint32_t nan_bits = magnitude > 0x7f800000u ? (0x0200u | ((magnitude >> 13) & 0x03ffu)) : 0u;
    return static_cast<std::uint16_t>(sign | 0x7c00u | nan_bits);
  }
  if (magnitude >= 0x477ff000u) {  // >= 65520: rounds past the largest half (65504)
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (magnitude >= 0x38800000u) {  // >= 2^-14: a normal half
    // Adding 0xfff plus the lowest kept bit rounds the 13 dropped bits to nearest even; a carry
    // out of the mantissa correctly bumps the exponent.
    magnitude += 0x0fffu + ((magnitude >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((magnitude - (112u << 23)) >> 13));
  }
  // A half subnormal (or zero): count units of 2^-24 with the float's implicit bit restored.
  const std::uint32_t exponent = magnitude >> 23;
  const std::uint32_t shift = 126u - exponent;  // 14 for [2^-15, 2^-14)
  if (shift > 24u) return static_cast<std::uint16_t>(sign);  // below 2^-25: rounds to zero
  const std::uint32_t mantissa = (magnitude & 0x007fffffu) | 0x00800000u;
  std::uint32_t units = mantissa >> shift;
  const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1u);
  if (rest > halfway || (rest == halfway && (units & 1u))) ++units;  // may reach 0x400, the smallest normal
  return static_cast<std::uint16_t>(sign | units);
}

//! binary16 -> binary32, exact; a NaN keeps its sign and payload and becomes quiet.
TRIDENT_HOST_DEVICE constexpr float fp16_bits_to_float(std::uint16_t h) noexcept {
#if defined(__CUDA_ARCH__)
  if (!__builtin_is_constant_evaluated()) return __half2float(__ushort_as_half(h));
#endif
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x03ffu;
  if (exponent == 0x1fu) {
    const std::uint32_t quiet = mantissa != 0 ? 0x00400000u : 0u;
    return bit_cast<float>(sign | 0x7f800000u | quiet | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return bit_cast<float>(sign);
    std::uint32_t biased = 113;  // 127 - 14: the exponent of 2^-14, before normalising
    while ((mantissa & 0x0400u) == 0) {
      mantissa <<= 1;
      --biased;
    }
    return bit_cast<float>(sign | (biased << 23) | ((mantissa & 0x03ffu) << 13));
  }
  return bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

//! binary32 -> bfloat16, round to nearest even; a NaN keeps its sign and top payload bits and
//! becomes quiet (rounding could otherwise carry a NaN's payload into infinity).
TRIDENT_HOST_DEVICE constexpr std::uint16_t float_to_bf16_bits(float value) noexcept {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  if (!__builtin_is_constant_evaluated()) return __bfloat16_as_ushort(__float2bfloat16_rn(value));
#endif
  const std::uint32_t x = bit_cast<std::uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

//! bfloat16 -> binary32, exact (the bits are the float's top half).
TRIDENT_HOST_DEVICE constexpr float bf16_bits_to_float(std::uint16_t b) noexcept {
  return bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace detail

//! IEEE 754 half precision. Converts from float explicitly (rounding), to float implicitly
//! (exactly), so arithmetic happens in float and the result is rounded once when stored.
//!
//!   trident::fp16 h{3.14159f};          // 3.140625
//!   float twice = 2 * h;                // 6.28125
//!   h = trident::fp16{twice};
struct fp16 {
  fp16() = default;
  TRIDENT_HOST_DEVICE constexpr explicit fp16(float value) noexcept : bits_(detail::float_to_fp16_bits(value)) {}
  TRIDENT_HOST_DEVICE constexpr operator float() const noexcept { return detail::fp16_bits_to_float(bits_); }

  TRIDENT_HOST_DEVICE static constexpr fp16 from_bits(std::uint16_t bits) noexcept {
    fp16 h;
    h.bits_ = bits;
    return h;
  }
  TRIDENT_HOST_DEVICE constexpr std::uint16_t bits() const noexcept { return bits_; }

#if defined(__CUDACC__)
  TRIDENT_HOST_DEVICE fp16(__half h) noexcept : bits_(detail::bit_cast<std::uint16_t>(h)) {}
  TRIDENT_HOST_DEVICE operator __half() const noexcept { return detail::bit_cast<__half>(bits_); }
#endif

 private:
  std::uint16_t bits_;
};

//! bfloat16: the top 16 bits of a float, same range, 8 significant bits.
//!
//!   trident::bf16 b{1.0f / 3.0f};       // 0.333984375
//!   float back = b;
struct bf16 {
  bf16() = default;
  TRIDENT_HOST_DEVICE constexpr explicit bf16(float value) noexcept : bits_(detail::float_to_bf16_bits(value)) {}
  TRIDENT_HOST_DEVICE constexpr operator float() const noexcept { return detail::bf16_bits_to_float(bits_); }

  TRIDENT_HOST_DEVICE static constexpr bf16 from_bits(std::uint16_t bits) noexcept {
    bf16 b;
    b.bits_ = bits;
    return b;
  }
  TRIDENT_HOST_DEVICE constexpr std::uint16_t bits() const noexcept { return bits_; }

#if defined(__CUDACC__)
  TRIDENT_HOST_DEVICE bf16(__nv_bfloat16 b) noexcept : bits_(detail::bit_cast<std::uint16_t>(b)) {}
  TRIDENT_HOST_DEVICE operator __nv_bfloat16() const noexcept { return detail::bit_cast<__nv_bfloat16>(bits_); }
#endif

 private:
  std::uint16_t bits_;
};

static_assert(sizeof(fp16) == 2 && alignof(fp16) == 2);
static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2);
static_assert(std::is_trivially_copyable_v<fp16> && std::is_standard_layout_v<fp16>);
static_assert(std::is_trivially_copyable_v<bf16> && std::is_standard_layout_v<bf16>);
#if defined(__CUDACC__)
static_assert(sizeof(fp16) == sizeof(__half) && alignof(fp16) == alignof(__half), "fp16 must match __half");
static_assert(sizeof(bf16) == sizeof(__nv_bfloat16) && alignof(bf16) == alignof(__nv_bfloat16),
              "bf16 must match __nv_bfloat16");
#endif

}  // namespace trident

namespace std {

template <>
class numeric_limits<trident::fp16> {
  using T = trident::fp16;

 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr bool is_iec559 = true;
  static constexpr bool is_bounded = true;
  static constexpr float_round_style round_style = round_to_nearest;
  static constexpr int digits = 11;
  static constexpr int digits10 = 3;
  static constexpr int max_digits10 = 5;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -13;
  static constexpr int min_exponent10 = -4;
  static constexpr int max_exponent = 16;
  static constexpr int max_exponent10 = 4;
  static constexpr T min() noexcept { return T::from_bits(0x0400); }
  static constexpr T lowest() noexcept { return T::from_bits(0xfbff); }
  static constexpr T max() noexcept { return T::from_bits(0x7bff); }
  static constexpr T epsilon() noexcept { return T::from_bits(0x1400); }
  static constexpr T round_error() noexcept { return T::from_bits(0x3800); }
  static constexpr T infinity() noexcept { return T::from_bits(0x7c00); }
  static constexpr T quiet_NaN() noexcept { return T::from_bits(0x7e00); }
  static constexpr T signaling_NaN() noexcept { return T::from_bits(0x7d00); }
  static constexpr T denorm_min() noexcept { return T::from_bits(0x0001); }
};

template <>
class numeric_limits<trident::bf16> {
  using T = trident::bf16;

 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr bool is_iec559 = false;
  static constexpr bool is_bounded = true;
  static constexpr float_round_style round_style = round_to_nearest;
  static constexpr int digits = 8;
  static constexpr int digits10 = 2;
  static constexpr int max_digits10 = 4;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -125;
  static constexpr int min_exponent10 = -37;
  static constexpr int max_exponent = 128;
  static constexpr int max_exponent10 = 38;
  static constexpr T min() noexcept { return T::from_bits(0x0080); }
  static constexpr T lowest() noexcept { return T::from_bits(0xff7f); }
  static constexpr T max() noexcept { return T::from_bits(0x7f7f); }
  static constexpr T epsilon() noexcept { return T::from_bits(0x3c00); }
  static constexpr T round_error() noexcept { return T::from_bits(0x3f00); }
  static constexpr T infinity() noexcept { return T::from_bits(0x7f80); }
  static constexpr T quiet_NaN() noexcept { return T::from_bits(0x7fc0); }
  static constexpr T signaling_NaN() noexcept { return T::from_bits(0x7fa0); }
  static constexpr T denorm_min() noexcept { return T::from_bits(0x0001); }
};

}  // namespace std
