# Pipeline parallelism (parallel/pipeline/): schedules as data, their validator and the simulator;
# the executor (pipeline.hpp) against gradient accumulation on one rank, on thread ranks and MPI.
find_package(Threads REQUIRED)
trident_add_test(pipeline.schedule SOURCES pipeline/test_schedule.cpp pipeline/test_simulator.cpp pipeline/test_partition.cpp LABELS pipeline)
trident_add_test(pipeline.local SOURCES pipeline/test_pipeline_local.cpp LIBRARIES Threads::Threads LABELS pipeline local)
# It measures bubbles with sleeping stages: alone, so that other tests do not delay its threads.
set_tests_properties(pipeline.local PROPERTIES RUN_SERIAL TRUE)
if(TARGET trident::mpi)
  trident_add_test(pipeline.mpi SOURCES pipeline/test_pipeline_mpi.cpp LIBRARIES trident::mpi Threads::Threads MPI_RANKS 4
                   LABELS pipeline mpi)
endif()
# 3-D: pipeline stages of tensor-parallel transformer blocks with ZeRO on the data axis.
trident_add_test(pipeline.grid SOURCES pipeline/test_pipeline_grid.cpp LIBRARIES Threads::Threads LABELS pipeline local)
if(CMAKE_CUDA_COMPILER AND TARGET trident::nccl AND TARGET trident::mpi AND TARGET trident::cuda)
  # The executor with device messages on 2 NCCL ranks sharing GPU 0; skips (77) without a device.
  trident_add_test(pipeline.nccl SOURCES pipeline/test_pipeline_nccl.cu LIBRARIES trident::nccl trident::cuda trident::mpi
                   Threads::Threads MPI_RANKS 2 LABELS pipeline nccl gpu mpi TIMEOUT 600)
  set_property(TEST pipeline.nccl APPEND PROPERTY ENVIRONMENT NCCL_SOCKET_IFNAME=lo)
endif()
# Stage boundaries that do not chain, and types that are not stages, are compile-time errors.
foreach(entry IN ITEMS "control|" "mismatched_boundary|K = 1; OutputOfK = std::vector<double>; InputOfNext = std::vector<float>.*the output_type of stage K must be the input_type of stage K . 1"
                       "not_a_stage|constraints not satisfied")
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 case)
  list(GET parts 1 expect)
  add_test(NAME pipeline.compile_fail.${case}
           COMMAND ${CMAKE_COMMAND} "-DCXX=${CMAKE_CXX_COMPILER}" "-DSOURCE=${CMAKE_CURRENT_SOURCE_DIR}/pipeline/compile_fail.cpp"
                   "-DINCLUDE=${PROJECT_SOURCE_DIR}/include" "-DCASE=${case}" "-DEXPECT=${expect}"
                   -P "${CMAKE_CURRENT_SOURCE_DIR}/comm/expect_compile_error.cmake")
  set_tests_properties(pipeline.compile_fail.${case} PROPERTIES LABELS "pipeline")
endforeach()
