// The largest model whose parameters, gradients and optimizer state fit one 80 GB GPU, per ZeRO
// stage, with the state in the GPU's memory or offloaded (host memory or NVMe files), from
// offload::device_bytes_per_parameter: the formulas tests/offload checks against the ledger.
// Prints the Markdown table of docs/OFFLOAD.md; the test offload.capacity_table compares them.
// Activations, buffers and fragmentation are not counted: these are upper bounds.
#include <cstdio>
#include <string>

#include "trident/offload/store.hpp"

std::string billions(double parameters) {
  char text[32];
  const double b = parameters / 1e9;
  std::snprintf(text, sizeof text, b >= 100 ? "%.0f B" : "%.3g B", b);
  return text;
}

int main() {
  using trident::offload::tier;
  constexpr double gpu = 80e9;
  std::printf("| stage | GPUs | state on the GPU: bytes/param | largest model | offloaded: bytes/param on the GPU | largest model "
              "| host RAM per GPU for that model (host tier) |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int stage = 0; stage <= 3; ++stage)
    for (int n : {1, 8, 64}) {
      const double in_memory = trident::offload::device_bytes_per_parameter(stage, tier::memory, n);
      const double off = trident::offload::device_bytes_per_parameter(stage, tier::host, n);
      std::printf("| %d | %d | %.3g | %s |", stage, n, in_memory, billions(gpu / in_memory).c_str());
      if (off < 0) {
        std::printf(" - | - | - |\n");
      } else {
        const double psi = gpu / off;
        std::printf(" %.3g | %s | %.0f GB |\n", off, billions(psi).c_str(), 12.0 * psi / n / 1e9);
      }
    }
  return 0;
}
