# Gradient compression (compress/): the reducers through zero_optimizer on a network that counts
# bytes (comm/slow_link.hpp), on thread ranks.
trident_add_test(compress.local SOURCES compress/test_compress.cpp LIBRARIES Threads::Threads LABELS compress local TIMEOUT 600)
target_include_directories(test_compress_local PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
# PowerSGD against PyTorch's own DDP hook (tests/fixtures/torch_powersgd.txt).
trident_add_test(compress.torch_powersgd SOURCES compress/test_powersgd_torch.cpp LIBRARIES Threads::Threads LABELS compress local)
target_compile_definitions(test_compress_torch_powersgd PRIVATE TRIDENT_FIXTURES="${PROJECT_SOURCE_DIR}/tests/fixtures")
if(TARGET trident::mpi AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  trident_add_test(compress.mpi SOURCES compress/test_compress_mpi.cpp LIBRARIES trident::mpi Threads::Threads MPI_RANKS 4
                   LABELS compress mpi TIMEOUT 600)
  target_include_directories(test_compress_mpi PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
endif()
if(CMAKE_CUDA_COMPILER AND TARGET trident::nccl AND TARGET trident::mpi)
  # The cast reducer on device buffers, alone and through zero_optimizer, on 2 NCCL ranks sharing
  # GPU 0; skips (77) without a device.
  trident_add_test(compress.nccl SOURCES compress/test_compress_nccl.cu LIBRARIES trident::nccl trident::mpi Threads::Threads
                   MPI_RANKS 2 LABELS compress nccl gpu mpi TIMEOUT 600)
  target_include_directories(test_compress_nccl PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
  set_property(TEST compress.nccl APPEND PROPERTY ENVIRONMENT NCCL_SOCKET_IFNAME=lo)
endif()
