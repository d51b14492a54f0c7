// buffer<T, cuda_space> and buffer<T, pinned_host_space> on a real device (skipped without one).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/half.hpp"
#include "trident/core/cuda/convert.cuh"

using trident::mem_category;
using trident::space_kind;

namespace {

__global__ void axpb(trident::device_span<float> x, float a, float b) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < x.size(); i += gridDim.x * blockDim.x)
    x[i] = a * x[i] + b;
}

}  // namespace

TEST_CASE("device buffers are aligned, accounted, and round-trip through host and pinned memory") {
  auto ledger = std::make_shared<trident::memory_ledger>("gpu");
  constexpr std::size_t n = (1 << 20) + 3;
  {
    trident::buffer<float> host(n, mem_category::parameters, ledger);
    std::iota(host.span().begin(), host.span().end(), 0.0f);
    trident::buffer<float, trident::cuda_space> device(n, mem_category::parameters, ledger);
    trident::buffer<float, trident::pinned_host_space> pinned(n, mem_category::communication, ledger);
    CHECK(reinterpret_cast<std::uintptr_t>(device.data()) % trident::buffer_alignment == 0);
    CHECK(ledger->bytes(space_kind::cuda, mem_category::parameters) == n * sizeof(float));
    CHECK(ledger->bytes(space_kind::pinned_host, mem_category::communication) == n * sizeof(float));

    trident::copy(host, device);
    axpb<<<trident::cuda::grid_for(n, 256), 256>>>(device.device_handle(), 2.0f, 1.0f);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    trident::copy(device, pinned);  // cudaMemcpy is synchronous with respect to the kernel
    for (std::size_t i : {std::size_t{0}, std::size_t{1}, n / 2, n - 1}) CHECK(pinned[i] == 2.0f * static_cast<float>(i) + 1.0f);

    trident::fill_zero(device);
    const std::vector<float> back = trident::to_vector(device);
    CHECK(std::all_of(back.begin(), back.end(), [](float v) { return v == 0.0f; }));

    trident::buffer<float, trident::cuda_space> moved = std::move(device);
    CHECK(moved.size() == n);
    CHECK(ledger->live_allocations(space_kind::cuda, mem_category::parameters) == 1);
  }
  CHECK(ledger->bytes(space_kind::cuda) == 0);
  CHECK(ledger->bytes(space_kind::pinned_host) == 0);
  CHECK(ledger->peak(space_kind::cuda) == n * sizeof(float));
}

TEST_CASE("an impossible device allocation is a cuda_error and charges nothing") {
  auto ledger = std::make_shared<trident::memory_ledger>("gpu");
  CHECK_THROWS_AS((trident::buffer<char, trident::cuda_space>(std::size_t{1} << 60, mem_category::other, ledger)),
                  trident::cuda_error);
  CHECK(ledger->bytes(space_kind::cuda) == 0);
}
