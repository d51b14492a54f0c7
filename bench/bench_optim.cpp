// Host optimizer steps over 16M parameters against a streaming kernel that moves the same bytes
// on the same threads, so that one run says how close to the memory's speed each step is:
//
//   adamw / adam / sgd_momentum         trident's step on the path this CPU runs (AVX-512, AVX2
//     <fp32 | bf16>                     or portable; the counter `isa` says which: 2, 1, 0);
//                                       fp32: float gradients, no working copy; bf16: bf16
//                                       gradients and a bf16 working copy (mixed precision)
//   adamw_fp32_path/<isa>               AdamW with each path forced (0 portable, 1 avx2, 2 avx512)
//   stream_<adam | sgd>_<fp32 | bf16>   the same arrays read and written once per element by a
//                                       trivial kernel (x + g), split like the step over the
//                                       program's thread_pool: the bandwidth to compare with
//   adamw_scalar_loop                   the obvious one-thread loop, for scale
//
// Bytes per parameter: Adam/AdamW fp32 read param, grad, exp_avg, exp_avg_sq (16 B) and write
// param, exp_avg, exp_avg_sq (12 B) = 28 B; bf16 read 14 B, write 14 B = 28 B. SGD with momentum
// fp32 reads param, grad, buffer (12 B) and writes param, buffer (8 B) = 20 B; bf16 = 10 + 10 B.
// `bytes_per_second` is that traffic; `threads_used` the worker count of the step.
//
//   ./bench_optim --benchmark_min_time=1
//   bench/optim_vs_torch.sh                 the same beside torch's fused CPU optimizers
#include <benchmark/benchmark.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "trident/core/half.hpp"
#include "trident/optim/host_simd.hpp"
#include "trident/optim/optimizers.hpp"

namespace {

namespace detail = trident::optim::detail;

// 16M parameters, or TRIDENT_BENCH_OPTIM_N (bench/optim_vs_torch.sh's N: 64M for the offload
// engine's figure, issue 14).
const std::size_t n = [] {
  const char* e = std::getenv("TRIDENT_BENCH_OPTIM_N");
  return e != nullptr && *e != '\0' ? static_cast<std::size_t>(std::strtoull(e, nullptr, 10)) : std::size_t{1} << 24;
}();

struct arrays {
  std::vector<float> p = std::vector<float>(n, 0.5f);
  std::vector<float> g = std::vector<float>(n, 0.01f);
  std::vector<float> m = std::vector<float>(n, 0.0f);
  std::vector<float> v = std::vector<float>(n, 0.0f);
  std::vector<trident::bf16> g16 = std::vector<trident::bf16>(n, trident::bf16(0.01f));
  std::vector<trident::bf16> w16 = std::vector<trident::bf16>(n, trident::bf16(0.0f));
};

arrays& data() {
  static arrays a;
  return a;
}

void set_counters(benchmark::State& state, double bytes_per_param) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes_per_param * n));
  state.counters["params_per_second"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * n, benchmark::Counter::kIsRate);
  state.counters["threads_used"] = detail::worker_count(n);
  state.counters["isa"] = static_cast<double>(detail::active_host_isa());
}

// ---- trident's steps -------------------------------------------------------------------------

template <class Opt>
void step_fp32(benchmark::State& state, const Opt& opt, double bytes) {
  auto& a = data();
  std::int64_t t = 1;
  for (auto _ : state) {
    if constexpr (Opt::state_count == 2)
      opt.step(std::span<float>(a.p), std::span<const float>(a.g), {std::span<float>(a.m), std::span<float>(a.v)}, t++,
               0.5f);
    else
      opt.step(std::span<float>(a.p), std::span<const float>(a.g), {std::span<float>(a.m)}, t++, 0.5f);
    benchmark::ClobberMemory();
  }
  set_counters(state, bytes);
}

