# Tensor parallelism (parallel/tensor/): the conjugate operators and the column- and row-parallel
# layers against the unsharded ones, one suite (tensor_suite.hpp) on thread ranks and over MPI.
find_package(Threads REQUIRED)
trident_add_test(tensor.local SOURCES tensor/test_tensor_local.cpp LIBRARIES Threads::Threads LABELS tensor local)
if(TARGET trident::mpi)
  trident_add_test(tensor.mpi SOURCES tensor/test_tensor_mpi.cpp LIBRARIES trident::mpi Threads::Threads MPI_RANKS 4
                   LABELS tensor mpi)
endif()
