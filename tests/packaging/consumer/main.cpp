// Prints what this build of trident can do; the packaging tests compare it with what the
// target it linked promises (trident::trident: nothing optional; trident::mpi: MPI; ...).
#include <trident/trident.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  (void)argc;
  (void)argv;
  trident::buffer<trident::bf16> weights(16, trident::mem_category::parameters);
  trident::fill_zero(weights);
  std::printf("trident %s cuda=%d nccl=%d mpi=%d\n", trident::version_string, int{trident::has_cuda},
              int{trident::has_nccl}, int{trident::has_mpi});
#if TRIDENT_HAS_CUDA
  std::printf("cuda devices: %d\n", trident::cuda_device_count());
#endif
#if TRIDENT_HAS_NCCL
  int version = 0;
  TRIDENT_NCCL_CHECK(ncclGetVersion(&version));
  std::printf("nccl version: %d\n", version);
#endif
#if TRIDENT_HAS_MPI
  TRIDENT_MPI_CHECK(MPI_Init(&argc, &argv));
  int size = 0;
  TRIDENT_MPI_CHECK(MPI_Type_size(trident::to_mpi(trident::dtype::bfloat16), &size));
  std::printf("mpi bf16 size: %d\n", size);
  TRIDENT_MPI_CHECK(MPI_Finalize());
#endif
  return static_cast<float>(weights[15]) == 0.0f ? 0 : 1;
}
