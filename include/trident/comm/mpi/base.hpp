// trident/comm/mpi/base.hpp — MPI's vocabulary in trident's terms: datatypes and the check macro.
// trident-requires: mpi
//
// Synopsis
//   MPI_Datatype to_mpi(dtype)                 every trident dtype has an MPI datatype
//   mpi_type_of<T>()                           the same, from a C++ element type
//   TRIDENT_MPI_CHECK(call)                    throws trident::mpi_error naming the call
//
// Needs MPI: link trident::mpi (which defines TRIDENT_HAS_MPI). MPI has no 16-bit floating-point
// types before MPI 4.1, so fp16 and bf16 map to two distinct derived datatypes of two bytes:
// moving them works everywhere, and reducing them with a predefined op (MPI_SUM) is refused by
// MPI instead of silently adding bit patterns; the MPI communicator reduces them with its own
// user-defined operations.
#pragma once

#include "trident/core/config.hpp"

#if !TRIDENT_HAS_MPI
#error "trident/comm/mpi/base.hpp needs MPI: link the trident::mpi target (it defines TRIDENT_HAS_MPI=1)"
#endif

#include <mpi.h>

#include <source_location>

#include "trident/core/dtype.hpp"
#include "trident/core/error.hpp"

namespace trident {

namespace detail {

inline void mpi_check(int status, const char* operation, std::source_location where = std::source_location::current()) {
  if (status == MPI_SUCCESS) [[likely]]
    return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(status, text, &length) != MPI_SUCCESS) length = 0;
  throw mpi_error(status, length > 0 ? std::string(text, static_cast<std::size_t>(length)) : "unknown MPI error",
                  operation, where);
}

//! A committed two-byte datatype, made once per process on first use (MPI must be initialised).
inline MPI_Datatype make_half_type(const char* name) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw usage_error(concat("the MPI datatype for ", name, " needs MPI to be initialised first"));
  MPI_Datatype type = MPI_DATATYPE_NULL;
  mpi_check(MPI_Type_contiguous(2, MPI_BYTE, &type), "MPI_Type_contiguous(2, MPI_BYTE)");
  mpi_check(MPI_Type_commit(&type), "MPI_Type_commit");
  mpi_check(MPI_Type_set_name(type, name), "MPI_Type_set_name");
  return type;
}

}  // namespace detail

//! The MPI datatype of a trident dtype.
//!
//!   MPI_Allreduce(MPI_IN_PLACE, x, n, trident::to_mpi(trident::dtype::float32), MPI_SUM, comm);
inline MPI_Datatype to_mpi(dtype t) {
  switch (t) {
    case dtype::float32: return MPI_FLOAT;
    case dtype::float64: return MPI_DOUBLE;
    case dtype::float16: {
      static const MPI_Datatype type = detail::make_half_type("trident_float16");
      return type;
    }
    case dtype::bfloat16: {
      static const MPI_Datatype type = detail::make_half_type("trident_bfloat16");
      return type;
    }
    case dtype::int8: return MPI_INT8_T;
    case dtype::uint8: return MPI_UINT8_T;
    case dtype::int32: return MPI_INT32_T;
    case dtype::uint32: return MPI_UINT32_T;
    case dtype::int64: return MPI_INT64_T;
    case dtype::uint64: return MPI_UINT64_T;
  }
  throw usage_error(detail::concat("to_mpi: unknown dtype ", static_cast<int>(t)));
}

//! The MPI datatype of element type T: `mpi_type_of<double>() == MPI_DOUBLE`. A function where
//! NCCL's `nccl_type_of<T>` is a constant: MPI's handles are not constant expressions, and the
//! fp16/bf16 types are created by MPI calls, which may only run after MPI_Init.
template <element_type T>
MPI_Datatype mpi_type_of() {
  return to_mpi(dtype_of<T>);
}

}  // namespace trident

//! Wraps one MPI call: `TRIDENT_MPI_CHECK(MPI_Barrier(comm));`. The communicator must use
//! MPI_ERRORS_RETURN for failures to come back as codes instead of aborting the job.
#define TRIDENT_MPI_CHECK(...) ::trident::detail::mpi_check((__VA_ARGS__), #__VA_ARGS__)
