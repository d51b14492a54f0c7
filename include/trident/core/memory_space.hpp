// trident/core/memory_space.hpp — memory spaces as types.
//
// Synopsis
//   struct host_space;           pageable host memory (operator new, 256-byte aligned)
//   struct pinned_host_space;    page-locked host memory (cudaMallocHost): fast, async copies
//   struct cuda_space;           device memory of the current CUDA device (cudaMalloc)
//   concept memory_space<S>      how a type opts in (below)
//   concept host_accessible_space<S>, device_accessible_space<S>
//   inline constexpr std::size_t buffer_alignment = 256;
//   bool detail::overlaps(a, a_bytes, b, b_bytes)   whether two byte ranges share memory
//
// A buffer's space is part of its type (Kokkos-style), so passing device memory where host
// memory is needed is a compile-time error, and a backend can state which spaces it accepts.
//
// Opting in: a memory space is a type with
//   static constexpr space_kind kind;            which ledger column its bytes are charged to
//   static constexpr std::string_view name;
//   static constexpr bool host_accessible;       the host may dereference its pointers
//   static constexpr bool device_accessible;     a CUDA kernel may dereference its pointers
//   static constexpr bool available;             usable in this build (false: CUDA spaces without CUDA)
//   static void* allocate(std::size_t bytes);                 at least buffer_alignment aligned; throws
//   static void deallocate(void* p, std::size_t bytes) noexcept;
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string_view>

#include "trident/core/config.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/error.hpp"
#include "trident/core/memory_ledger.hpp"

namespace trident {

//! Every allocation is aligned to this many bytes: cudaMalloc's guarantee, and enough for any
//! vector load and for NCCL's fast paths, whatever the space.
inline constexpr std::size_t buffer_alignment = 256;

template <class S>
concept memory_space = requires(std::size_t bytes, void* pointer) {
  { S::kind } -> std::convertible_to<space_kind>;
  { S::name } -> std::convertible_to<std::string_view>;
  { S::host_accessible } -> std::convertible_to<bool>;
  { S::device_accessible } -> std::convertible_to<bool>;
  { S::available } -> std::convertible_to<bool>;
  { S::allocate(bytes) } -> std::same_as<void*>;
  { S::deallocate(pointer, bytes) } noexcept;
};

//! A space whose memory the host can read and write directly (std::span views are allowed).
template <class S>
concept host_accessible_space = memory_space<S> && S::host_accessible;

//! A space whose memory CUDA kernels can read and write directly.
template <class S>
concept device_accessible_space = memory_space<S> && S::device_accessible;

//! Ordinary host memory.
//!
//!   trident::buffer<float, trident::host_space> x(1 << 20);
struct host_space {
  static constexpr space_kind kind = space_kind::host;
  static constexpr std::string_view name = "host";
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  static constexpr bool available = true;

  static void* allocate(std::size_t bytes) { return ::operator new(bytes, std::align_val_t{buffer_alignment}); }
  static void deallocate(void* pointer, std::size_t bytes) noexcept {
#if defined(__cpp_sized_deallocation)
    ::operator delete(pointer, bytes, std::align_val_t{buffer_alignment});
#else  // Clang before 19 leaves sized deallocation off by default: libstdc++ then declares no sized delete
    (void)bytes;
    ::operator delete(pointer, std::align_val_t{buffer_alignment});
#endif
  }
};

//! Page-locked host memory, mapped into the device's address space: copies to and from the GPU
//! run at full speed and asynchronously, and kernels can read it directly.
//!
//!   trident::buffer<float, trident::pinned_host_space> staging(1 << 20);
struct pinned_host_space {
  static constexpr space_kind kind = space_kind::pinned_host;
  static constexpr std::string_view name = "pinned";
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = true;
  static constexpr bool available = has_cuda;

  static void* allocate([[maybe_unused]] std::size_t bytes) {
#if TRIDENT_HAS_CUDA
    void* pointer = nullptr;
    TRIDENT_CUDA_CHECK(cudaMallocHost(&pointer, bytes));
    return pointer;
#else
    throw usage_error("pinned_host_space needs CUDA: link trident::cuda", "pinned_host_space::allocate");
#endif
  }
  static void deallocate([[maybe_unused]] void* pointer, std::size_t) noexcept {
#if TRIDENT_HAS_CUDA
    (void)cudaFreeHost(pointer);  // a destructor cannot throw; a failure here means the context is gone
#endif
  }
};

//! Memory of the current CUDA device.
//!
//!   trident::buffer<trident::bf16, trident::cuda_space> weights(n, trident::mem_category::parameters);
//!   my_kernel<<<grid, block>>>(weights.device_handle());
struct cuda_space {
  static constexpr space_kind kind = space_kind::cuda;
  static constexpr std::string_view name = "cuda";
  static constexpr bool host_accessible = false;
  static constexpr bool device_accessible = true;
  static constexpr bool available = has_cuda;

  static void* allocate([[maybe_unused]] std::size_t bytes) {
#if TRIDENT_HAS_CUDA
    void* pointer = nullptr;
    TRIDENT_CUDA_CHECK(cudaMalloc(&pointer, bytes));
    return pointer;
#else
    throw usage_error("cuda_space needs CUDA: link trident::cuda", "cuda_space::allocate");
#endif
  }
  static void deallocate([[maybe_unused]] void* pointer, std::size_t) noexcept {
#if TRIDENT_HAS_CUDA
    (void)cudaFree(pointer);
#endif
  }
};

static_assert(memory_space<host_space> && memory_space<pinned_host_space> && memory_space<cuda_space>);

namespace detail {
//! Whether [a, a + a_bytes) and [b, b + b_bytes) share memory (empty ranges share none): an
//! output over an input that a kernel still reads is a wrong result, not an error, unless checked.
inline bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}
}  // namespace detail

}  // namespace trident
