// Host AdamW step over 16M fp32 parameters: trident's tiled, vectorised, multithreaded step
// against a plain scalar loop (the same formulas, one thread) and against memcpy of the same
// traffic. Bytes counted per parameter, fp32 gradients: read param, grad, exp_avg, exp_avg_sq
// (16 B), write param, exp_avg, exp_avg_sq (12 B) = 28 B; with a bf16 gradient and a bf16 working
// copy: read 14 B, write 14 B = 28 B too. The counter `bytes_per_second` is that traffic.
//
//   ./bench_optim --benchmark_min_time=1s
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "trident/core/half.hpp"
#include "trident/optim/optimizers.hpp"

namespace {

constexpr std::size_t n = std::size_t{1} << 24;  // 16M parameters

struct arrays {
  std::vector<float> p = std::vector<float>(n, 0.5f);
  std::vector<float> g = std::vector<float>(n, 0.01f);
  std::vector<float> m = std::vector<float>(n, 0.0f);
  std::vector<float> v = std::vector<float>(n, 0.0f);
};

arrays& data() {
  static arrays a;
  return a;
}

void set_counters(benchmark::State& state, double bytes_per_param) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes_per_param * n));
  state.counters["params_per_second"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * n, benchmark::Counter::kIsRate);
}

void adamw_trident(benchmark::State& state) {
  auto& a = data();
  const trident::optim::adamw opt{{.lr = 1e-3f}};
  std::int64_t t = 1;
  for (auto _ : state) {
    opt.step(std::span<float>(a.p), std::span<const float>(a.g), {std::span<float>(a.m), std::span<float>(a.v)}, t++, 0.5f);
    benchmark::ClobberMemory();
  }
  state.counters["threads_used"] = trident::optim::detail::worker_count(n);
  set_counters(state, 28);
}

void adamw_trident_bf16(benchmark::State& state) {
  auto& a = data();
  static std::vector<trident::bf16> g(n, trident::bf16(0.01f)), w(n);
  const trident::optim::adamw opt{{.lr = 1e-3f}};
  std::int64_t t = 1;
  for (auto _ : state) {
    opt.step(std::span<float>(a.p), std::span<const trident::bf16>(g), {std::span<float>(a.m), std::span<float>(a.v)}, t++,
             0.5f, std::span<trident::bf16>(w));
    benchmark::ClobberMemory();
  }
  set_counters(state, 28);
}

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
}

// The same traffic as a copy: 14 B/param read and 14 B/param written.
void memcpy_reference(benchmark::State& state) {
  static std::vector<unsigned char> src(14 * n, 1), dst(14 * n, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  set_counters(state, 28);
}

}  // namespace

BENCHMARK(adamw_trident)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(adamw_trident_bf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(adamw_scalar_loop)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(memcpy_reference)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
