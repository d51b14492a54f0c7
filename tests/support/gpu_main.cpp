// The doctest main for tests that need a CUDA device: with no device (or no driver) the test
// reports itself skipped (exit 77, ctest's SKIP_RETURN_CODE) instead of failing or passing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "trident/core/cuda_runtime.hpp"

int main(int argc, char** argv) {
  if (trident::cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device is visible to this process (no GPU or no driver)\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
