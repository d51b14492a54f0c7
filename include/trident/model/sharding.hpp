#pragma once
// One description of how an array is divided over a group of ranks, for every feature that
// divides arrays: ZeRO's buckets (model/flat_layout.hpp) and `sharded<T>`, and next tensor
// parallelism (a weight split by rows or columns), pipeline stages and checkpoint resharding.
//
//   class sharding          global shape, the axis split over the group (or none), the number
//                           of parts and the padding that makes them equal
//     sharding::replicated(shape)                         every rank holds all of it
//     sharding::split(shape, axis, parts, granule = 1)    padded: ZeRO's rule
//     sharding::split_exact(shape, axis, parts, what)     no padding: Megatron's rule, a
//                                                         usage_error unless parts divides
//   struct index_range      [begin, end) along the split axis
//   take_part, put_part     a part's elements out of / back into the global row-major array
//
// The rule (PyTorch FSDP's and DeepSpeed's flat partitioning, and Megatron's when it divides):
// the extent along the split axis is padded up to a multiple of parts x granule, and part r holds
// the r-th of `parts` equal slices of the padded extent. The real elements of part r are
// owned(r) (clipped to the extent); the rest of its slice is padding, which the owners keep zero
// so that it never disturbs sums or norms. The same rule for every feature is what lets a
// checkpoint written under one layout be read back under another: a global index along the
// axis maps to owner(i) and to i - owned(owner(i)).begin there.
//
// Only the split axis is divided; the other axes are whole on every part. A split along axis 0 of
// a row-major array leaves each part contiguous in the global array; a split along another axis
// does not (each part is a strided block), which is what tensor parallelism's column split is.
#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trident/core/error.hpp"

namespace trident {

//! [begin, end) along one axis.
struct index_range {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const noexcept { return end - begin; }
  bool empty() const noexcept { return end <= begin; }
  friend bool operator==(const index_range&, const index_range&) = default;
};

//! How an array of a global shape is divided over `parts()` ranks.
//!
//!   auto s = trident::sharding::split({10}, 0, 4);        // ZeRO: 10 elements on 4 ranks
//!   s.part_extent();   // 3: every rank holds 3 elements, 12 in all (2 of padding)
//!   s.owned(3);        // {9, 10}: rank 3 holds one real element and two of padding
//!   auto w = trident::sharding::split_exact({1024, 768}, 0, 4, "fc1.weight");  // column-parallel
//!   w.local_shape();   // {256, 768}
class sharding {
 public:
  //! Every part holds the whole array.
  static sharding replicated(std::vector<std::size_t> shape) {
    sharding s(std::move(shape));
    s.axis_.reset();
    s.parts_ = 1;
    s.granule_ = 1;
    s.padded_ = s.extent();
    return s;
  }

  //! Split along `axis` into `parts` equal slices of the extent padded up to a multiple of
  //! parts x granule (ZeRO's rule: any size, with padding).
  static sharding split(std::vector<std::size_t> shape, std::size_t axis, int parts, std::size_t granule = 1) {
    sharding s(std::move(shape));
    s.set_split(axis, parts, granule, "sharding::split");
    return s;
  }

  //! Split along `axis` into `parts` equal slices without padding (Megatron's rule: the
  //! tensor-parallel size must divide the heads, the hidden size, the vocabulary): a usage_error
  //! naming `what`, the extent and the parts when it does not divide.
  static sharding split_exact(std::vector<std::size_t> shape, std::size_t axis, int parts, std::string_view what = "sharding") {
    sharding s(std::move(shape));
    s.set_split(axis, parts, 1, "sharding::split_exact");
    TRIDENT_EXPECT(s.extent() % static_cast<std::size_t>(parts) == 0, what, ": ", s.extent(),
                   " elements along axis ", axis, " do not divide into ", parts,
                   " equal parts; expected a multiple of ", parts);
    return s;
  }

  //! The global shape, without padding.
  const std::vector<std::size_t>& shape() const noexcept { return shape_; }
  //! The split axis; empty when replicated.
  std::optional<std::size_t> axis() const noexcept { return axis_; }
  bool is_split() const noexcept { return axis_.has_value(); }
  int parts() const noexcept { return parts_; }
  std::size_t granule() const noexcept { return granule_; }

