# comm.srun: the MPI suite started by Slurm's srun on a throwaway one-node Slurm (tests/comm/srun.sh; root
# only, else skipped), plus the NCCL file bootstrap under srun when NCCL is there.
if(TARGET trident::mpi AND CMAKE_HOST_SYSTEM_NAME STREQUAL "Linux")
  set(srun_worker "")
  if(TARGET nccl_bootstrap_worker)
    set(srun_worker "$<TARGET_FILE:nccl_bootstrap_worker>")
  endif()
  add_test(NAME comm.srun COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/comm/srun.sh"
           "${PROJECT_SOURCE_DIR}/scripts/slurm_local.sh" $<TARGET_FILE:test_comm_mpi> ${srun_worker})
  # ASAN_OPTIONS as for the mpirun tests (OpenMPI's plug-ins leak); srun passes it to the tasks.
  # RESOURCE_LOCK: the daemons are machine-wide, so never two of these at once from one ctest.
  set_tests_properties(comm.srun PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "comm;mpi;slurm"
                       RESOURCE_LOCK slurm
                       ENVIRONMENT "NCCL_SOCKET_IFNAME=lo;ASAN_OPTIONS=detect_leaks=0:abort_on_error=1")
endif()
