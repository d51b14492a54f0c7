// fp16 and bf16 against references that share no code with core/half.hpp:
//  - decoding: the value computed from the bit fields with std::ldexp in double;
//  - encoding: round-to-nearest-even done by std::nearbyint on the value scaled to integer
//    quanta of its binade, then looked up in a table of every decoded finite value;
//  - encoding fp16, where the compiler has it (GCC >= 12 on x86-64): the _Float16 conversion.
// Every one of the 65,536 bit patterns is checked both ways, every rounding midpoint between two
// neighbours (and the floats either side of it), and a sweep over the float bit patterns.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <limits>
#include <vector>

#include "trident/core/half.hpp"

namespace {

std::string hex(std::uint64_t bits) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(bits));
  return text;
}

using trident::bf16;
using trident::fp16;

// ---- independent decoders ---------------------------------------------------------------------

double decode_fp16(std::uint16_t h) {
  const int sign = h >> 15;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -24);
  } else {
    magnitude = std::ldexp(static_cast<double>(1024 + mantissa), exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

double decode_bf16(std::uint16_t b) {
  const int sign = b >> 15;
  const int exponent = (b >> 7) & 0xff;
  const int mantissa = b & 0x7f;
  double magnitude;
  if (exponent == 0xff) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -133);
  } else {
    magnitude = std::ldexp(static_cast<double>(128 + mantissa), exponent - 134);
  }
  return sign ? -magnitude : magnitude;
}

// ---- independent encoders ---------------------------------------------------------------------

// Every non-negative finite value of a 16-bit format, in bit order (which is value order).
struct value_table {
  std::vector<double> values;
  std::uint16_t infinity_bits;

  template <class Decode>
  value_table(Decode decode, std::uint16_t largest_finite, std::uint16_t inf) : infinity_bits(inf) {
    for (std::uint32_t bits = 0; bits <= largest_finite; ++bits) values.push_back(decode(static_cast<std::uint16_t>(bits)));
    REQUIRE(std::is_sorted(values.begin(), values.end()));
  }

  // The bits of an exactly representable non-negative value, or infinity past the largest.
  std::uint16_t bits_of(double v) const {
    if (v > values.back()) return infinity_bits;
    const auto it = std::lower_bound(values.begin(), values.end(), v);
    REQUIRE(it != values.end());
    REQUIRE(*it == v);  // the rounding below must have produced a representable value
    return static_cast<std::uint16_t>(it - values.begin());
  }
};

const value_table& fp16_table() {
  static const value_table table(decode_fp16, 0x7bff, 0x7c00);
  return table;
}
const value_table& bf16_table() {
  static const value_table table(decode_bf16, 0x7f7f, 0x7f80);
  return table;
}

// Round |x| to `mantissa_bits` fraction bits in its binade (not below `min_exponent`), ties to
// even, by scaling to integer quanta: the scaling is exact, std::nearbyint does the rounding.
double round_to_format(double x, int mantissa_bits, int min_exponent) {
  int e = 0;
  std::frexp(x, &e);  // x = f * 2^e, f in [0.5, 1)
  const int binade = std::max(e - 1, min_exponent);
  const double quantum = std::ldexp(1.0, binade - mantissa_bits);
  return std::nearbyint(x / quantum) * quantum;
}

// Reference float -> fp16 bits; NaN inputs are checked separately.
std::uint16_t reference_fp16_bits(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double x = std::fabs(static_cast<double>(f));
  if (std::isinf(x)) return sign | 0x7c00;
  return sign | fp16_table().bits_of(round_to_format(x, 10, -14));
}

std::uint16_t reference_bf16_bits(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double x = std::fabs(static_cast<double>(f));
  if (std::isinf(x)) return sign | 0x7f80;
  return sign | bf16_table().bits_of(round_to_format(x, 7, -126));
}