template <class Opt>
void step_bf16(benchmark::State& state, const Opt& opt, double bytes) {
  auto& a = data();
  std::int64_t t = 1;
  for (auto _ : state) {
    if constexpr (Opt::state_count == 2)
      opt.step(std::span<float>(a.p), std::span<const trident::bf16>(a.g16), {std::span<float>(a.m), std::span<float>(a.v)},
               t++, 0.5f, std::span<trident::bf16>(a.w16));
    else
      opt.step(std::span<float>(a.p), std::span<const trident::bf16>(a.g16), {std::span<float>(a.m)}, t++, 0.5f,
               std::span<trident::bf16>(a.w16));
    benchmark::ClobberMemory();
  }
  set_counters(state, bytes);
}

const trident::optim::adamw adamw_opt{{.lr = 1e-3f}};
const trident::optim::adam adam_opt{{.lr = 1e-3f}};
const trident::optim::sgd sgd_opt{{.lr = 1e-2f, .momentum = 0.9f}};

void adamw_fp32(benchmark::State& s) { step_fp32(s, adamw_opt, 28); }
void adamw_bf16(benchmark::State& s) { step_bf16(s, adamw_opt, 28); }
void adam_fp32(benchmark::State& s) { step_fp32(s, adam_opt, 28); }
void adam_bf16(benchmark::State& s) { step_bf16(s, adam_opt, 28); }
void sgd_momentum_fp32(benchmark::State& s) { step_fp32(s, sgd_opt, 20); }
void sgd_momentum_bf16(benchmark::State& s) { step_bf16(s, sgd_opt, 20); }

void adamw_fp32_path(benchmark::State& s) {
  if (!detail::force_host_isa(static_cast<detail::host_isa>(s.range(0)))) {
    s.SkipWithError("this CPU lacks the path");
    return;
  }
  step_fp32(s, adamw_opt, 28);
  detail::unforce_host_isa();
}

// ---- the streaming reference -----------------------------------------------------------------
// Every array touched once per element, as by the step, with the least arithmetic: x += g for
// the read-write arrays, the working copy written from the parameter. Compiled for the widest
// vectors the CPU has (function multiversioning), split over the pool exactly like the step.

// GCC vector types (memcpy loads and stores), 16 lanes: one zmm, two ymm or four xmm registers
// depending on the clone; -O2 alone does not vectorise a loop that needs an epilogue.
using f32x16 = float __attribute__((vector_size(64)));
using u32x16 = std::uint32_t __attribute__((vector_size(64)));
using u16x16 = std::uint16_t __attribute__((vector_size(32)));

// Clang (16) does not multiversion function templates: there the loop is compiled once, for the
// default target.
#if defined(__clang__)
#define BENCH_CLONES
#else
#define BENCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

template <int States, class Grad, bool Working>
BENCH_CLONES void stream_range(float* __restrict p, const Grad* __restrict g, float* __restrict m,
                               float* __restrict v, std::uint16_t* __restrict w, std::size_t len) {
  constexpr std::size_t width = 16;
  // One element, for the unaligned head and the tail.
  auto element = [&](std::size_t i) {
    float gi;
    if constexpr (std::is_same_v<Grad, float>) gi = g[i];
    else gi = std::bit_cast<float>(static_cast<std::uint32_t>(g[i]) << 16);
    const float x = p[i] + gi;
    p[i] = x;
    if constexpr (States >= 1) m[i] = m[i] + gi;
    if constexpr (States >= 2) v[i] = v[i] + gi;
    if constexpr (Working) w[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16);
  };
  std::size_t i = 0;
  // Element by element until p is 64-byte aligned, as the step does: a misaligned 64-byte access
  // touches two cache lines (and costs this loop a fifth of its speed).
  for (; i < len && reinterpret_cast<std::uintptr_t>(p + i) % 64 != 0; ++i) element(i);
  for (; i + width <= len; i += width) {
    f32x16 gi;
    if constexpr (std::is_same_v<Grad, float>) {
      std::memcpy(&gi, g + i, sizeof gi);
    } else {
      u16x16 h;
      std::memcpy(&h, g + i, sizeof h);
      gi = reinterpret_cast<f32x16>(__builtin_convertvector(h, u32x16) << 16);
    }
    f32x16 x;
    std::memcpy(&x, p + i, sizeof x);
    x += gi;
    std::memcpy(p + i, &x, sizeof x);
    if constexpr (States >= 1) {
      f32x16 y;
      std::memcpy(&y, m + i, sizeof y);
      y += gi;
      std::memcpy(m + i, &y, sizeof y);
    }
    if constexpr (States >= 2) {
      f32x16 y;
      std::memcpy(&y, v + i, sizeof y);
      y += gi;
      std::memcpy(v + i, &y, sizeof y);
    }
    if constexpr (Working) {
      const u16x16 h = __builtin_convertvector(reinterpret_cast<u32x16>(x) >> 16, u16x16);
      std::memcpy(w + i, &h, sizeof h);
    }
  }
  for (; i < len; ++i) element(i);
}

