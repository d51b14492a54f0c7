// A device optimizer's offload (issue 14's GPU line), one NCCL rank: ZeRO-1 bf16 AdamW over
// `params` parameters (64M by default) with its fp32 state in pinned host memory
// (offload::host()), against, in the same run:
//   - the same optimizer with its state on the device (the fused CUDA step);
//   - the host update alone (the host step over the same arrays, pinned memory);
//   - the PCIe transfers alone (bf16 gradients down, bf16 parameters up, pinned, on one stream);
// and prints offloaded step / max(host update, PCIe transfer): the goal is <= 1.2.
//
//   offload_pcie [params = 64M] [steps = 5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "trident/comm/nccl.hpp"
#include "trident/offload/store.hpp"
#include "trident/parallel/data/cuda/zero_engine.cuh"

namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

constexpr int layers = 8;
using zero_type =
    trident::zero::zero_optimizer<1, trident::optim::adamw, trident::nccl_comm, trident::mixed_precision<trident::bf16>>;

double time_steps(trident::nccl_comm& comm, zero_type& z, int steps) {
  std::vector<double> times;
  for (int s = 0; s <= steps; ++s) {
    for (int l = 0; l < layers; ++l) {
      auto g = z.gradients(z.handle("layer" + std::to_string(l) + ".weight"));
      TRIDENT_CUDA_CHECK(cudaMemsetAsync(g.data(), 0x3c, g.size() * sizeof(trident::bf16), comm.stream()));
      z.grad_ready(l);
    }
    comm.synchronize();
    const auto t = clock_type::now();
    z.step();
    comm.synchronize();
    if (s > 0) times.push_back(seconds_since(t));
  }
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t params = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{64} << 20;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 5;
  if (trident::cuda_device_count() == 0) {
    std::puts("offload_pcie: no CUDA device");
    return 77;
  }
  ncclUniqueId id;
  TRIDENT_NCCL_CHECK(ncclGetUniqueId(&id));
  auto comm = trident::nccl_comm::init(id, 0, 1);
  trident::model_spec spec;
  for (int l = 0; l < layers; ++l) spec.add("layer" + std::to_string(l) + ".weight", {params / layers}, l);
  trident::optim::adamw adamw;
  adamw.opt.lr = 1e-3f;

  double on_device = 0, offloaded = 0;
  {
    zero_type z(comm, spec, adamw);
    on_device = time_steps(comm, z, steps);
  }
  {
    trident::zero::zero_options o;
    o.offload = trident::offload::host();
    zero_type z(comm, spec, adamw, o);
    offloaded = time_steps(comm, z, steps);
  }
  // The host update alone, over pinned arrays as the offload uses them.
  const std::size_t n = params;
  trident::buffer<float, trident::pinned_host_space> p(n), m(n), v(n);
  trident::buffer<trident::bf16, trident::pinned_host_space> g(n), w(n);
  std::fill(p.data(), p.data() + n, 0.5f);
  std::fill(m.data(), m.data() + n, 0.0f);
  std::fill(v.data(), v.data() + n, 0.0f);
  std::fill(g.data(), g.data() + n, trident::bf16(0.01f));
  std::vector<double> host;
  for (int s = 0; s <= steps; ++s) {
    const auto t = clock_type::now();
    adamw.step(std::span<float>(p.data(), n), std::span<const trident::bf16>(g.data(), n),
               {std::span<float>(m.data(), n), std::span<float>(v.data(), n)}, s + 1, 1.0f, std::span<trident::bf16>(w.data(), n));
    if (s > 0) host.push_back(seconds_since(t));
  }
  // PCIe alone: the gradients down and the parameters up, as the offloaded step moves them.
  trident::buffer<trident::bf16, trident::cuda_space> dg(n), dw(n);
  std::vector<double> pcie;
  for (int s = 0; s <= steps; ++s) {
    const auto t = clock_type::now();
    TRIDENT_CUDA_CHECK(cudaMemcpyAsync(g.data(), dg.data(), n * sizeof(trident::bf16), cudaMemcpyDeviceToHost, comm.stream()));
    TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dw.data(), w.data(), n * sizeof(trident::bf16), cudaMemcpyHostToDevice, comm.stream()));
    comm.synchronize();
    if (s > 0) pcie.push_back(seconds_since(t));
  }
  const double update = median(host), transfer = median(pcie);
  std::printf("offload_pcie: %zu parameters, ZeRO-1 bf16 AdamW, one NCCL rank, state in pinned host memory\n", params);
  std::printf("  step, state on the device       %8.2f ms\n", on_device * 1e3);
  std::printf("  host update alone               %8.2f ms\n", update * 1e3);
  std::printf("  PCIe alone (2 B/param each way) %8.2f ms   %.1f GB/s\n", transfer * 1e3, 4.0 * n / transfer / 1e9);
  std::printf("  offloaded step                  %8.2f ms   = %.2f x max(host update, PCIe)\n", offloaded * 1e3,
              offloaded / std::max(update, transfer));
  return 0;
}
