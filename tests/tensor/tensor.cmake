# Tensor parallelism (parallel/tensor/): the conjugate operators and the column- and row-parallel
# layers against the unsharded ones, one suite (tensor_suite.hpp) on thread ranks and over MPI.
find_package(Threads REQUIRED)
trident_add_test(tensor.local SOURCES tensor/test_tensor_local.cpp LIBRARIES Threads::Threads LABELS tensor local)
if(TARGET trident::mpi)
  trident_add_test(tensor.mpi SOURCES tensor/test_tensor_mpi.cpp LIBRARIES trident::mpi Threads::Threads MPI_RANKS 4
                   LABELS tensor mpi)
endif()
if(CMAKE_CUDA_COMPILER AND TARGET trident::nccl AND TARGET trident::mpi AND TARGET trident::cuda)
  # The CUDA layers (parallel/tensor/cuda/linear.cuh) on 2 NCCL ranks sharing GPU 0; skips (77) without a device.
  trident_add_test(tensor.nccl SOURCES tensor/test_tensor_nccl.cu LIBRARIES trident::nccl trident::cuda trident::mpi
                   Threads::Threads MPI_RANKS 2 LABELS tensor nccl gpu mpi TIMEOUT 600)
  set_property(TEST tensor.nccl APPEND PROPERTY ENVIRONMENT NCCL_SOCKET_IFNAME=lo)
endif()
