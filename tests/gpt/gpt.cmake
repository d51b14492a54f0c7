# The flagship GPT trainer (examples/01_flagship): every grid and ZeRO stage against one rank,
# the trace, bad input, bf16 and fp16. The trainer's instantiations for thread ranks compile once,
# into trident_test_gpt (gpt_instances_*.cpp, one per precision), which the thread-rank tests link.
find_package(Threads REQUIRED)
add_library(trident_test_gpt STATIC gpt/gpt_instances_fp32.cpp gpt/gpt_instances_bf16.cpp gpt/gpt_instances_fp16.cpp)
target_link_libraries(trident_test_gpt PUBLIC trident::trident Threads::Threads)
target_include_directories(trident_test_gpt PUBLIC "${PROJECT_SOURCE_DIR}/examples" "${CMAKE_CURRENT_SOURCE_DIR}")
target_link_libraries(trident_test_gpt PRIVATE doctest::doctest)
trident_strict_warnings(trident_test_gpt)
trident_add_test(gpt.local SOURCES gpt/test_gpt_local.cpp LIBRARIES trident_test_gpt LABELS gpt local)
trident_add_test(gpt.precision SOURCES gpt/test_gpt_precision.cpp LIBRARIES trident_test_gpt LABELS gpt local)
# Over MPI: the thread-rank tests cover the same code under the sanitizers, so the sanitizer
# build skips it (its trainer instantiation for mpi_comm is the costliest file to compile there).
if(TARGET trident::mpi AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  trident_add_test(gpt.mpi SOURCES gpt/test_gpt_mpi.cpp LIBRARIES trident::mpi Threads::Threads MPI_RANKS 4 LABELS gpt mpi)
  target_include_directories(test_gpt_mpi PRIVATE "${PROJECT_SOURCE_DIR}/examples")
endif()
