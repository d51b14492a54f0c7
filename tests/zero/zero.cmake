# ZeRO and mixed precision on thread ranks, over MPI and over NCCL. The MLP they train lives with
# the examples (examples/common/mlp.hpp), so tests and examples train the same model.
find_package(Threads REQUIRED)
trident_add_test(zero.local SOURCES zero/test_zero.cpp LIBRARIES Threads::Threads LABELS zero local TIMEOUT 600)
target_include_directories(test_zero_local PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
if(CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  target_compile_definitions(test_zero_local PRIVATE TRIDENT_ZERO_FEW_INSTANCES=1)  # see test_zero.cpp
endif()
# step_async (the step a CUDA graph can capture) against step(): tests/zero/async_suite.hpp.
# Not in the sanitizer build: zero.local runs the same buffers and engine there, and this file
# took 66 s to compile under ASan + UBSan (CI's time is short).
if(NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  trident_add_test(zero.async SOURCES zero/test_zero_async.cpp LIBRARIES Threads::Threads LABELS zero local TIMEOUT 600)
  target_include_directories(test_zero_async PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
endif()
# The flat layout alone: buckets, layers without tensors, handles.
trident_add_test(zero.flat_layout SOURCES zero/test_flat_layout.cpp LABELS zero)
# Bad input (issue 17): a clear usage_error on every rank, never a crash, hang or silent corruption.
trident_add_test(zero.misuse SOURCES zero/test_zero_misuse.cpp LIBRARIES Threads::Threads LABELS zero local TIMEOUT 600)
target_include_directories(test_zero_misuse PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
# The misuse and random suites again under ThreadSanitizer (see comm/local.cmake): their errors
# cross ranks through aborts, asynchronous requests and destructors that wait.
set(trident_zero_tsan FALSE)
if(TRIDENT_TSAN_TESTS AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  set(trident_zero_tsan TRUE)
  trident_add_tsan_test(zero.misuse_tsan SOURCES zero/test_zero_misuse.cpp LIBRARIES Threads::Threads LABELS zero local tsan
                        TIMEOUT 600)
  target_include_directories(test_zero_misuse_tsan PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
endif()
# Not in the sanitizer build: zero.local runs the same ZeRO code there and comm.mpi the MPI
# backend, and this file is among the costliest to compile under ASan + UBSan (CI's time is short).
if(TARGET trident::mpi AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  trident_add_test(zero.mpi SOURCES zero/test_zero_mpi.cpp LIBRARIES trident::mpi Threads::Threads MPI_RANKS 4 LABELS zero mpi)
  target_include_directories(test_zero_mpi PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
endif()
if(CMAKE_CUDA_COMPILER AND TARGET trident::nccl AND TARGET trident::mpi)
  # Several ranks share GPU 0 (NCCL_HOSTID per rank); its own main skips (77) without a device.
  trident_add_test(zero.nccl SOURCES zero/test_zero_nccl.cu LIBRARIES trident::nccl trident::mpi Threads::Threads
                   MPI_RANKS 2 LABELS zero nccl gpu mpi TIMEOUT 600)
  target_include_directories(test_zero_nccl PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
  set_property(TEST zero.nccl APPEND PROPERTY ENVIRONMENT NCCL_SOCKET_IFNAME=lo)
  # step_async captured into a CUDA graph (stages 0-3) and the async suite, on 2 NCCL ranks.
  trident_add_test(zero.graph_nccl SOURCES zero/test_zero_graph_nccl.cu LIBRARIES trident::nccl trident::mpi Threads::Threads
                   MPI_RANKS 2 LABELS zero nccl gpu mpi TIMEOUT 600)
  target_include_directories(test_zero_graph_nccl PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
  set_property(TEST zero.graph_nccl APPEND PROPERTY ENVIRONMENT NCCL_SOCKET_IFNAME=lo)
  # The misuse suite (misuse_suite.hpp) on 2 NCCL ranks sharing GPU 0, device buffers staged
  # through the host; skips (77) without a device like zero.nccl.
  trident_add_test(zero.misuse_nccl SOURCES zero/test_zero_misuse_nccl.cu LIBRARIES trident::nccl trident::mpi Threads::Threads
                   MPI_RANKS 2 LABELS zero nccl gpu mpi TIMEOUT 600)
  target_include_directories(test_zero_misuse_nccl PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
  set_property(TEST zero.misuse_nccl APPEND PROPERTY ENVIRONMENT NCCL_SOCKET_IFNAME=lo)
endif()
# Random models and call sequences (issue 17): TRIDENT_RANDOM_EPISODES / TRIDENT_RANDOM_SEED for longer runs.
trident_add_test(zero.random SOURCES zero/test_zero_random.cpp LIBRARIES Threads::Threads LABELS zero local TIMEOUT 600)
target_include_directories(test_zero_random PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
if(trident_zero_tsan)
  trident_add_tsan_test(zero.random_tsan SOURCES zero/test_zero_random.cpp LIBRARIES Threads::Threads LABELS zero local tsan
                        TIMEOUT 600)
  target_include_directories(test_zero_random_tsan PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
endif()
