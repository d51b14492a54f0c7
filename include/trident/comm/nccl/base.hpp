// trident/comm/nccl/base.hpp — NCCL's vocabulary in trident's terms: datatypes and the check macro.
// trident-requires: nccl
//
// Synopsis
//   ncclDataType_t to_nccl(dtype)              every trident dtype has an NCCL datatype
//   nccl_type_of<T>                            the same, from a C++ element type
//   TRIDENT_NCCL_CHECK(call)                   throws trident::nccl_error naming the call
//
// Needs NCCL and CUDA: link trident::nccl (which defines TRIDENT_HAS_NCCL and TRIDENT_HAS_CUDA).
#pragma once

#include "trident/core/config.hpp"

#if !TRIDENT_HAS_NCCL
#error "trident/comm/nccl/base.hpp needs NCCL: link the trident::nccl target (it defines TRIDENT_HAS_NCCL=1)"
#endif

#include <nccl.h>

#include <source_location>

#include "trident/core/dtype.hpp"
#include "trident/core/error.hpp"

namespace trident {

//! The NCCL datatype of a trident dtype.
//!
//!   ncclAllReduce(x, x, n, trident::to_nccl(trident::dtype::bfloat16), ncclSum, comm, stream);
constexpr ncclDataType_t to_nccl(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return ncclFloat32;
    case dtype::float64: return ncclFloat64;
    case dtype::float16: return ncclFloat16;
    case dtype::bfloat16: return ncclBfloat16;
    case dtype::int8: return ncclInt8;
    case dtype::uint8: return ncclUint8;
    case dtype::int32: return ncclInt32;
    case dtype::uint32: return ncclUint32;
    case dtype::int64: return ncclInt64;
    case dtype::uint64: return ncclUint64;
  }
  return ncclNumTypes;  // unreachable for a valid dtype
}

//! The NCCL datatype of element type T: `nccl_type_of<bf16> == ncclBfloat16`.
template <element_type T>
inline constexpr ncclDataType_t nccl_type_of = to_nccl(dtype_of<T>);

namespace detail {

inline void nccl_check(ncclResult_t status, const char* operation,
                       std::source_location where = std::source_location::current()) {
  if (status == ncclSuccess || status == ncclInProgress) [[likely]]
    return;
  // ncclGetLastError carries the detail NCCL logged for this thread (which rank, which peer).
  const char* last = ncclGetLastError(nullptr);
  throw nccl_error(static_cast<int>(status),
                   concat(ncclGetErrorString(status), last != nullptr && *last != '\0' ? " — " : "",
                          last != nullptr ? last : ""),
                   operation, where);
}

}  // namespace detail

}  // namespace trident

//! Wraps one NCCL call: `TRIDENT_NCCL_CHECK(ncclGroupEnd());`. ncclInProgress (non-blocking
//! communicators) is not an error.
#define TRIDENT_NCCL_CHECK(...) ::trident::detail::nccl_check((__VA_ARGS__), #__VA_ARGS__)
