#pragma once
// Element-wise reductions on host memory for every dtype, shared by the thread and MPI backends
// (MPI's user-defined ops for fp16/bf16 call these too). fp16/bf16 are combined in float and
// rounded once per combination, like NCCL does on the device.
//
//   detail::host_combine(dtype, op, dst, a, b, n)     dst[i] = a[i] op b[i]   (dst may alias a or b)
//   detail::host_divide(dtype, data, n, divisor)      data[i] /= divisor      (the tail of avg)
//   detail::premultiplied_avg(dtype, op)              avg of fp16/bf16: inputs scaled first
//   detail::host_prescale(dtype, dst, src, n, ranks)  dst[i] = T(src[i] * (1/ranks))
//
// The host backends reduce the same way, so a result does not depend on which of them runs it
// or on which rank holds which value:
//   * max and min propagate NaN (a NaN on any rank gives NaN, as IEEE 754-2019's maximum and
//     PyTorch do); std::max would keep or drop it depending on the operand order, i.e. the rank.
//     NCCL differs here: its fmaxf drops a NaN unless every rank holds one (nccl_comm's
//     max_min_nan; see comm/nccl.hpp), also whichever rank holds it;
//   * avg over fp16/bf16 scales every input by 1/ranks (rounded to the type) before summing, as
//     NCCL's PreMulSum does: summing first overflows (four ranks averaging 30000 in fp16 gave
//     inf). Wider types sum, then divide.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "trident/comm/communicator.hpp"
#include "trident/core/dtype.hpp"
#include "trident/core/half.hpp"

namespace trident::detail {

template <class T>
using compute_type_t = std::conditional_t<std::is_same_v<T, fp16> || std::is_same_v<T, bf16>, float, T>;

template <class T, reduce_op Op>
void combine_typed(T* dst, const T* a, const T* b, std::size_t n) noexcept {
  using C = compute_type_t<T>;
  // dst aliases a or b only element for element (in-place collectives), never shifted, so the
  // iterations are independent: say so, and the loop vectorises without runtime alias checks.
#if defined(__clang__)
#pragma clang loop vectorize(assume_safety)
#elif defined(__GNUC__)
#pragma GCC ivdep
#endif
  for (std::size_t i = 0; i < n; ++i) {
    const C x = static_cast<C>(a[i]);
    const C y = static_cast<C>(b[i]);
    C r;
    if constexpr (Op == reduce_op::sum || Op == reduce_op::avg) r = static_cast<C>(x + y);
    else if constexpr (Op == reduce_op::prod) r = static_cast<C>(x * y);
    else if constexpr (Op == reduce_op::max) r = x != x ? x : (y != y ? y : std::max(x, y));  // NaN wins
    else r = x != x ? x : (y != y ? y : std::min(x, y));
    dst[i] = static_cast<T>(r);
  }
}

template <class T>
void combine_typed(reduce_op op, T* dst, const T* a, const T* b, std::size_t n) noexcept {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg: combine_typed<T, reduce_op::sum>(dst, a, b, n); return;
    case reduce_op::prod: combine_typed<T, reduce_op::prod>(dst, a, b, n); return;
    case reduce_op::max: combine_typed<T, reduce_op::max>(dst, a, b, n); return;
    case reduce_op::min: combine_typed<T, reduce_op::min>(dst, a, b, n); return;
  }
}

//! Calls f(T{}) with T the C++ type of `t`.
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::float32: return f(float{});
    case dtype::float64: return f(double{});
    case dtype::float16: return f(fp16{});
    case dtype::bfloat16: return f(bf16{});
    case dtype::int8: return f(std::int8_t{});
    case dtype::uint8: return f(std::uint8_t{});
    case dtype::int32: return f(std::int32_t{});
    case dtype::uint32: return f(std::uint32_t{});
    case dtype::int64: return f(std::int64_t{});
    case dtype::uint64: return f(std::uint64_t{});
  }
  throw usage_error(concat("unknown dtype ", static_cast<int>(t)));
}

inline void host_combine(dtype t, reduce_op op, void* dst, const void* a, const void* b, std::size_t n) {
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    combine_typed<T>(op, static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n);
  });
}

inline void host_divide(dtype t, void* data, std::size_t n, int divisor) {
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_type_t<T>;
    T* p = static_cast<T*>(data);
    const C d = static_cast<C>(divisor);
    for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(static_cast<C>(static_cast<C>(p[i]) / d));
  });
}

//! Whether `op` over `t` is an average computed by scaling the inputs first (fp16, bf16).
constexpr bool premultiplied_avg(dtype t, reduce_op op) noexcept {
  return op == reduce_op::avg && (t == dtype::float16 || t == dtype::bfloat16);
}

//! dst[i] = src[i] * (1 / ranks), computed in float and rounded to the type once (dst may be src).
inline void host_prescale(dtype t, void* dst, const void* src, std::size_t n, int ranks) {
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_type_t<T>;
    const C scale = static_cast<C>(1) / static_cast<C>(ranks);
    const T* in = static_cast<const T*>(src);
    T* out = static_cast<T*>(dst);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<C>(static_cast<C>(in[i]) * scale));
  });
}

}  // namespace trident::detail
