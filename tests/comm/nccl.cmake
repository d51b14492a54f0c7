# The NCCL communicator.
#   comm.nccl_host       the reduction mapping, type properties, the id's file bootstrap: no GPU
#   comm.nccl_bootstrap  the shared-file bootstrap between real processes started with torchrun's
#                        or Slurm's variables (no mpirun): one id everywhere; with a GPU also one
#                        communicator and an all-reduce
#   comm.nccl            one rank on one GPU: every collective x type x op against a host reference
#   comm.nccl_multirank  two ranks (processes) on GPU 0 under mpirun, told apart by NCCL_HOSTID
#                        (nccl_options::host_id_per_rank) and talking over NCCL's socket transport
# The GPU tests exit 77 (skipped) when no CUDA device is visible, on every rank.
if(TARGET trident::nccl)
  find_package(Threads REQUIRED)
  trident_add_test(comm.nccl_host SOURCES comm/test_nccl_host.cpp LIBRARIES trident::nccl LABELS comm nccl)
  add_executable(nccl_bootstrap_worker comm/nccl_bootstrap_worker.cpp)
  target_link_libraries(nccl_bootstrap_worker PRIVATE trident::nccl)
  trident_strict_warnings(nccl_bootstrap_worker)
  trident_add_test(comm.nccl_bootstrap SOURCES comm/test_nccl_bootstrap.cpp LIBRARIES trident::cuda
                   LABELS comm nccl TIMEOUT 600)
  target_compile_definitions(test_comm_nccl_bootstrap PRIVATE
                             TRIDENT_BOOTSTRAP_WORKER="$<TARGET_FILE:nccl_bootstrap_worker>")
  add_dependencies(test_comm_nccl_bootstrap nccl_bootstrap_worker)
  trident_add_test(comm.nccl SOURCES comm/test_nccl.cpp LIBRARIES trident::nccl GPU LABELS comm nccl gpu
                   TIMEOUT 600)
  if(TARGET trident::mpi)
    # Its own main (MPI_Init, the skip on every rank), so not GPU (which links the GPU main).
    trident_add_test(comm.nccl_multirank SOURCES comm/test_nccl_multirank.cpp
                     LIBRARIES trident::nccl trident::mpi MPI_RANKS 2 LABELS comm nccl gpu mpi TIMEOUT 600)
    # The only interface of a machine without network; NCCL avoids lo unless told.
    set_property(TEST comm.nccl_multirank APPEND PROPERTY ENVIRONMENT NCCL_SOCKET_IFNAME=lo)
  endif()
endif()
