# ZeRO and mixed precision on thread ranks (MPI and NCCL: see the issue notes).
find_package(Threads REQUIRED)
trident_add_test(zero.local SOURCES zero/test_zero.cpp LIBRARIES Threads::Threads LABELS zero local TIMEOUT 600)
if(TARGET trident::mpi)
  trident_add_test(zero.mpi SOURCES zero/test_zero_mpi.cpp LIBRARIES trident::mpi Threads::Threads MPI_RANKS 4 LABELS zero mpi)
endif()
