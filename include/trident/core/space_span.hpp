// trident/core/space_span.hpp — a {pointer, size} view tagged with the memory space the elements
// live in, and copies between any two such views.
//
// Synopsis
//   template <class T, memory_space S> class space_span    what communicators and ZeRO hand out;
//                                                           converts to std::span<T> when S is
//                                                           host-accessible
//   void copy(space_span<const T, From> src, space_span<T, To> dst)   any spaces, synchronous
#pragma once

#include <concepts>
#include <cstddef>
#include <ranges>
#include <span>
#include <type_traits>

#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/core/memory_space.hpp"

namespace trident {

//! A view of `size()` elements of T that live in memory space Space. It is what communicators
//! take, so memory of the wrong kind is a compile-time error where the types tell: a
//! `buffer<float, cuda_space>` does not convert to `space_span<float, host_space>`, and a
//! `std::vector` converts only to spans of host-accessible spaces.
//!
//!   trident::buffer<float, trident::cuda_space> grads(n);
//!   nccl.all_reduce(grads, trident::reduce_op::avg);          // fine
//!   std::vector<float> host(n);
//!   nccl.all_reduce(host);                                    // does not compile
//!   nccl.all_reduce(trident::space_span<float, trident::cuda_space>{raw_device_ptr, n});
template <class T, memory_space Space>
class space_span {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using space = Space;

  constexpr space_span() noexcept = default;
  //! Wraps memory the caller vouches for (e.g. from another allocator).
  constexpr space_span(T* data, std::size_t size) noexcept : data_(data), size_(size) {}

  //! From a buffer of the same space (or of any host-accessible space, for a host-accessible one).
  template <class U, memory_space S2>
    requires std::convertible_to<U (*)[], T (*)[]> &&
             (std::same_as<S2, Space> || (S2::host_accessible && Space::host_accessible))
  constexpr space_span(buffer<U, S2>& b) noexcept : data_(b.data()), size_(b.size()) {}  // NOLINT: implicit by design
  template <class U, memory_space S2>
    requires std::convertible_to<const U (*)[], T (*)[]> &&
             (std::same_as<S2, Space> || (S2::host_accessible && Space::host_accessible))
  constexpr space_span(const buffer<U, S2>& b) noexcept : data_(b.data()), size_(b.size()) {}  // NOLINT

  //! From any contiguous host range (std::vector, std::array, std::span), for host-accessible spaces.
  template <class R>
    requires Space::host_accessible && std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
             (!std::same_as<std::remove_cvref_t<R>, space_span>) &&
             std::convertible_to<std::remove_reference_t<std::ranges::range_reference_t<R>> (*)[], T (*)[]>
  constexpr space_span(R&& r) noexcept  // NOLINT: implicit by design
      : data_(std::ranges::data(r)), size_(static_cast<std::size_t>(std::ranges::size(r))) {}

  //! space_span<T> → space_span<const T>.
  template <class U>
    requires(!std::same_as<U, T>) && std::convertible_to<U (*)[], T (*)[]>
  constexpr space_span(space_span<U, Space> other) noexcept : data_(other.data()), size_(other.size()) {}

  constexpr T* data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  constexpr bool empty() const noexcept { return size_ == 0; }
  //! A host-accessible span is a std::span too, so it goes wherever host code takes one (the
  //! reference layers, the host optimizers).
  constexpr operator std::span<T>() const noexcept  // NOLINT: implicit by design
    requires Space::host_accessible
  {
    return {data_, size_};
  }
  constexpr std::span<T> host() const noexcept
    requires Space::host_accessible
  {
    return {data_, size_};
  }
  constexpr space_span subspan(std::size_t offset, std::size_t count) const {
    TRIDENT_EXPECT(offset <= size_ && count <= size_ - offset, "space_span::subspan: [", offset, ", ", offset + count,
                   ") is outside a span of ", size_, " elements");
    return {data_ + offset, count};
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

//! Copies every element of `src` into `dst`, whatever their spaces (host, pinned, device):
//! synchronous, like copy() on buffers. Sizes must match.
//!
//!   auto p = zero.parameters("fc1.weight");                  // space_span<const bf16, cuda_space>
//!   std::vector<trident::bf16> host(p.size());
//!   trident::copy(p, trident::space_span<trident::bf16, trident::host_space>(host));
template <class T, memory_space From, memory_space To>
void copy(space_span<const T, From> src, space_span<T, To> dst) {
  TRIDENT_EXPECT(src.size() == dst.size(), "copy: source has ", src.size(), " elements, destination ", dst.size());
  detail::copy_bytes(dst.data(), To::host_accessible, src.data(), From::host_accessible, src.size_bytes());
}
template <class T, memory_space From, memory_space To>
  requires(!std::is_const_v<T>)
void copy(space_span<T, From> src, space_span<T, To> dst) {
  copy(space_span<const T, From>(src), dst);
}

}  // namespace trident