  //! Elements of the array, without padding.
  std::size_t numel() const noexcept { return product(shape_); }
  //! The global extent along the split axis (the element count of a 1-D array; numel() when
  //! replicated).
  std::size_t extent() const noexcept { return axis_ ? shape_[*axis_] : numel(); }
  //! extent() padded up to a multiple of parts x granule.
  std::size_t padded_extent() const noexcept { return padded_; }
  //! Each part's extent along the split axis, padding included.
  std::size_t part_extent() const noexcept { return padded_ / static_cast<std::size_t>(parts_); }
  //! Elements of all parts together, padding included.
  std::size_t padded_numel() const noexcept { return numel_without_axis() * padded_; }
  //! Elements of padding over all parts.
  std::size_t padding() const noexcept { return padded_numel() - numel(); }
  //! Elements each part holds, padding included.
  std::size_t local_numel() const noexcept { return numel_without_axis() * part_extent(); }
  //! The shape each part holds, padding included.
  std::vector<std::size_t> local_shape() const {
    std::vector<std::size_t> s = shape_;
    if (axis_) s[*axis_] = part_extent();
    return s;
  }

  //! The real elements of part `part` along the split axis, in global coordinates (possibly
  //! empty: a last part of nothing but padding). The whole extent when replicated.
  index_range owned(int part) const {
    check_part(part, "sharding::owned");
    if (!axis_) return {0, extent()};
    const std::size_t e = extent();
    const std::size_t b = std::min(e, part_extent() * static_cast<std::size_t>(part));
    return {b, std::min(e, b + part_extent())};
  }
  //! The slice of part `part` along the split axis, padding included: [part x part_extent, ...).
  index_range slice(int part) const {
    check_part(part, "sharding::slice");
    if (!axis_) return {0, extent()};
    const std::size_t b = part_extent() * static_cast<std::size_t>(part);
    return {b, b + part_extent()};
  }
  //! The part that owns global index `i` along the split axis (0 when replicated).
  int owner(std::size_t i) const {
    TRIDENT_EXPECT(i < extent(), "sharding::owner(", i, "): the split axis has ", extent(), " elements");
    return axis_ ? static_cast<int>(i / part_extent()) : 0;
  }

  //! Elements before the split axis (its outer extent in row-major order) and after it (the
  //! elements per index of the axis): part r's elements are, for each of the `outer` indices,
  //! one contiguous run of part_extent() x inner elements. 1 and 1 when replicated.
  std::size_t outer() const noexcept {
    std::size_t n = 1;
    if (axis_)
      for (std::size_t d = 0; d < *axis_; ++d) n *= shape_[d];
    return n;
  }
  std::size_t inner() const noexcept {
    std::size_t n = 1;
    if (axis_)
      for (std::size_t d = *axis_ + 1; d < shape_.size(); ++d) n *= shape_[d];
    return n;
  }

  friend bool operator==(const sharding&, const sharding&) = default;

 private:
  explicit sharding(std::vector<std::size_t> shape) : shape_(std::move(shape)) {
    // numel() and the padded counts are products of the extents: checked here, never wrapped
    // (a shape of 2^62 x 8 was an array of 0 elements).
    std::size_t n = 1;
    for (std::size_t d : shape_) {
      if (__builtin_mul_overflow(n, d, &n)) {
        std::string dims;
        for (std::size_t e : shape_) dims += (dims.empty() ? "" : " x ") + std::to_string(e);
        throw usage_error(detail::concat("sharding: a shape of ", dims, " has more elements than std::size_t counts"));
      }
    }
  }

