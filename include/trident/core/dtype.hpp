// trident/core/dtype.hpp — element types as values and the traits that map C++ types to them.
//
// Synopsis
//   enum class dtype { float32, float64, float16, bfloat16, int8, uint8, int32, uint32, int64, uint64 };
//   template <class T> struct dtype_traits;          specialised for each supported element type
//   concept element_type<T>                          T has dtype_traits
//   dtype_of<T>                                      the dtype of an element type
//   size_of(dtype), name_of(dtype), is_floating_point(dtype)
//
// A communicator or a checkpoint needs the element type as a run-time value (NCCL and MPI take
// a datatype argument; a file records it). The mapping to ncclDataType_t is in
// comm/nccl/base.hpp and to MPI_Datatype in comm/mpi/base.hpp, so this header needs neither.
//
// Opting in: a type becomes an element type by specialising dtype_traits<T> with a
// `static constexpr dtype value` whose size matches sizeof(T).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "trident/core/half.hpp"

namespace trident {

//! The element types that collectives, buffers and checkpoints know about.
enum class dtype : std::uint8_t { float32, float64, float16, bfloat16, int8, uint8, int32, uint32, int64, uint64 };

//! Maps a C++ element type to its dtype. Specialise it to add a type (see the header comment).
template <class T>
struct dtype_traits;

template <>
struct dtype_traits<float> {
  static constexpr dtype value = dtype::float32;
};
template <>
struct dtype_traits<double> {
  static constexpr dtype value = dtype::float64;
};
template <>
struct dtype_traits<fp16> {
  static constexpr dtype value = dtype::float16;
};
template <>
struct dtype_traits<bf16> {
  static constexpr dtype value = dtype::bfloat16;
};
template <>
struct dtype_traits<std::int8_t> {
  static constexpr dtype value = dtype::int8;
};
template <>
struct dtype_traits<std::uint8_t> {
  static constexpr dtype value = dtype::uint8;
};
template <>
struct dtype_traits<std::int32_t> {
  static constexpr dtype value = dtype::int32;
};
template <>
struct dtype_traits<std::uint32_t> {
  static constexpr dtype value = dtype::uint32;
};
template <>
struct dtype_traits<std::int64_t> {
  static constexpr dtype value = dtype::int64;
};
template <>
struct dtype_traits<std::uint64_t> {
  static constexpr dtype value = dtype::uint64;
};

//! The bytes one element of `t` occupies.
constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::float64:
    case dtype::int64:
    case dtype::uint64:
      return 8;
    case dtype::float32:
    case dtype::int32:
    case dtype::uint32:
      return 4;
    case dtype::float16:
    case dtype::bfloat16:
      return 2;
    case dtype::int8:
    case dtype::uint8:
      return 1;
  }
  return 0;
}

//! The dtype's name as used in reports and file headers ("float32", "bfloat16", ...).
constexpr std::string_view name_of(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return "float32";
    case dtype::float64: return "float64";
    case dtype::float16: return "float16";
    case dtype::bfloat16: return "bfloat16";
    case dtype::int8: return "int8";
    case dtype::uint8: return "uint8";
    case dtype::int32: return "int32";
    case dtype::uint32: return "uint32";
    case dtype::int64: return "int64";
    case dtype::uint64: return "uint64";
  }
  return "unknown";
}

constexpr bool is_floating_point(dtype t) noexcept {
  return t == dtype::float32 || t == dtype::float64 || t == dtype::float16 || t == dtype::bfloat16;
}

//! A type with a dtype: what collectives and buffers of typed data accept.
//!
//!   static_assert(trident::element_type<trident::bf16>);
//!   static_assert(!trident::element_type<std::string>);
template <class T>
concept element_type = requires {
  { dtype_traits<std::remove_cv_t<T>>::value } -> std::convertible_to<dtype>;
} && (size_of(dtype_traits<std::remove_cv_t<T>>::value) == sizeof(T));

//! The dtype of element type T: `dtype_of<bf16> == dtype::bfloat16`.
template <element_type T>
inline constexpr dtype dtype_of = dtype_traits<std::remove_cv_t<T>>::value;

}  // namespace trident
