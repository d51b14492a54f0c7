# The MPI communicator: its own tests (element types, in place, async, split, errors) under
# mpirun with 4 ranks, so that 7 elements never divide evenly and splits have several groups.
if(TARGET trident::mpi)
  trident_add_test(comm.mpi SOURCES comm/test_mpi.cpp LIBRARIES trident::mpi MPI_RANKS 4 LABELS comm mpi)
endif()
