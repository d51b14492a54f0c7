#include <trident/trident.hpp>

#include <cstdio>

int main() {
  trident::buffer<trident::bf16> weights(8, trident::mem_category::parameters);
  trident::fill_zero(weights);
  std::printf("trident %s from Conan: mpi=%d, %zu bytes of parameters\n", trident::version_string,
              static_cast<int>(trident::has_mpi), trident::current_ledger()->bytes(trident::space_kind::host));
  return static_cast<float>(weights[7]) == 0.0f ? 0 : 1;
}
