# Local SGD and DiLoCo (parallel/local_sgd/) on thread ranks, over the simulated network.
trident_add_test(local_sgd.diloco SOURCES local_sgd/test_diloco.cpp LIBRARIES Threads::Threads LABELS local_sgd local TIMEOUT 600)
target_include_directories(test_local_sgd_diloco PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
if(CMAKE_CUDA_COMPILER AND TARGET trident::nccl AND TARGET trident::mpi)
  # DiLoCo's outer steps on device buffers, against thread ranks, on 2 NCCL ranks sharing GPU 0;
  # skips (77) without a device.
  trident_add_test(local_sgd.diloco_nccl SOURCES local_sgd/test_diloco_nccl.cu LIBRARIES trident::nccl trident::mpi Threads::Threads
                   MPI_RANKS 2 LABELS local_sgd nccl gpu mpi TIMEOUT 600)
  set_property(TEST local_sgd.diloco_nccl APPEND PROPERTY ENVIRONMENT NCCL_SOCKET_IFNAME=lo)
endif()
