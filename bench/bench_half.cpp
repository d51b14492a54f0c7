// Host conversions between float and fp16/bf16 against memcpy of the same bytes, in one run.
// Mixed precision casts every master weight each step, so this is the host path's ceiling.
//   ./bench_half --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "trident/core/half.hpp"

namespace {

constexpr std::size_t count = std::size_t{1} << 24;  // 64 MiB of floats: out of every cache

std::vector<float> inputs() {
  std::vector<float> x(count);
  for (std::size_t i = 0; i < count; ++i) x[i] = static_cast<float>(i % 4093) * 0.37f - 700.0f;
  return x;
}

void set_bytes(benchmark::State& state, std::size_t bytes_per_element) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(count * bytes_per_element));
}

void memcpy_float(benchmark::State& state) {
  const auto src = inputs();
  std::vector<float> dst(count);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), count * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
  }
  set_bytes(state, 2 * sizeof(float));  // read + write
}

template <class Half>
void float_to_half(benchmark::State& state) {
  const auto src = inputs();
  std::vector<Half> dst(count);
  for (auto _ : state) {
    for (std::size_t i = 0; i < count; ++i) dst[i] = Half{src[i]};
    benchmark::DoNotOptimize(dst.data());
  }
  set_bytes(state, sizeof(float) + sizeof(Half));
}

template <class Half>
void half_to_float(benchmark::State& state) {
  const auto src = inputs();
  std::vector<Half> halves(count);
  for (std::size_t i = 0; i < count; ++i) halves[i] = Half{src[i]};
  std::vector<float> dst(count);
  for (auto _ : state) {
    for (std::size_t i = 0; i < count; ++i) dst[i] = halves[i];
    benchmark::DoNotOptimize(dst.data());
  }
  set_bytes(state, sizeof(float) + sizeof(Half));
}

}  // namespace

BENCHMARK(memcpy_float)->Unit(benchmark::kMillisecond);
BENCHMARK(float_to_half<trident::bf16>)->Unit(benchmark::kMillisecond);
BENCHMARK(float_to_half<trident::fp16>)->Unit(benchmark::kMillisecond);
BENCHMARK(half_to_float<trident::bf16>)->Unit(benchmark::kMillisecond);
BENCHMARK(half_to_float<trident::fp16>)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
