# The MPI communicator: its own tests (element types, in place, async, split, errors) under
# mpirun with 4 ranks, so that 7 elements never divide evenly and splits have several groups.
if(TARGET trident::mpi)
  trident_add_test(comm.mpi SOURCES comm/test_mpi.cpp LIBRARIES trident::mpi MPI_RANKS 4 LABELS comm mpi)
endif()

# Misuse that used to hang an MPI job for good (a rank leaving after an error, mismatched
# collectives) must end it quickly with a message; see tests/comm/mpi_misuse.sh.
if(TARGET trident::mpi)
  add_executable(mpi_misuse_worker comm/mpi_misuse_worker.cpp)
  target_link_libraries(mpi_misuse_worker PRIVATE trident::mpi)
  trident_strict_warnings(mpi_misuse_worker)
  add_test(NAME comm.mpi_misuse COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/comm/mpi_misuse.sh" ${MPIEXEC_EXECUTABLE}
                                        $<TARGET_FILE:mpi_misuse_worker>)
  set_tests_properties(comm.mpi_misuse PROPERTIES TIMEOUT 400 LABELS "comm;mpi" PROCESSORS 2
                       ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
endif()

# The same over MPI ranks.
if(TARGET trident::mpi AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  trident_add_test(comm.slow_link_mpi SOURCES comm/test_slow_link_mpi.cpp LIBRARIES trident::mpi MPI_RANKS 4 LABELS comm mpi)
endif()