bool is_fp16_nan(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool is_bf16_nan(std::uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// Checks one float -> fp16 conversion against both references; returns false on a mismatch.
bool fp16_encodes_like_references(float f) {
  const std::uint16_t ours = fp16{f}.bits();
  if (std::isnan(f)) return is_fp16_nan(ours) && ((ours >> 15) == (std::bit_cast<std::uint32_t>(f) >> 31));
  if (ours != reference_fp16_bits(f)) return false;
#if defined(__FLT16_MAX__)
  if (ours != std::bit_cast<std::uint16_t>(static_cast<_Float16>(f))) return false;
#endif
  return true;
}

bool bf16_encodes_like_reference(float f) {
  const std::uint16_t ours = bf16{f}.bits();
  if (std::isnan(f)) return is_bf16_nan(ours) && ((ours >> 15) == (std::bit_cast<std::uint32_t>(f) >> 31));
  return ours == reference_bf16_bits(f);
}

// The float at a midpoint between two neighbouring 16-bit values and its float neighbours.
std::vector<float> around_midpoint(double lo, double hi) {
  const auto mid = static_cast<float>((lo + hi) / 2);
  REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);  // midpoints of 16-bit neighbours are floats
  return {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, std::numeric_limits<float>::infinity())};
}

}  // namespace

TEST_CASE("the rounding mode the references rely on is to-nearest-even") {
  REQUIRE(std::fegetround() == FE_TONEAREST);
  CHECK(std::nearbyint(2.5) == 2.0);
  CHECK(std::nearbyint(3.5) == 4.0);
}

TEST_CASE("fp16 decodes all 65,536 bit patterns exactly") {
  int mismatches = 0;
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float ours = fp16::from_bits(h);
    const double expected = decode_fp16(h);
    const bool ok = std::isnan(expected)
                        ? (std::isnan(ours) && std::signbit(ours) == ((h >> 15) != 0))
                        : (static_cast<double>(ours) == expected && std::signbit(ours) == std::signbit(expected));
    if (!ok && ++mismatches <= 5) FAIL_CHECK("fp16 bits " << hex(bits) << " decode to " << ours);
  }
  CHECK(mismatches == 0);
}

TEST_CASE("fp16 encodes all 65,536 decoded values back to their bits") {
  int mismatches = 0;
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float value = fp16::from_bits(h);
    const std::uint16_t back = fp16{value}.bits();
    const bool ok = is_fp16_nan(h) ? (is_fp16_nan(back) && (back >> 15) == (h >> 15)) : back == h;
    if (!ok && ++mismatches <= 5) FAIL_CHECK("fp16 " << hex(bits) << " -> float -> " << hex(back));
    if (!fp16_encodes_like_references(value) && ++mismatches <= 5) FAIL_CHECK("reference mismatch at " << hex(bits));
  }
  CHECK(mismatches == 0);
}

TEST_CASE("fp16 rounds every midpoint to even and its neighbours to the nearer value") {
  int mismatches = 0;
  // Neighbours from +0 up to the largest finite, then the largest finite and the overflow
  // threshold 65520 (the midpoint to the next binade, which rounds to infinity).
  for (std::uint32_t bits = 0; bits < 0x7bff; ++bits) {
    for (float f : around_midpoint(decode_fp16(static_cast<std::uint16_t>(bits)), decode_fp16(static_cast<std::uint16_t>(bits + 1)))) {
      for (float signed_f : {f, -f}) {
        if (!fp16_encodes_like_references(signed_f) && ++mismatches <= 5)
          FAIL_CHECK("fp16 midpoint case " << signed_f << " after " << hex(bits));
      }
    }
  }
  for (float f : around_midpoint(65504.0, 65536.0)) {
    CHECK(fp16_encodes_like_references(f));
    CHECK(fp16_encodes_like_references(-f));
  }
  CHECK(fp16{65519.996f}.bits() == 0x7bff);
  CHECK(fp16{65520.0f}.bits() == 0x7c00);
  CHECK(fp16{-65520.0f}.bits() == 0xfc00);
  CHECK(mismatches == 0);
}

