// trident/core/buffer.hpp — an owning, typed, accounted allocation in a memory space.
//
// Synopsis
//   template <class T> struct device_span;               trivially copyable {pointer, size}: what kernels take
//   template <class T, memory_space Space = host_space> class buffer;
//     buffer(count, mem_category = other, ledger = current_ledger())
//     data(), size(), size_bytes(), empty(), category(), ledger()
//     span()                     std::span<T>, only for host-accessible spaces
//     device_handle()            device_span<T>, for any space
//   copy(src, dst)               between any two spaces, sizes must match
//   fill_zero(buf), to_vector(buf)
//
// A buffer is move-only and RAII; its memory is aligned to buffer_alignment (256 bytes) in every
// space; zero elements are allowed (no allocation, data() == nullptr). Its bytes are charged to
// one ledger under one category for its whole life (see memory_ledger.hpp).
#pragma once

#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/core/error.hpp"
#include "trident/core/memory_ledger.hpp"
#include "trident/core/memory_space.hpp"

namespace trident {

//! A non-owning {pointer, size} view that kernels (CUDA or host threads) take by value.
//! Trivially copyable, so it can be a kernel argument; bounds are not checked.
//!
//!   __global__ void scale(trident::device_span<float> x, float a) {
//!     for (auto i = blockIdx.x * blockDim.x + threadIdx.x; i < x.size(); i += gridDim.x * blockDim.x) x[i] *= a;
//!   }
template <class T>
struct device_span {
  T* pointer = nullptr;
  std::size_t count = 0;

  device_span() = default;
  TRIDENT_HOST_DEVICE constexpr device_span(T* data, std::size_t size) noexcept : pointer(data), count(size) {}
  //! A view of mutable elements converts to a view of const ones.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_const_v<U>)
  TRIDENT_HOST_DEVICE constexpr device_span(const device_span<U>& other) noexcept
      : pointer(other.pointer), count(other.count) {}

  TRIDENT_HOST_DEVICE constexpr T* data() const noexcept { return pointer; }
  TRIDENT_HOST_DEVICE constexpr std::size_t size() const noexcept { return count; }
  TRIDENT_HOST_DEVICE constexpr bool empty() const noexcept { return count == 0; }
  TRIDENT_HOST_DEVICE constexpr T& operator[](std::size_t i) const noexcept { return pointer[i]; }
  TRIDENT_HOST_DEVICE constexpr T* begin() const noexcept { return pointer; }
  TRIDENT_HOST_DEVICE constexpr T* end() const noexcept { return pointer + count; }
  //! The elements [offset, offset + n).
  TRIDENT_HOST_DEVICE constexpr device_span subspan(std::size_t offset, std::size_t n) const noexcept {
    return {pointer + offset, n};
  }
};

static_assert(std::is_trivially_copyable_v<device_span<float>>);

//! Owning storage for `size()` elements of T in memory space Space, charged to a ledger.
//! The elements are not initialised (use fill_zero or copy).
//!
//!   trident::buffer<float> grads(n, trident::mem_category::gradients);       // host
//!   trident::fill_zero(grads);
//!   std::span<float> g = grads.span();
//!   trident::buffer<float, trident::cuda_space> d_grads(n, trident::mem_category::gradients);
//!   trident::copy(grads, d_grads);
template <class T, memory_space Space = host_space>
class buffer {
  static_assert(std::is_trivially_copyable_v<T>, "buffer<T> holds raw memory: T must be trivially copyable");

 public:
  using value_type = T;
  using space_type = Space;

  //! An empty buffer: no memory, no charge.
  buffer() noexcept = default;

  //! Allocates `count` elements in Space, charged to `ledger` under `category`.
  //! Throws usage_error when the byte count overflows, or the space's error (std::bad_alloc,
  //! cuda_error) when the allocation fails.
  explicit buffer(std::size_t count, mem_category category = mem_category::other,
                  std::shared_ptr<memory_ledger> ledger = current_ledger())
      : count_(count), category_(category), ledger_(std::move(ledger)) {
    static_assert(Space::available, "this memory space is not available in this build: "
                                    "device and pinned memory need CUDA (link trident::cuda or compile with nvcc)");
    TRIDENT_EXPECT(count <= std::numeric_limits<std::size_t>::max() / sizeof(T), "buffer of ", count,
                   " elements of ", sizeof(T), " bytes overflows size_t");
    TRIDENT_EXPECT(ledger_ != nullptr, "buffer: the ledger must not be null");
    if (count_ == 0) return;
    data_ = static_cast<T*>(Space::allocate(size_bytes()));
    ledger_->charge(Space::kind, category_, size_bytes());
  }

