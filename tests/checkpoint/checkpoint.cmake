# Checkpoints (checkpoint/).
#   checkpoint.safetensors     the safetensors layer: round trips, the reference's bytes, ranges,
#                              every hostile header class, truncations, a seeded mutation fuzz
#                              (TRIDENT_FUZZ_INPUTS / TRIDENT_FUZZ_SEED for longer runs)
#   checkpoint.safetensors_py  our files read by Python's safetensors and theirs by us, value by
#                              value; a sharded checkpoint of a (t = 2, d = 2) grid assembled in
#                              Python against its consolidated export, and weights written by
#                              Python imported; needs PyPI once for a venv under the build tree
#                              (fails, never skips, without it: leave it out with -LE python)
trident_add_test(checkpoint.safetensors SOURCES checkpoint/test_safetensors.cpp LABELS checkpoint)

add_executable(checkpoint_safetensors_tool checkpoint/safetensors_tool.cpp)
target_link_libraries(checkpoint_safetensors_tool PRIVATE trident::trident)
trident_strict_warnings(checkpoint_safetensors_tool)
find_package(Threads REQUIRED)
add_executable(checkpoint_export_tool checkpoint/export_tool.cpp)
target_link_libraries(checkpoint_export_tool PRIVATE trident::trident Threads::Threads)
trident_strict_warnings(checkpoint_export_tool)
add_test(NAME checkpoint.safetensors_py
         COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/safetensors_py.sh"
                 "${CMAKE_BINARY_DIR}/tools/safetensors-venv" $<TARGET_FILE:checkpoint_safetensors_tool>
                 "${CMAKE_CURRENT_BINARY_DIR}/checkpoint_safetensors_py"
                 "${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/safetensors_check.py"
                 $<TARGET_FILE:checkpoint_export_tool> "${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/export_check.py")
set_tests_properties(checkpoint.safetensors_py PROPERTIES LABELS "checkpoint;python" TIMEOUT 300)

# Sharded checkpoints of zero_optimizer (checkpoint/zero.hpp).
#   checkpoint.zero            bit-exact resume (ZeRO 0-3 x fp32/bf16/fp16, thread ranks),
#                              resharding d = 4 ZeRO-3 -> d = 2 ZeRO-1, d = 1, d = 3 ZeRO-2,
#                              broken checkpoints named and skipped, asynchronous save
#   checkpoint.zero_mpi        bit-exact resume under mpirun -np 2
#   checkpoint.crash_safety    kill -9 at random moments of saves, restart, check (a few
#                              trials; bench/checkpoint_crash.sh runs 100)
#   checkpoint.elastic_mpi     a rank SIGKILLed under mpirun -np 3, the restart on 2 ranks
#                              continues the loss curve
#   checkpoint.zero_nccl       the bit-exact resume with the optimizer on a GPU (skips without)
find_package(Threads REQUIRED)
trident_add_test(checkpoint.zero SOURCES checkpoint/test_zero_checkpoint.cpp LIBRARIES Threads::Threads LABELS checkpoint local)
if(CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  target_compile_definitions(test_checkpoint_zero PRIVATE TRIDENT_CHECKPOINT_FEW_INSTANCES=1)  # see resume_suite.hpp
endif()
# Not in the sanitizer build: the thread test runs the same code there, and CI's time is short.
if(TARGET trident::mpi AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  trident_add_test(checkpoint.zero_mpi SOURCES checkpoint/test_zero_checkpoint_mpi.cpp LIBRARIES trident::mpi Threads::Threads
                   MPI_RANKS 2 LABELS checkpoint mpi)
endif()
add_executable(checkpoint_crash_tool checkpoint/crash_tool.cpp)
target_link_libraries(checkpoint_crash_tool PRIVATE trident::trident Threads::Threads)
trident_strict_warnings(checkpoint_crash_tool)
add_test(NAME checkpoint.crash_safety
         COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/crash_safety.sh" $<TARGET_FILE:checkpoint_crash_tool> 8)
set_tests_properties(checkpoint.crash_safety PROPERTIES LABELS "checkpoint" TIMEOUT 300)

# A rank SIGKILLed under mpirun -np 3: the job ends, a restart on 2 ranks resumes from the newest
# checkpoint (resharded) and the loss curve equals an uninterrupted run's (tests/checkpoint/elastic.sh).
if(TARGET trident::mpi AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  add_executable(checkpoint_elastic_tool checkpoint/elastic_tool.cpp)
  target_link_libraries(checkpoint_elastic_tool PRIVATE trident::mpi)
  trident_strict_warnings(checkpoint_elastic_tool)
  add_test(NAME checkpoint.elastic_mpi
           COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/elastic.sh" ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:checkpoint_elastic_tool>)
  set_tests_properties(checkpoint.elastic_mpi PROPERTIES LABELS "checkpoint;mpi" TIMEOUT 300 PROCESSORS 3)
endif()

# The same resume with the optimizer on a GPU over NCCL (mpirun -np 2 sharing GPU 0); skips (77)
# without a device. scripts/gpu_check.sh runs it with the other nccl-labelled tests.
if(CMAKE_CUDA_COMPILER AND TARGET trident::nccl AND TARGET trident::mpi)
  trident_add_test(checkpoint.zero_nccl SOURCES checkpoint/test_zero_checkpoint_nccl.cu
                   LIBRARIES trident::nccl trident::mpi Threads::Threads MPI_RANKS 2 LABELS checkpoint nccl gpu mpi TIMEOUT 600)
  set_property(TEST checkpoint.zero_nccl APPEND PROPERTY ENVIRONMENT NCCL_SOCKET_IFNAME=lo)
endif()