// A prime stride visits every exponent and many mantissa patterns: about 17M floats, or 1M under
// the sanitizers (tests/CMakeLists.txt).
#if defined(TRIDENT_TEST_SANITIZED)
constexpr std::uint64_t sweep_stride = 4099;
#else
constexpr std::uint64_t sweep_stride = 251;
#endif
constexpr std::uint64_t sweep_count = (std::uint64_t{1} << 32) / sweep_stride;

TEST_CASE("fp16 matches the references over a sweep of float bit patterns") {
  int mismatches = 0;
  std::uint64_t checked = 0;
  for (std::uint64_t bits = 0; bits <= 0xffffffffu; bits += sweep_stride) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    ++checked;
    if (!fp16_encodes_like_references(f) && ++mismatches <= 5) FAIL_CHECK("fp16 of float bits " << hex(bits));
  }
  CHECK(checked >= sweep_count);
  CHECK(mismatches == 0);
}

TEST_CASE("fp16 special values") {
  CHECK(fp16{0.0f}.bits() == 0x0000);
  CHECK(fp16{-0.0f}.bits() == 0x8000);
  CHECK(fp16{std::numeric_limits<float>::infinity()}.bits() == 0x7c00);
  CHECK(fp16{-std::numeric_limits<float>::infinity()}.bits() == 0xfc00);
  CHECK(is_fp16_nan(fp16{std::numeric_limits<float>::quiet_NaN()}.bits()));
  CHECK(is_fp16_nan(fp16{std::numeric_limits<float>::signaling_NaN()}.bits()));  // quiet, never infinity
  CHECK(fp16{std::ldexp(1.0f, -24)}.bits() == 0x0001);                         // smallest subnormal
  CHECK(fp16{std::ldexp(1.0f, -25)}.bits() == 0x0000);                         // tie: to even (zero)
  CHECK(fp16{std::nextafter(std::ldexp(1.0f, -25), 1.0f)}.bits() == 0x0001);   // just above: up
  CHECK(fp16{std::ldexp(1.0f, -14)}.bits() == 0x0400);                         // smallest normal
  CHECK(fp16{std::ldexp(1023.5f, -24)}.bits() == 0x0400);                      // subnormal rounds up into normal
  CHECK(std::signbit(static_cast<float>(fp16{-1e-10f})));                      // underflow keeps the sign
  CHECK(fp16{1e-10f}.bits() == 0x0000);
}

TEST_CASE("bf16 decodes all 65,536 bit patterns exactly") {
  int mismatches = 0;
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    const float ours = bf16::from_bits(b);
    const double expected = decode_bf16(b);
    const bool ok = std::isnan(expected)
                        ? (std::isnan(ours) && std::signbit(ours) == ((b >> 15) != 0))
                        : (static_cast<double>(ours) == expected && std::signbit(ours) == std::signbit(expected));
    if (!ok && ++mismatches <= 5) FAIL_CHECK("bf16 bits " << hex(bits) << " decode to " << ours);
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bf16 encodes all 65,536 decoded values back to their bits") {
  int mismatches = 0;
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    const float value = bf16::from_bits(b);
    const std::uint16_t back = bf16{value}.bits();
    const bool ok = is_bf16_nan(b) ? (is_bf16_nan(back) && (back >> 15) == (b >> 15)) : back == b;
    if (!ok && ++mismatches <= 5) FAIL_CHECK("bf16 " << hex(bits) << " -> float -> " << hex(back));
    if (!bf16_encodes_like_reference(value) && ++mismatches <= 5) FAIL_CHECK("reference mismatch at " << hex(bits));
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bf16 rounds every midpoint to even and its neighbours to the nearer value") {
  int mismatches = 0;
  for (std::uint32_t bits = 0; bits < 0x7f7f; ++bits) {
    for (float f : around_midpoint(decode_bf16(static_cast<std::uint16_t>(bits)), decode_bf16(static_cast<std::uint16_t>(bits + 1)))) {
      for (float signed_f : {f, -f}) {
        if (!bf16_encodes_like_reference(signed_f) && ++mismatches <= 5)
          FAIL_CHECK("bf16 midpoint case " << signed_f << " after " << hex(bits));
      }
    }
  }
  // Past the largest finite bf16: the float midpoint to 2^128 does not exist (it would be
  // infinity), so the largest floats must round to infinity or the largest bf16 by the rule.
  CHECK(bf16{std::numeric_limits<float>::max()}.bits() == 0x7f80);
  CHECK(bf16_encodes_like_reference(std::numeric_limits<float>::max()));
  CHECK(bf16{std::bit_cast<float>(0x7f7f7fffu)}.bits() == 0x7f7f);
  CHECK(bf16{std::bit_cast<float>(0x7f7f8000u)}.bits() == 0x7f80);  // tie, odd mantissa: up to infinity
  CHECK(mismatches == 0);
}

