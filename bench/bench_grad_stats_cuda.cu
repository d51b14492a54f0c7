// Gradient statistics on the GPU (the sum of squares of float(g) * multiplier, in double, that
// global-norm clipping and the overflow check of dynamic loss scaling read): trident's
// cuda::gradient_stats_async, which is one cub::DeviceReduce::TransformReduce since issue 10's
// measurement (bench/RESULTS.md: our own host-order kernels took 1.7-2x CUB's time on an H200),
// against a raw call of the same CUB reduction and against the device's copy bandwidth, in one
// run: what the wrapper costs (its scratch query, its checks) and how near the memory's speed the
// reduction runs. Both get their scratch once, outside the timed loop, as the ZeRO step does.
//
//   ./bench_grad_stats_cuda [elements]      (default 64M; fp32 and bf16 gradients)
//
// Exit status: 0, 77 without a device, 1 when a check fails (the two must give the same bits,
// each the same bits twice, and the host's sum within 1e-12).
#include <cub/device/device_reduce.cuh>
#include <cuda/std/functional>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "cuda_timing.hpp"
#include "trident/core/half.hpp"
#include "trident/optim/cuda/step.cuh"
#include "trident/optim/optimizers.hpp"

using bench::time_ms;

namespace {

// The same element function as the kernels: the product rounded to float, squared in double.
template <class Grad>
struct scaled_square {
  float multiplier;
  __device__ double operator()(Grad g) const {
    const double x = __fmul_rn(static_cast<float>(g), multiplier);
    return __dmul_rn(x, x);
  }
};

double read_back(const trident::buffer<double, trident::cuda_space>& b) {
  double v = 0;
  TRIDENT_CUDA_CHECK(cudaMemcpy(&v, b.data(), sizeof v, cudaMemcpyDeviceToHost));
  return v;
}

template <class Grad>
bool run(const char* label, std::size_t n, double copy_gbs) {
  using space = trident::cuda_space;
  std::vector<Grad> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = Grad(static_cast<float>(static_cast<int>(i % 2001) - 1000) * 1e-3f);
  trident::buffer<Grad, space> g(n);
  trident::copy(std::span<const Grad>(host), g);
  const float multiplier = 0.5f;
  const trident::device_span<const Grad> view(g.data(), n);

  // trident's: scratch sized once.
  trident::buffer<double, space> scratch(trident::cuda::gradient_stats_scratch_size(n));
  const auto ours = [&] { trident::cuda::gradient_stats_async(view, multiplier, scratch.device_handle()); };
  // CUB, called directly: temporary storage sized once.
  trident::buffer<double, space> cub_out(1);
  std::size_t temp_bytes = 0;
  TRIDENT_CUDA_CHECK(cub::DeviceReduce::TransformReduce(nullptr, temp_bytes, g.data(), cub_out.data(), n,
                                                        cuda::std::plus<double>{}, scaled_square<Grad>{multiplier}, 0.0));
  trident::buffer<std::byte, space> temp(temp_bytes);
  const auto with_cub = [&] {
    std::size_t bytes = temp_bytes;
    TRIDENT_CUDA_CHECK(cub::DeviceReduce::TransformReduce(temp.data(), bytes, g.data(), cub_out.data(), n,
                                                          cuda::std::plus<double>{}, scaled_square<Grad>{multiplier}, 0.0));
  };

  // Alternating rounds, so that neither side always runs first; medians.
  std::vector<float> ours_times, cub_times;
  for (int round = 0; round < 5; ++round) {
    if (round % 2 == 0) {
      ours_times.push_back(time_ms(ours, 50));
      cub_times.push_back(time_ms(with_cub, 50));
    } else {
      cub_times.push_back(time_ms(with_cub, 50));
      ours_times.push_back(time_ms(ours, 50));
    }
  }
  std::sort(ours_times.begin(), ours_times.end());
  std::sort(cub_times.begin(), cub_times.end());
  const float ours_ms = ours_times[2], cub_ms = cub_times[2];
  ours();
  const double ours_sum = read_back(scratch);
  ours();
  const bool ours_repeat = read_back(scratch) == ours_sum;
  with_cub();
  const double cub_sum = read_back(cub_out);
  with_cub();
  const bool cub_repeat = read_back(cub_out) == cub_sum;
  const double host_sum = trident::optim::gradient_stats(std::span<const Grad>(host), multiplier).sum_squares;
  const double host_diff = std::fabs(ours_sum - host_sum) / host_sum;

  const double bytes = static_cast<double>(n * sizeof(Grad));
  std::printf("%-5s trident gradient_stats: %.4f ms  %6.0f GB/s read = %5.1f%% of copy  sum %.17g  rel. diff to host %.2e  %s\n",
              label, ours_ms, bytes / (ours_ms * 1e-3) / 1e9, 100 * bytes / (ours_ms * 1e-3) / 1e9 / copy_gbs, ours_sum,
              host_diff, ours_repeat ? "repeatable" : "NOT REPEATABLE");
  std::printf("%-5s raw cub TransformReduce: %.4f ms  %6.0f GB/s read = %5.1f%% of copy  sum %.17g  %s trident  %s\n", label,
              cub_ms, bytes / (cub_ms * 1e-3) / 1e9, 100 * bytes / (cub_ms * 1e-3) / 1e9 / copy_gbs, cub_sum,
              cub_sum == ours_sum ? "==" : "!=", cub_repeat ? "repeatable" : "NOT REPEATABLE");
  std::printf("%-5s trident / cub time: %.3f\n", label, ours_ms / cub_ms);
  return cub_sum == ours_sum && ours_repeat && cub_repeat && host_diff <= 1e-12;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (trident::cuda_device_count() == 0) {
      std::puts("bench_grad_stats_cuda: no CUDA device");
      return 77;
    }
    const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{64} << 20;
    cudaDeviceProp prop{};
    TRIDENT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    // The ceiling: a device-to-device copy; its GB/s counts bytes read (the reductions only read).
    trident::buffer<float, trident::cuda_space> src(n), dst(n);
    trident::fill_zero(src);
    const float copy_ms = time_ms([&] {
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDeviceToDevice));
    }, 20);
    const double copy_gbs = static_cast<double>(src.size_bytes()) / (copy_ms * 1e-3) / 1e9;
    std::printf("device %s, %zu gradients; device copy: %.0f GB/s read (+ as much written)\n", prop.name, n, copy_gbs);
    bool ok = run<float>("fp32", n, copy_gbs);
    ok = run<trident::bf16>("bf16", n, copy_gbs) && ok;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_grad_stats_cuda: %s\n", e.what());
    return 1;
  }
}
