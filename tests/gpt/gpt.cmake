# The flagship GPT trainer (examples/01_flagship): every grid and ZeRO stage against one rank,
# the trace, bad input, bf16 and fp16. The trainer's instantiations for thread ranks compile once,
# into trident_test_gpt (gpt_instances_*.cpp, one per precision), which the thread-rank tests link.
find_package(Threads REQUIRED)
# The sanitizer build compiles fp32 only (gpt.precision is not built there): each half precision
# takes minutes to compile under ASan + UBSan and runs the same code paths with other roundings.
set(sanitized FALSE)
if(CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  set(sanitized TRUE)
endif()
set(gpt_instances gpt/gpt_instances_fp32.cpp)
if(NOT sanitized)
  list(APPEND gpt_instances gpt/gpt_instances_bf16.cpp gpt/gpt_instances_fp16.cpp)
endif()
add_library(trident_test_gpt STATIC ${gpt_instances})
target_link_libraries(trident_test_gpt PUBLIC trident::trident Threads::Threads)
target_include_directories(trident_test_gpt PUBLIC "${PROJECT_SOURCE_DIR}/examples" "${CMAKE_CURRENT_SOURCE_DIR}")
target_link_libraries(trident_test_gpt PRIVATE doctest::doctest)
trident_strict_warnings(trident_test_gpt)
trident_add_test(gpt.local SOURCES gpt/test_gpt_local.cpp LIBRARIES trident_test_gpt LABELS gpt local)
# Checkpoints of the GPT: bit-exact resume on a 3-D grid and resharding across grid layouts.
trident_add_test(checkpoint.gpt SOURCES gpt/test_gpt_checkpoint.cpp LIBRARIES trident_test_gpt LABELS checkpoint gpt local)
if(NOT sanitized)
  trident_add_test(gpt.precision SOURCES gpt/test_gpt_precision.cpp LIBRARIES trident_test_gpt LABELS gpt local)
endif()
# Over MPI: the thread-rank tests cover the same code under the sanitizers, so the sanitizer
# build skips it (its trainer instantiation for mpi_comm is the costliest file to compile there).
if(TARGET trident::mpi AND NOT sanitized)
  trident_add_test(gpt.mpi SOURCES gpt/test_gpt_mpi.cpp LIBRARIES trident::mpi Threads::Threads MPI_RANKS 4 LABELS gpt mpi)
  target_include_directories(test_gpt_mpi PRIVATE "${PROJECT_SOURCE_DIR}/examples")
endif()
