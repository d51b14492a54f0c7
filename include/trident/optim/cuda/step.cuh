// trident/optim/cuda/step.cuh — the fused optimizer step and gradient statistics on the device.
// trident-requires: nvcc
//
// Synopsis
//   namespace trident::cuda
//     void step(const Opt& o, device_span<float> params, device_span<const Grad> grads,
//               std::array<device_span<float>, Opt::state_count> state, std::int64_t step_number,
//               float grad_multiplier = 1, device_span<Working> working_copy = {}, cudaStream_t stream = 0)
//     void step_deferred(const Opt& o, params, grads, state, const double* decision_on_device,
//                        device_span<Working> working_copy = {}, cudaStream_t stream = 0)
//                                   the same, applied or not, step number and multiplier read on the device
//     std::size_t gradient_stats_scratch_size(std::size_t n)             doubles gradient_stats_async needs
//     void gradient_stats_async(device_span<const Grad> grads, float multiplier,
//                               device_span<double> scratch, cudaStream_t stream = 0)   scratch[0] = sum of squares
//     void gradient_stats_async(grads, multiplier, double* sum, device_span<double> partials, stream)
//     optim::grad_stats gradient_stats(device_span<const Grad> grads, float multiplier = 1, cudaStream_t stream = 0)
//
// For CUDA translation units only. The step is one kernel per call over a flat shard, running
// the optimizer's element functor from optim/optimizers.hpp (the host step's code, with
// explicitly rounded intrinsics), so host and device agree bitwise when the host does not
// contract into FMA. A grid-stride loop over groups of four: float4 loads and stores of params
// and states, 8-byte loads of four fp16/bf16 gradients and stores of four working values, when
// every array is aligned for that; a scalar tail (or the scalar loop for unaligned shards).
// gradient_stats is one CUB TransformReduce: deterministic from run to run on one GPU, within
// about 1e-15 of the host's sum (not bitwise: CUB adds in its own order).
#pragma once

#if !defined(__CUDACC__)
#error "trident/optim/cuda/step.cuh is for CUDA translation units: compile this file with nvcc"
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cub/device/device_reduce.cuh>
#include <cuda/std/functional>

#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "trident/core/error.hpp"
#include "trident/core/half.hpp"
#include "trident/core/memory_space.hpp"
#include "trident/core/cuda/convert.cuh"
#include "trident/optim/optimizers.hpp"

