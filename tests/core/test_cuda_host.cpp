// Host code compiled with trident::cuda (TRIDENT_HAS_CUDA=1) by the host compiler. On a machine
// without a GPU (CI) it checks that using the device is a clear error; with one, that it works.
#include <doctest/doctest.h>

#include <string>

#include "trident/core/buffer.hpp"
#include "trident/core/cuda_runtime.hpp"

using trident::mem_category;
using trident::space_kind;

TEST_CASE("the CUDA spaces are available in a trident::cuda build") {
  static_assert(trident::has_cuda);
  static_assert(trident::cuda_space::available && trident::pinned_host_space::available);
  CHECK(trident::cuda_device_count() >= 0);
}

TEST_CASE("device memory: allocated and accounted with a GPU, a cuda_error naming cudaMalloc without one") {
  auto ledger = std::make_shared<trident::memory_ledger>("cuda host test");
  if (trident::cuda_device_count() == 0) {
    try {
      trident::buffer<float, trident::cuda_space> x(1024, mem_category::parameters, ledger);
      FAIL("cudaMalloc succeeded without a device");
    } catch (const trident::cuda_error& e) {
      CHECK(e.status() != 0);
      CHECK(e.operation().find("cudaMalloc") != std::string::npos);
    }
    CHECK(ledger->bytes(space_kind::cuda) == 0);  // nothing charged for a failed allocation
    CHECK_THROWS_AS(TRIDENT_CUDA_CHECK(cudaSetDevice(0)), trident::cuda_error);
  } else {
    trident::buffer<float, trident::cuda_space> x(1024, mem_category::parameters, ledger);
    CHECK(ledger->bytes(space_kind::cuda, mem_category::parameters) == 4096);
    CHECK_THROWS_AS(TRIDENT_CUDA_CHECK(cudaSetDevice(trident::cuda_device_count() + 7)), trident::cuda_error);
  }
}
