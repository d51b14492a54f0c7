# Offload of the optimizer state (issue 14): host and NVMe tiers against in-memory training, the
# ledger per tier, bad input; on thread ranks and over MPI. The NVMe tier uses io_uring through
# liburing where it is installed (Debian's liburing-dev), else its pread/pwrite thread.
find_package(Threads REQUIRED)
find_library(TRIDENT_LIBURING uring)
find_path(TRIDENT_LIBURING_INCLUDE liburing.h)
set(trident_offload_io Threads::Threads)
set(trident_offload_defs "")
if(TRIDENT_LIBURING AND TRIDENT_LIBURING_INCLUDE)
  list(APPEND trident_offload_io ${TRIDENT_LIBURING})
  set(trident_offload_defs TRIDENT_HAS_LIBURING=1)
else()
  message(STATUS "trident: liburing not found; the offload tests use the NVMe tier's pread/pwrite thread")
endif()
trident_add_test(offload.local SOURCES offload/test_offload.cpp LIBRARIES ${trident_offload_io} LABELS offload local TIMEOUT 600)
target_include_directories(test_offload_local PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
target_compile_definitions(test_offload_local PRIVATE ${trident_offload_defs})
if(TARGET trident::mpi AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  trident_add_test(offload.mpi SOURCES offload/test_offload_mpi.cpp LIBRARIES trident::mpi ${trident_offload_io} MPI_RANKS 4
                   LABELS offload mpi TIMEOUT 600)
  target_include_directories(test_offload_mpi PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
  target_compile_definitions(test_offload_mpi PRIVATE ${trident_offload_defs})
endif()
# docs/OFFLOAD.md's capacity table is what bench/offload_capacity.cpp prints from the formulas
# that offload.local checks against the ledger.
add_executable(test_offload_capacity_table "${PROJECT_SOURCE_DIR}/bench/offload_capacity.cpp")
target_link_libraries(test_offload_capacity_table PRIVATE trident::trident)
trident_strict_warnings(test_offload_capacity_table)
add_test(NAME offload.capacity_table
         COMMAND "${CMAKE_COMMAND}" -DTOOL=$<TARGET_FILE:test_offload_capacity_table> -DDOC=${PROJECT_SOURCE_DIR}/docs/OFFLOAD.md
                 -P "${CMAKE_CURRENT_LIST_DIR}/capacity_table.cmake")
set_tests_properties(offload.capacity_table PROPERTIES LABELS "offload")
# A device optimizer's offload (gradients down, half parameters up through pinned memory) on 2
# NCCL ranks sharing GPU 0; skips (77) without a device, like zero.nccl.
if(CMAKE_CUDA_COMPILER AND TARGET trident::nccl AND TARGET trident::mpi)
  trident_add_test(offload.nccl SOURCES offload/test_offload_nccl.cu
                   LIBRARIES trident::nccl trident::mpi ${trident_offload_io} MPI_RANKS 2 LABELS offload nccl gpu mpi TIMEOUT 600)
  target_include_directories(test_offload_nccl PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
  target_compile_definitions(test_offload_nccl PRIVATE ${trident_offload_defs})
  set_property(TEST offload.nccl APPEND PROPERTY ENVIRONMENT NCCL_SOCKET_IFNAME=lo)
endif()