namespace trident::cuda {

namespace detail {

// Four consecutive gradients as floats, multiplied; `at` is a multiple of 4 and the pointer is
// aligned to 4 elements.
template <class Grad>
__device__ inline void load4(const Grad* g, std::size_t at, float multiplier, float (&out)[4]) {
  if constexpr (std::is_same_v<Grad, float>) {
    const float4 v = *reinterpret_cast<const float4*>(g + at);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(g + at);
    out[0] = static_cast<float>(Grad::from_bits(static_cast<std::uint16_t>(raw.x & 0xffffu)));
    out[1] = static_cast<float>(Grad::from_bits(static_cast<std::uint16_t>(raw.x >> 16)));
    out[2] = static_cast<float>(Grad::from_bits(static_cast<std::uint16_t>(raw.y & 0xffffu)));
    out[3] = static_cast<float>(Grad::from_bits(static_cast<std::uint16_t>(raw.y >> 16)));
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) out[k] = __fmul_rn(out[k], multiplier);
}

template <class Working>
__device__ inline void store4(Working* w, std::size_t at, const float (&p)[4]) {
  if constexpr (std::is_same_v<Working, float>) {
    *reinterpret_cast<float4*>(w + at) = make_float4(p[0], p[1], p[2], p[3]);
  } else {
    const std::uint32_t lo = Working(p[0]).bits() | (static_cast<std::uint32_t>(Working(p[1]).bits()) << 16);
    const std::uint32_t hi = Working(p[2]).bits() | (static_cast<std::uint32_t>(Working(p[3]).bits()) << 16);
    *reinterpret_cast<uint2*>(w + at) = make_uint2(lo, hi);
  }
}

__device__ inline void to_array(const float4& v, float (&a)[4]) {
  a[0] = v.x;
  a[1] = v.y;
  a[2] = v.z;
  a[3] = v.w;
}

// The body of a step kernel: this thread's elements of the grid-stride loop.
template <class Update, class Grad, class Working>
__device__ inline void step_elements(const Update& u, float* __restrict__ p, const Grad* __restrict__ g,
                                     float* __restrict__ s0, float* __restrict__ s1, float* __restrict__ s2,
                                     Working* __restrict__ w, std::size_t n, float multiplier, bool vectorised) {
  constexpr std::size_t states = Update::states;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t tail = 0;
  if (vectorised) {
    const std::size_t quads = n / 4;
    for (std::size_t q = first; q < quads; q += stride) {
      const std::size_t at = q * 4;
      float pv[4], gv[4], a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0}, c[4] = {0, 0, 0, 0};
      to_array(*reinterpret_cast<const float4*>(p + at), pv);
      load4(g, at, multiplier, gv);
      if constexpr (states >= 1) to_array(*reinterpret_cast<const float4*>(s0 + at), a);
      if constexpr (states >= 2) to_array(*reinterpret_cast<const float4*>(s1 + at), b);
      if constexpr (states >= 3) to_array(*reinterpret_cast<const float4*>(s2 + at), c);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (states >= 3) u(pv[k], gv[k], a[k], b[k], c[k]);
        else u(pv[k], gv[k], a[k], b[k]);
      }
      *reinterpret_cast<float4*>(p + at) = make_float4(pv[0], pv[1], pv[2], pv[3]);
      if constexpr (states >= 1) *reinterpret_cast<float4*>(s0 + at) = make_float4(a[0], a[1], a[2], a[3]);
      if constexpr (states >= 2) *reinterpret_cast<float4*>(s1 + at) = make_float4(b[0], b[1], b[2], b[3]);
      if constexpr (states >= 3) *reinterpret_cast<float4*>(s2 + at) = make_float4(c[0], c[1], c[2], c[3]);
      if (w != nullptr) store4(w, at, pv);
    }
    tail = quads * 4;
  }
  for (std::size_t i = tail + first; i < n; i += stride) {
    float pv = p[i];
    const float gv = __fmul_rn(static_cast<float>(g[i]), multiplier);
    float a = 0, b = 0, c = 0;
    if constexpr (states >= 1) a = s0[i];
    if constexpr (states >= 2) b = s1[i];
    if constexpr (states >= 3) c = s2[i];
    if constexpr (states >= 3) u(pv, gv, a, b, c);
    else u(pv, gv, a, b);
    p[i] = pv;
    if constexpr (states >= 1) s0[i] = a;
    if constexpr (states >= 2) s1[i] = b;
    if constexpr (states >= 3) s2[i] = c;
    if (w != nullptr) w[i] = Working(pv);
  }
}

template <class Update, class Grad, class Working>
__global__ void step_kernel(Update u, float* __restrict__ p, const Grad* __restrict__ g, float* __restrict__ s0,
                            float* __restrict__ s1, float* __restrict__ s2, Working* __restrict__ w, std::size_t n,
                            float multiplier, bool vectorised) {
  step_elements(u, p, g, s0, s1, s2, w, n, multiplier, vectorised);
}

