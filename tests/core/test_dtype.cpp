#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "trident/core/dtype.hpp"

using trident::dtype;

namespace {

template <class T>
void check_traits(dtype expected, const char* name) {
  CHECK(trident::dtype_of<T> == expected);
  CHECK(trident::dtype_of<const T> == expected);
  CHECK(trident::size_of(expected) == sizeof(T));
  CHECK(trident::name_of(expected) == name);
}

}  // namespace

TEST_CASE("every element type maps to its dtype, size and name") {
  check_traits<float>(dtype::float32, "float32");
  check_traits<double>(dtype::float64, "float64");
  check_traits<trident::fp16>(dtype::float16, "float16");
  check_traits<trident::bf16>(dtype::bfloat16, "bfloat16");
  check_traits<std::int8_t>(dtype::int8, "int8");
  check_traits<std::uint8_t>(dtype::uint8, "uint8");
  check_traits<std::int32_t>(dtype::int32, "int32");
  check_traits<std::uint32_t>(dtype::uint32, "uint32");
  check_traits<std::int64_t>(dtype::int64, "int64");
  check_traits<std::uint64_t>(dtype::uint64, "uint64");
}

TEST_CASE("floating-point dtypes are told apart from integers") {
  CHECK(trident::is_floating_point(dtype::float32));
  CHECK(trident::is_floating_point(dtype::bfloat16));
  CHECK(trident::is_floating_point(dtype::float16));
  CHECK(trident::is_floating_point(dtype::float64));
  CHECK_FALSE(trident::is_floating_point(dtype::int32));
  CHECK_FALSE(trident::is_floating_point(dtype::uint8));
}

namespace user {
struct fixed16 {
  std::int16_t raw;
};
struct wrong_size {
  std::int32_t raw;
};
}  // namespace user

// A user type opts in by specialising dtype_traits; the size must agree with the dtype's.
template <>
struct trident::dtype_traits<user::fixed16> {
  static constexpr dtype value = dtype::float16;
};
template <>
struct trident::dtype_traits<user::wrong_size> {
  static constexpr dtype value = dtype::float16;
};

TEST_CASE("element_type accepts the supported types and types that opt in, nothing else") {
  static_assert(trident::element_type<float>);
  static_assert(trident::element_type<trident::bf16>);
  static_assert(trident::element_type<const std::int64_t>);
  static_assert(trident::element_type<user::fixed16>);
  static_assert(!trident::element_type<user::wrong_size>, "a size mismatch must not opt in");
  static_assert(!trident::element_type<std::string>);
  static_assert(!trident::element_type<bool>);
  static_assert(!trident::element_type<long double>);
  CHECK(trident::dtype_of<user::fixed16> == dtype::float16);
}