  static std::size_t product(const std::vector<std::size_t>& v) noexcept {
    std::size_t n = 1;
    for (std::size_t d : v) n *= d;
    return n;
  }
  // Elements per index of the split axis (1 when replicated: the array counts as 1-D).
  std::size_t numel_without_axis() const noexcept {
    if (!axis_) return 1;
    std::size_t n = 1;
    for (std::size_t d = 0; d < shape_.size(); ++d)
      if (d != *axis_) n *= shape_[d];
    return n;
  }
  void set_split(std::size_t axis, int parts, std::size_t granule, std::string_view who) {
    TRIDENT_EXPECT(parts >= 1, who, ": expected at least one part, got ", parts);
    TRIDENT_EXPECT(granule >= 1, who, ": the granule must be at least one element, got ", granule);
    TRIDENT_EXPECT(axis < shape_.size(), who, ": axis ", axis, " is not an axis of a ", shape_.size(),
                   "-dimensional shape");
    axis_ = axis;
    parts_ = parts;
    granule_ = granule;
    const std::size_t e = extent();
    // parts x granule and the padded extent may not fit when the inputs are huge: checked,
    // never wrapped (a wrapped quantum of 0 would divide by zero).
    constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
    const auto p = static_cast<std::size_t>(parts);
    TRIDENT_EXPECT(granule <= max / p, who, ": ", parts, " parts x a granule of ", granule, " overflow std::size_t");
    const std::size_t quantum = p * granule;
    const std::size_t slices = e / quantum + (e % quantum != 0 ? 1 : 0);
    TRIDENT_EXPECT(slices <= max / quantum, who, ": ", e, " elements padded to a multiple of ", quantum,
                   " overflow std::size_t");
    padded_ = slices * quantum;
    std::size_t padded_numel = 0;
    TRIDENT_EXPECT(!__builtin_mul_overflow(numel_without_axis(), padded_, &padded_numel), who, ": ", e,
                   " elements along axis ", axis, ", padded to ", padded_, ", overflow std::size_t in all");
  }
  void check_part(int part, std::string_view who) const {
    TRIDENT_EXPECT(part >= 0 && part < parts_, who, "(", part, "): not a part; expected 0..", parts_ - 1);
  }

  std::vector<std::size_t> shape_;
  std::optional<std::size_t> axis_;
  int parts_ = 1;
  std::size_t granule_ = 1;
  std::size_t padded_ = 0;  // extent along the split axis, padded
};

namespace detail {
template <class F>
void for_each_run(const sharding& s, int part, F&& f) {
  // A replicated array is whole on every rank, whatever its index in the group.
  TRIDENT_EXPECT(part >= 0, "take_part/put_part: part ", part, " is negative");
  if (!s.is_split()) part = 0;
  // One run of real elements per outer index: (global offset, local offset, length).
  const index_range own = s.owned(part);
  const std::size_t inner = s.inner(), e = s.extent(), pe = s.part_extent();
  const std::size_t first = s.is_split() ? s.slice(part).begin : 0;
  for (std::size_t o = 0; o < s.outer(); ++o)
    f(o * e * inner + own.begin * inner, o * pe * inner + (own.begin - first) * inner, own.size() * inner);
}
}  // namespace detail

//! Copies part `part` of a global row-major array into `local` (local_numel() elements; its
//! padding is zeroed): how a tensor-parallel rank takes its shard of weights generated whole,
//! so that the same seed gives the same model whatever the number of parts. `part` is the
//! rank in the group; a replicated array is whole for every rank.
//!
//!   auto w = trident::sharding::split_exact({out, in}, 1, t, "fc2.weight");   // row-parallel: columns
//!   std::vector<float> mine(w.local_numel());
//!   trident::take_part<float>(w, rank, full, mine);
template <class T>
void take_part(const sharding& s, int part, std::span<const T> global, std::span<T> local) {
  TRIDENT_EXPECT(global.size() == s.numel(), "take_part: the global array has ", global.size(), " elements; expected ",
                 s.numel());
  TRIDENT_EXPECT(local.size() == s.local_numel(), "take_part(", part, "): the local array has ", local.size(),
                 " elements; expected ", s.local_numel());
  std::fill(local.begin(), local.end(), T{});
  detail::for_each_run(s, part, [&](std::size_t g, std::size_t l, std::size_t n) {
    std::copy_n(global.begin() + static_cast<std::ptrdiff_t>(g), n, local.begin() + static_cast<std::ptrdiff_t>(l));
  });
}

//! The inverse: writes part `part`'s real elements from `local` into their places in `global`
//! (padding is dropped); every part put once rebuilds the whole array.
template <class T>
void put_part(const sharding& s, int part, std::span<const T> local, std::span<T> global) {
  TRIDENT_EXPECT(global.size() == s.numel(), "put_part: the global array has ", global.size(), " elements; expected ",
                 s.numel());
  TRIDENT_EXPECT(local.size() == s.local_numel(), "put_part(", part, "): the local array has ", local.size(),
                 " elements; expected ", s.local_numel());
  detail::for_each_run(s, part, [&](std::size_t g, std::size_t l, std::size_t n) {
    std::copy_n(local.begin() + static_cast<std::ptrdiff_t>(l), n, global.begin() + static_cast<std::ptrdiff_t>(g));
  });
}

}  // namespace trident