// The deferred step: whether it runs, its step number and its multiplier come from device
// memory (optim::deferred_decision), and every thread builds the update from them (a few double
// operations per thread, against a pass over the shard).
template <class Opt, class Grad, class Working>
__global__ void deferred_step_kernel(typename Opt::options o, const double* __restrict__ decision, float* __restrict__ p,
                                     const Grad* __restrict__ g, float* __restrict__ s0, float* __restrict__ s1,
                                     float* __restrict__ s2, Working* __restrict__ w, std::size_t n, bool vectorised) {
  using dd = optim::deferred_decision;
  if (decision[dd::apply] == 0.0) return;
  const auto t = static_cast<std::int64_t>(decision[dd::step_number]);
  const auto multiplier = static_cast<float>(decision[dd::multiplier]);
  Opt::dispatch(o, t, [&](const auto& u) {
    using update = std::remove_cvref_t<decltype(u)>;
    // A state the update does not use is not touched (it may be empty), as in cuda::step.
    step_elements(u, p, g, update::states >= 1 ? s0 : nullptr, update::states >= 2 ? s1 : nullptr,
                  update::states >= 3 ? s2 : nullptr, w, n, multiplier, vectorised);
  });
}

inline bool aligned(const void* pointer, std::size_t bytes) noexcept {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

// Whether every array takes the kernels' groups of four (float4 and 8-byte half loads); a null
// state (one the update does not use) or working copy does not count.
template <class Grad, class Working>
bool vectorisable(const float* p, const Grad* g, const float* s0, const float* s1, const float* s2, const Working* w) noexcept {
  return aligned(p, 16) && aligned(g, 4 * sizeof(Grad)) && (s0 == nullptr || aligned(s0, 16)) &&
         (s1 == nullptr || aligned(s1, 16)) && (s2 == nullptr || aligned(s2, 16)) &&
         (w == nullptr || aligned(w, 4 * sizeof(Working)));
}

// The element function of gradient_stats: the product rounded to float, squared in double.
template <class Grad>
struct scaled_square {
  float multiplier;
  __device__ double operator()(Grad g) const {
    const double x = __fmul_rn(static_cast<float>(g), multiplier);
    return __dmul_rn(x, x);
  }
};

// CUB's temporary storage for n gradients of type Grad (a host-side query: nothing runs).
template <class Grad>
std::size_t stats_temp_bytes(std::size_t n) {
  std::size_t bytes = 0;
  TRIDENT_CUDA_CHECK(cub::DeviceReduce::TransformReduce(nullptr, bytes, static_cast<const Grad*>(nullptr),
                                                        static_cast<double*>(nullptr), n, ::cuda::std::plus<double>{},
                                                        scaled_square<Grad>{1.0f}, 0.0));
  return bytes;
}

}  // namespace detail

//! One optimizer step over a flat device shard, ordered on `stream`; the same arguments and
//! checks (sizes, step number, overlaps) as the host step, same results.
//!
//!   trident::optim::adamw opt;
//!   trident::cuda::step(opt, master.device_handle(), grads_view, {m.device_handle(), v.device_handle()}, t,
//!                       multiplier, working.device_handle(), stream);
template <optim::elementwise_optimizer Opt, class Grad, class Working = float>
void step(const Opt& o, device_span<float> params, device_span<const Grad> grads,
          std::array<device_span<float>, Opt::state_count> state, std::int64_t step_number, float grad_multiplier = 1.0f,
          device_span<Working> working_copy = {}, cudaStream_t stream = nullptr) {
  static_assert(optim::detail::is_grad_type_v<Grad>, "cuda::step: gradients must be float, trident::fp16 or trident::bf16");
  static_assert(optim::detail::is_grad_type_v<Working>,
                "cuda::step: the working copy must be float, trident::fp16 or trident::bf16");
  o.visit_update(step_number, [&](const auto& u) {
    using update = std::remove_cvref_t<decltype(u)>;
    constexpr std::size_t S = Opt::state_count;
    std::array<float*, S> pointers{};
    std::array<std::size_t, S> sizes{};
    for (std::size_t s = 0; s < S; ++s) {
      pointers[s] = state[s].data();
      sizes[s] = state[s].size();
    }
    optim::detail::check_step("cuda::step", params.data(), params.size(), grads.data(), grads.size(), pointers, sizes,
                              update::states, working_copy.data(), working_copy.size(), step_number);
    const std::size_t n = params.size();
    if (n == 0) return;
    auto state_at = [&]<std::size_t I>() -> float* {
      if constexpr (I < S && I < update::states) return pointers[I];
      else return nullptr;
    };
    float* s0 = state_at.template operator()<0>();
    float* s1 = state_at.template operator()<1>();
    float* s2 = state_at.template operator()<2>();
    Working* w = working_copy.empty() ? nullptr : working_copy.data();
    const bool vectorised = detail::vectorisable(params.data(), grads.data(), s0, s1, s2, w);
    constexpr int block = 256;
    const std::size_t work = vectorised ? (n + 3) / 4 : n;
    detail::step_kernel<update, Grad, Working>
        <<<grid_for(work, block), block, 0, stream>>>(u, params.data(), grads.data(), s0, s1, s2, w, n, grad_multiplier,
                                                      vectorised);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
  });
}

