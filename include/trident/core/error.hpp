// trident/core/error.hpp — the exception hierarchy and the argument-check helper.
//
// Synopsis
//   class error;          base: message, operation, source location
//   class usage_error;    the caller passed something wrong (size, shape, group, rank, ...)
//   class cuda_error;     a CUDA runtime call failed (status = cudaError_t)
//   class nccl_error;     an NCCL call failed (status = ncclResult_t)
//   class cublas_error;   a cuBLAS call failed (status = cublasStatus_t)
//   class mpi_error;      an MPI call failed (status = MPI error code)
//   TRIDENT_EXPECT(cond, parts...)   throws usage_error built from parts... when !cond
//
// Library code never calls exit() or abort(): every failure is one of these exceptions, carrying
// what was attempted and where, so a trainer can log it, checkpoint, or tear its ranks down.
// The check macros for CUDA, NCCL and MPI calls live beside their dependency
// (core/cuda_runtime.hpp, comm/nccl/base.hpp, comm/mpi/base.hpp) so this header needs none.
#pragma once

#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace trident {

namespace detail {

//! Concatenates anything streamable into one string; the library's message builder (libstdc++ 12
//! has no <format>, and the core headers do not depend on fmt).
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return std::move(out).str();
}

inline std::string describe(std::string_view kind, std::string_view message, std::string_view operation,
                            const std::source_location& where) {
  std::string text{kind};
  text += ": ";
  text += message;
  if (!operation.empty()) {
    text += " [in ";
    text += operation;
    text += "]";
  }
  text += " (at ";
  text += where.file_name();
  text += ":";
  text += std::to_string(where.line());
  text += ")";
  return text;
}

}  // namespace detail

//! Base of every exception trident throws. `what()` reads
//! "<kind>: <message> [in <operation>] (at <file>:<line>)".
//!
//!   try { ... } catch (const trident::error& e) {
//!     std::fprintf(stderr, "%s\n", e.what());   // full context
//!     log(e.operation(), e.where().line());     // or its parts
//!   }
class error : public std::runtime_error {
 public:
  explicit error(std::string_view message, std::string_view operation = {},
                 std::source_location where = std::source_location::current())
      : error("trident error", message, operation, where) {}

  //! The message alone, without kind, operation or location.
  const std::string& message() const noexcept { return message_; }
  //! What was attempted (a call's source text, or a function name); may be empty.
  const std::string& operation() const noexcept { return operation_; }
  //! Where the failure was detected.
  const std::source_location& where() const noexcept { return where_; }
  //! Whether this only repeats another rank's failure, which that rank raises itself (collective
  //! checks raise an error on every rank so that none waits for the one that failed). A runner
  //! of several ranks reports a failure that is not an echo first: that one says what went wrong.
  //!
  //!   auto e = trident::usage_error(concat("save: rank ", r, " failed (its error is raised there)"));
  //!   e.mark_echo();
  //!   throw e;
  bool echo() const noexcept { return echo_; }
  void mark_echo() noexcept { echo_ = true; }

 protected:
  error(std::string_view kind, std::string_view message, std::string_view operation, std::source_location where)
      : std::runtime_error(detail::describe(kind, message, operation, where)),
        message_(message),
        operation_(operation),
        where_(where) {}

 private:
  std::string message_;
  std::string operation_;
  std::source_location where_;
  bool echo_ = false;
};

//! The caller asked for something that cannot be done: a wrong size, a shard that does not
//! divide, a rank out of range, mismatched groups. The message names what was expected.
//!
//!   TRIDENT_EXPECT(dst.size() == src.size(), "copy: expected ", src.size(), " elements, got ", dst.size());
class usage_error : public error {
 public:
  explicit usage_error(std::string_view message, std::string_view operation = {},
                       std::source_location where = std::source_location::current())
      : error("trident usage error", message, operation, where) {}
};

//! A library status code with its name, shared by the CUDA, NCCL and MPI errors.
class status_error : public error {
 public:
  //! The library's own status code (cudaError_t, ncclResult_t or an MPI error code).
  int status() const noexcept { return status_; }

 protected:
  status_error(std::string_view kind, int status, std::string_view message, std::string_view operation,
               std::source_location where)
      : error(kind, message, operation, where), status_(status) {}

 private:
  int status_;
};

//! A CUDA runtime call failed; status() is the cudaError_t value.
class cuda_error : public status_error {
 public:
  cuda_error(int status, std::string_view message, std::string_view operation = {},
             std::source_location where = std::source_location::current())
      : status_error("CUDA error", status, message, operation, where) {}
};

//! An NCCL call failed; status() is the ncclResult_t value.
class nccl_error : public status_error {
 public:
  nccl_error(int status, std::string_view message, std::string_view operation = {},
             std::source_location where = std::source_location::current())
      : status_error("NCCL error", status, message, operation, where) {}
};

//! A cuBLAS call failed; status() is the cublasStatus_t value.
class cublas_error : public status_error {
 public:
  cublas_error(int status, std::string_view message, std::string_view operation = {},
               std::source_location where = std::source_location::current())
      : status_error("cuBLAS error", status, message, operation, where) {}
};

//! An MPI call failed; status() is the MPI error code.
class mpi_error : public status_error {
 public:
  mpi_error(int status, std::string_view message, std::string_view operation = {},
            std::source_location where = std::source_location::current())
      : status_error("MPI error", status, message, operation, where) {}
};

namespace detail {

template <class... Parts>
[[noreturn]] void throw_usage(std::source_location where, const char* condition, Parts&&... parts) {
  if constexpr (sizeof...(Parts) == 0) {
    throw usage_error(concat("check failed: ", condition), {}, where);
  } else {
    throw usage_error(concat(std::forward<Parts>(parts)...), {}, where);
  }
}

}  // namespace detail

}  // namespace trident

//! Throws trident::usage_error with the concatenated parts (or the condition's text) and the
//! caller's location when `cond` is false. The parts are evaluated only on failure.
#define TRIDENT_EXPECT(cond, ...)                                                                              \
  do {                                                                                                         \
    if (!(cond)) [[unlikely]]                                                                                  \
      ::trident::detail::throw_usage(std::source_location::current(), #cond __VA_OPT__(, ) __VA_ARGS__);       \
  } while (false)