  buffer(buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        count_(std::exchange(other.count_, 0)),
        category_(other.category_),
        ledger_(std::move(other.ledger_)) {}

  buffer& operator=(buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
      category_ = other.category_;
      ledger_ = std::move(other.ledger_);
    }
    return *this;
  }

  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ~buffer() { release(); }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  bool empty() const noexcept { return count_ == 0; }
  mem_category category() const noexcept { return category_; }
  //! The ledger this buffer's bytes are charged to (null for a default-constructed buffer).
  const std::shared_ptr<memory_ledger>& ledger() const noexcept { return ledger_; }

  //! The elements as a std::span; only where the host can touch the memory.
  std::span<T> span() noexcept
    requires Space::host_accessible
  {
    return {data_, count_};
  }
  std::span<const T> span() const noexcept
    requires Space::host_accessible
  {
    return {data_, count_};
  }
  T& operator[](std::size_t i) noexcept
    requires Space::host_accessible
  {
    return data_[i];
  }
  const T& operator[](std::size_t i) const noexcept
    requires Space::host_accessible
  {
    return data_[i];
  }

  //! The trivially copyable view that kernels take.
  device_span<T> device_handle() noexcept { return {data_, count_}; }
  device_span<const T> device_handle() const noexcept { return {data_, count_}; }

 private:
  void release() noexcept {
    if (data_ == nullptr) return;
    Space::deallocate(data_, size_bytes());
    ledger_->discharge(Space::kind, category_, size_bytes());
    data_ = nullptr;
    count_ = 0;
  }

  T* data_ = nullptr;
  std::size_t count_ = 0;
  mem_category category_ = mem_category::other;
  std::shared_ptr<memory_ledger> ledger_;
};

namespace detail {

inline void copy_bytes(void* dst, bool dst_host, const void* src, bool src_host, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_host && src_host) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if TRIDENT_HAS_CUDA
  // cudaMemcpyDefault infers the direction from the pointers (unified addressing).
  TRIDENT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
#else
  throw usage_error("copying to or from device memory needs CUDA", "trident::copy");
#endif
}

}  // namespace detail

//! Copies every element of `src` into `dst`, across spaces as needed (synchronous).
//! Throws usage_error naming both sizes when they differ.
template <class T, memory_space From, memory_space To>
void copy(const buffer<T, From>& src, buffer<T, To>& dst) {
  TRIDENT_EXPECT(src.size() == dst.size(), "copy: source has ", src.size(), " elements, destination ", dst.size());
  detail::copy_bytes(dst.data(), To::host_accessible, src.data(), From::host_accessible, src.size_bytes());
}

//! Copies host elements into a buffer of any space.
template <class T, memory_space To>
void copy(std::span<const std::type_identity_t<T>> src, buffer<T, To>& dst) {
  TRIDENT_EXPECT(src.size() == dst.size(), "copy: source has ", src.size(), " elements, destination ", dst.size());
  detail::copy_bytes(dst.data(), To::host_accessible, src.data(), true, src.size_bytes());
}

//! Copies a buffer of any space into host memory.
template <class T, memory_space From>
void copy(const buffer<T, From>& src, std::span<std::type_identity_t<T>> dst) {
  TRIDENT_EXPECT(src.size() == dst.size(), "copy: source has ", src.size(), " elements, destination ", dst.size());
  detail::copy_bytes(dst.data(), true, src.data(), From::host_accessible, src.size_bytes());
}

//! Sets every byte to zero (0.0 for the floating-point element types).
template <class T, memory_space Space>
void fill_zero(buffer<T, Space>& buf) {
  if (buf.empty()) return;
  if constexpr (Space::host_accessible) {
    std::memset(static_cast<void*>(buf.data()), 0, buf.size_bytes());
  } else {
#if TRIDENT_HAS_CUDA
    TRIDENT_CUDA_CHECK(cudaMemset(buf.data(), 0, buf.size_bytes()));
#endif
  }
}

//! The elements copied into a std::vector on the host (handy in tests and reports).
template <class T, memory_space Space>
std::vector<T> to_vector(const buffer<T, Space>& buf) {
  std::vector<T> out(buf.size());
  copy(buf, std::span<T>{out});
  return out;
}

}  // namespace trident