//! cuda::step with the decision left in device memory: `decision` points at the
//! optim::deferred_decision doubles (apply, step number, multiplier), which some earlier work on
//! `stream` writes; the kernel does nothing when apply is 0. Nothing is read back and nothing
//! allocated, so it can be captured into a CUDA graph; zero_optimizer::step_async decides so.
//! The same checks as cuda::step (the step number's is made when the decision is written), the
//! same results, but for the update's scalars, which the kernel computes with the device's pow
//! (see optim::detail::visit_adam).
//!
//!   trident::cuda::step_deferred(opt, params, grads, {m, v}, decision_on_device, working, stream);
template <optim::deferrable_optimizer Opt, class Grad, class Working = float>
void step_deferred(const Opt& o, device_span<float> params, device_span<const Grad> grads,
                   std::array<device_span<float>, Opt::state_count> state, const double* decision,
                   device_span<Working> working_copy = {}, cudaStream_t stream = nullptr) {
  static_assert(optim::detail::is_grad_type_v<Grad>, "cuda::step_deferred: gradients must be float, trident::fp16 or trident::bf16");
  static_assert(optim::detail::is_grad_type_v<Working>,
                "cuda::step_deferred: the working copy must be float, trident::fp16 or trident::bf16");
  TRIDENT_EXPECT(decision != nullptr, "cuda::step_deferred: the decision pointer is null");
  constexpr std::size_t S = Opt::state_count;
  std::array<float*, S> pointers{};
  std::array<std::size_t, S> sizes{};
  for (std::size_t s = 0; s < S; ++s) {
    pointers[s] = state[s].data();
    sizes[s] = state[s].size();
  }
  // The hyperparameters and sizes as cuda::step checks them (step 1: the states an update uses do
  // not depend on the step number).
  o.visit_update(1, [&](const auto& u) {
    using update = std::remove_cvref_t<decltype(u)>;
    optim::detail::check_step("cuda::step_deferred", params.data(), params.size(), grads.data(), grads.size(), pointers, sizes,
                              update::states, working_copy.data(), working_copy.size(), 1);
    for (std::size_t s = update::states; s < S; ++s) pointers[s] = nullptr;
  });
  const std::size_t n = params.size();
  if (n == 0) return;
  auto state_at = [&](std::size_t i) -> float* { return i < S ? pointers[i] : nullptr; };
  float* s0 = state_at(0);
  float* s1 = state_at(1);
  float* s2 = state_at(2);
  Working* w = working_copy.empty() ? nullptr : working_copy.data();
  const bool vectorised = detail::vectorisable(params.data(), grads.data(), s0, s1, s2, w);
  constexpr int block = 256;
  const std::size_t work = vectorised ? (n + 3) / 4 : n;
  detail::deferred_step_kernel<Opt, Grad, Working>
      <<<grid_for(work, block), block, 0, stream>>>(o.opt, decision, params.data(), grads.data(), s0, s1, s2, w, n, vectorised);
  TRIDENT_CUDA_CHECK(cudaGetLastError());
}

