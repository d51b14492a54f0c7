// The fused AdamW step on the GPU over one flat 64M-parameter fp32 shard, against the device's
// copy bandwidth measured in the same run. AdamW reads params, grads, exp_avg, exp_avg_sq and
// writes params, exp_avg, exp_avg_sq: 28 bytes per parameter.
//   ./bench_adamw_cuda [parameters]      then: python3 bench/adamw_torch.py [parameters]
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"
#include "cuda_timing.hpp"
#include "trident/optim/cuda/step.cuh"

using bench::time_ms;

int main(int argc, char** argv) {
  try {
    if (trident::cuda_device_count() == 0) {
      std::puts("bench_adamw_cuda: no CUDA device");
      return 77;
    }
    const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{64} << 20;
    using space = trident::cuda_space;
    trident::buffer<float, space> p(n), g(n), m(n), v(n), copy_src(7 * n), copy_dst(7 * n);
    std::vector<float> host(n);
    for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000) * 1e-3f - 0.5f;
    trident::copy(std::span<const float>(host), p);
    trident::copy(std::span<const float>(host), g);
    trident::fill_zero(m);
    trident::fill_zero(v);
    trident::fill_zero(copy_src);
    cudaDeviceProp prop{};
    TRIDENT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

    // The ceiling: a device-to-device copy moving the same 28 bytes per parameter (14 read, 14 written).
    const float copy_ms = time_ms([&] {
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(copy_dst.data(), copy_src.data(), copy_src.size_bytes() / 2, cudaMemcpyDeviceToDevice));
    }, 20);
    const double copy_gbs = 28.0 * static_cast<double>(n) / (copy_ms * 1e-3) / 1e9;

    trident::optim::adamw opt;
    opt.opt.lr = 1e-3f;
    std::int64_t t = 0;
    const float step_ms = time_ms([&] {
      trident::cuda::step(opt, p.device_handle(), trident::device_span<const float>(g.data(), n), {m.device_handle(), v.device_handle()},
                          ++t);
    }, 50);
    const double step_gbs = 28.0 * static_cast<double>(n) / (step_ms * 1e-3) / 1e9;
    std::printf("device %s, %zu parameters (fp32 grads)\n", prop.name, n);
    std::printf("device copy of 28 B/param:  %.3f ms  %.0f GB/s\n", copy_ms, copy_gbs);
    std::printf("trident fused AdamW step:   %.3f ms  %.0f GB/s  = %.1f%% of copy bandwidth\n", step_ms, step_gbs,
                100.0 * step_gbs / copy_gbs);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_adamw_cuda: %s\n", e.what());
    return 1;
  }
}
