# The parameter server (parallel/ps/): on thread ranks, and over MPI.
trident_add_test(ps.local SOURCES ps/test_parameter_server.cpp LIBRARIES Threads::Threads LABELS ps local TIMEOUT 600)
target_include_directories(test_ps_local PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
if(TARGET trident::mpi AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  trident_add_test(ps.mpi SOURCES ps/test_parameter_server_mpi.cpp LIBRARIES trident::mpi Threads::Threads MPI_RANKS 4
                   LABELS ps mpi TIMEOUT 600)
  target_include_directories(test_ps_mpi PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
endif()