template <int States, bool Half>
void stream(benchmark::State& state, double bytes) {
  auto& a = data();
  auto* g16 = reinterpret_cast<const std::uint16_t*>(a.g16.data());
  auto* w16 = reinterpret_cast<std::uint16_t*>(a.w16.data());
  for (auto _ : state) {
    detail::parallel_ranges(n, detail::tile_size, [&](std::size_t begin, std::size_t end) {
      if constexpr (Half)
        stream_range<States, std::uint16_t, true>(a.p.data() + begin, g16 + begin, a.m.data() + begin, a.v.data() + begin,
                                                  w16 + begin, end - begin);
      else
        stream_range<States, float, false>(a.p.data() + begin, a.g.data() + begin, a.m.data() + begin,
                                           a.v.data() + begin, nullptr, end - begin);
    });
    benchmark::ClobberMemory();
  }
  set_counters(state, bytes);
}

void stream_adam_fp32(benchmark::State& s) { stream<2, false>(s, 28); }
void stream_adam_bf16(benchmark::State& s) { stream<2, true>(s, 28); }
void stream_sgd_fp32(benchmark::State& s) { stream<1, false>(s, 20); }
void stream_sgd_bf16(benchmark::State& s) { stream<1, true>(s, 20); }

// The obvious loop: PyTorch's formulas, one thread, std::sqrt (not vectorised by -O2).
void adamw_scalar_loop(benchmark::State& state) {
  auto& a = data();
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 1e-2f, multiplier = 0.5f;
  std::int64_t t = 1;
  for (auto _ : state) {
    const double bc1 = 1 - std::pow(0.9, static_cast<double>(t));
    const float step_size = static_cast<float>(lr / bc1);
    const float bc2_sqrt = static_cast<float>(std::sqrt(1 - std::pow(0.999, static_cast<double>(t))));
    ++t;
    float* p = a.p.data();
    const float* g = a.g.data();
    float* m = a.m.data();
    float* v = a.v.data();
    for (std::size_t i = 0; i < n; ++i) {
      const float gi = g[i] * multiplier;
      p[i] *= 1 - lr * wd;
      m[i] = m[i] * beta1 + (1 - beta1) * gi;
      v[i] = v[i] * beta2 + (1 - beta2) * gi * gi;
      p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
    }
    benchmark::ClobberMemory();
  }
  set_counters(state, 28);
  state.counters["threads_used"] = 1;
}

}  // namespace

#define TRIDENT_OPTIM_BENCH(f) BENCHMARK(f)->Unit(benchmark::kMillisecond)->UseRealTime()->MinWarmUpTime(0.2)
TRIDENT_OPTIM_BENCH(adamw_fp32);
TRIDENT_OPTIM_BENCH(stream_adam_fp32);
TRIDENT_OPTIM_BENCH(adamw_bf16);
TRIDENT_OPTIM_BENCH(stream_adam_bf16);
TRIDENT_OPTIM_BENCH(adam_fp32);
TRIDENT_OPTIM_BENCH(adam_bf16);
TRIDENT_OPTIM_BENCH(sgd_momentum_fp32);
TRIDENT_OPTIM_BENCH(stream_sgd_fp32);
TRIDENT_OPTIM_BENCH(sgd_momentum_bf16);
TRIDENT_OPTIM_BENCH(stream_sgd_bf16);
TRIDENT_OPTIM_BENCH(adamw_fp32_path)->Arg(0)->Arg(1)->Arg(2);
TRIDENT_OPTIM_BENCH(adamw_scalar_loop);

BENCHMARK_MAIN();