TEST_CASE("bf16 matches the reference over a sweep of float bit patterns") {
  int mismatches = 0;
  for (std::uint64_t bits = 0; bits <= 0xffffffffu; bits += sweep_stride) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    if (!bf16_encodes_like_reference(f) && ++mismatches <= 5) FAIL_CHECK("bf16 of float bits " << hex(bits));
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bf16 special values") {
  CHECK(bf16{0.0f}.bits() == 0x0000);
  CHECK(bf16{-0.0f}.bits() == 0x8000);
  CHECK(bf16{std::numeric_limits<float>::infinity()}.bits() == 0x7f80);
  CHECK(is_bf16_nan(bf16{std::numeric_limits<float>::quiet_NaN()}.bits()));
  // A NaN whose payload sits only in the low 16 bits must not truncate or round to infinity.
  CHECK(is_bf16_nan(bf16{std::bit_cast<float>(0x7f800001u)}.bits()));
  CHECK(is_bf16_nan(bf16{std::bit_cast<float>(0x7fffffffu)}.bits()));
  CHECK(bf16{std::bit_cast<float>(0x00000001u)}.bits() == 0x0000);  // float subnormals round too
  CHECK(bf16{std::bit_cast<float>(0x00008000u)}.bits() == 0x0000);  // tie to even
  CHECK(bf16{std::bit_cast<float>(0x00018000u)}.bits() == 0x0002);  // tie to even, upwards
}

TEST_CASE("conversions are constexpr") {
  static_assert(fp16{1.0f}.bits() == 0x3c00);
  static_assert(fp16{-2.0f}.bits() == 0xc000);
  static_assert(static_cast<float>(fp16::from_bits(0x3555)) == 0.333251953125f);
  static_assert(bf16{1.0f}.bits() == 0x3f80);
  static_assert(static_cast<float>(bf16::from_bits(0xc040)) == -3.0f);
  CHECK(true);
}

TEST_CASE("numeric_limits agree with the decoded values") {
  using LF = std::numeric_limits<fp16>;
  CHECK(static_cast<float>(LF::max()) == 65504.0f);
  CHECK(static_cast<float>(LF::lowest()) == -65504.0f);
  CHECK(static_cast<float>(LF::min()) == std::ldexp(1.0f, -14));
  CHECK(static_cast<float>(LF::denorm_min()) == std::ldexp(1.0f, -24));
  CHECK(static_cast<float>(LF::epsilon()) == static_cast<float>(fp16::from_bits(0x3c01)) - 1.0f);
  CHECK(std::isinf(static_cast<float>(LF::infinity())));
  CHECK(std::isnan(static_cast<float>(LF::quiet_NaN())));
  CHECK(std::isnan(static_cast<float>(LF::signaling_NaN())));

  using LB = std::numeric_limits<bf16>;
  CHECK(static_cast<float>(LB::max()) == static_cast<float>(decode_bf16(0x7f7f)));
  CHECK(static_cast<float>(LB::lowest()) == -static_cast<float>(decode_bf16(0x7f7f)));
  CHECK(static_cast<float>(LB::min()) == std::numeric_limits<float>::min());
  CHECK(static_cast<float>(LB::epsilon()) == static_cast<float>(bf16::from_bits(0x3f81)) - 1.0f);
  CHECK(std::isnan(static_cast<float>(LB::quiet_NaN())));
}