//! The doubles of scratch gradient_stats_async needs for n gradients (of any gradient type):
//! one for the sum and CUB's temporary storage. Asks CUB, which runs nothing on the device.
inline std::size_t gradient_stats_scratch_size(std::size_t n) {
  const std::size_t bytes = std::max({detail::stats_temp_bytes<float>(n), detail::stats_temp_bytes<fp16>(n),
                                      detail::stats_temp_bytes<bf16>(n)});
  return 1 + (bytes + sizeof(double) - 1) / sizeof(double);
}

//! The sum of squares of float(g) * multiplier into *sum (device memory), ordered on `stream`,
//! nothing synchronised or allocated (a non-finite value there means a non-finite gradient; see
//! optim::gradient_stats). `partials` holds at least gradient_stats_scratch_size(grads.size()) - 1
//! doubles (CUB's temporary storage), and must not contain *sum.
//!
//! One cub::DeviceReduce::TransformReduce: deterministic from run to run on one GPU (CUB's
//! reduction uses no atomics), in CUB's order of additions, so the sum can differ from the
//! host's optim::gradient_stats in the last bits (about 1e-15 relative). Issue 10 measured our own
//! kernels, which followed the host's order bit for bit, against it: CUB was 1.7x (fp32) and
//! 2.0x (bf16) faster on an H200 (bench/RESULTS.md), so the device path is CUB's.
template <class Grad>
void gradient_stats_async(device_span<const Grad> grads, float multiplier, double* sum, device_span<double> partials,
                          cudaStream_t stream = nullptr) {
  static_assert(optim::detail::is_grad_type_v<Grad>, "cuda::gradient_stats: gradients must be float, fp16 or bf16");
  std::size_t bytes = detail::stats_temp_bytes<Grad>(grads.size());
  TRIDENT_EXPECT(partials.size() * sizeof(double) >= bytes, "cuda::gradient_stats_async: the scratch has ", partials.size(),
                 " doubles, needs ", (bytes + sizeof(double) - 1) / sizeof(double), " for ", grads.size(), " gradients");
  TRIDENT_EXPECT(sum != nullptr && (sum < partials.data() || sum >= partials.data() + partials.size()),
                 "cuda::gradient_stats_async: the sum's slot is null or inside the scratch");
  if (grads.empty()) {  // the sum of nothing, without asking CUB what it writes for no items
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(double), stream));
    return;
  }
  TRIDENT_CUDA_CHECK(cub::DeviceReduce::TransformReduce(partials.data(), bytes, grads.data(), sum, grads.size(),
                                                        ::cuda::std::plus<double>{}, detail::scaled_square<Grad>{multiplier},
                                                        0.0, stream));
}

//! The same with one scratch array: the sum in scratch[0], the partials after it.
//! scratch holds at least gradient_stats_scratch_size(grads.size()) doubles.
template <class Grad>
void gradient_stats_async(device_span<const Grad> grads, float multiplier, device_span<double> scratch,
                          cudaStream_t stream = nullptr) {
  TRIDENT_EXPECT(scratch.size() >= gradient_stats_scratch_size(grads.size()), "cuda::gradient_stats_async: scratch has ",
                 scratch.size(), " doubles, needs ", gradient_stats_scratch_size(grads.size()), " for ", grads.size(),
                 " gradients");
  gradient_stats_async(grads, multiplier, scratch.data(), device_span<double>(scratch.data() + 1, scratch.size() - 1), stream);
}

//! gradient_stats_async with its own scratch, waited for: convenient, not for the hot path (it
//! allocates and synchronises the stream).
template <class Grad>
optim::grad_stats gradient_stats(device_span<const Grad> grads, float multiplier = 1.0f, cudaStream_t stream = nullptr) {
  buffer<double, cuda_space> scratch(gradient_stats_scratch_size(grads.size()));
  gradient_stats_async(grads, multiplier, scratch.device_handle(), stream);
  double sum = 0;
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(&sum, scratch.data(), sizeof sum, cudaMemcpyDeviceToHost, stream));
  TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return {sum, std::isfinite(sum)};
}

}  // namespace trident::cuda
