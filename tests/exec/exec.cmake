# Execution contexts. The CUDA context needs a device (skipped without one; scripts/gpu_check.sh
# runs it on a GPU).
if(CMAKE_CUDA_COMPILER AND TARGET trident::cuda)
  trident_add_test(exec.cuda_stream SOURCES exec/test_cuda_stream.cu LIBRARIES trident::cuda GPU LABELS exec cuda gpu)
endif()
# The host pool; also under ThreadSanitizer, like the thread backend (its correctness is its
# synchronisation).
find_package(Threads REQUIRED)
trident_add_test(exec.thread_pool SOURCES exec/test_thread_pool.cpp LIBRARIES Threads::Threads LABELS exec)
if(TRIDENT_TSAN_TESTS AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  trident_add_test(exec.thread_pool_tsan SOURCES exec/test_thread_pool.cpp LIBRARIES Threads::Threads LABELS exec tsan)
  target_compile_options(test_exec_thread_pool_tsan PRIVATE -fsanitize=thread -O1 -g)
  target_link_options(test_exec_thread_pool_tsan PRIVATE -fsanitize=thread)
  set_tests_properties(exec.thread_pool_tsan PROPERTIES ENVIRONMENT "TSAN_OPTIONS=halt_on_error=1")
endif()
# Timelines (Chrome trace): recorders, spans and the JSON; the library's own spans are checked
# on a training step in tests/gpt.
trident_add_test(exec.trace SOURCES exec/test_trace.cpp LIBRARIES Threads::Threads LABELS exec)
