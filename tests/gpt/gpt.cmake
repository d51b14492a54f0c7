# The flagship GPT trainer (examples/01_flagship): every grid and ZeRO stage against one rank,
# the trace, bad input, bf16 and fp16. The trainer's instantiations compile once, into the
# flagship's own flagship_train library (examples/01_flagship/train_<precision>.cpp), which the
# flagship and these tests link; without the examples, into a library of the tests' own.
find_package(Threads REQUIRED)
# The sanitizer build compiles fp32 for thread ranks only (gpt.precision and gpt.mpi are not built
# there): each half precision takes minutes to compile under ASan + UBSan and runs the same code
# paths with other roundings.
set(sanitized FALSE)
if(CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  set(sanitized TRUE)
endif()
if(TARGET flagship_train)
  set(gpt_train flagship_train)
else()
  set(flagship_dir "${PROJECT_SOURCE_DIR}/examples/01_flagship")
  set(gpt_train_sources "${flagship_dir}/train_fp32.cpp")
  if(NOT sanitized)
    list(APPEND gpt_train_sources "${flagship_dir}/train_bf16.cpp" "${flagship_dir}/train_fp16.cpp")
  endif()
  add_library(trident_test_gpt_train STATIC ${gpt_train_sources})
  target_link_libraries(trident_test_gpt_train PUBLIC trident::trident Threads::Threads)
  if(TARGET trident::mpi AND NOT sanitized)
    target_link_libraries(trident_test_gpt_train PUBLIC trident::mpi)
  endif()
  trident_strict_warnings(trident_test_gpt_train)
  set(gpt_train trident_test_gpt_train)
endif()
add_library(trident_test_gpt INTERFACE)
target_link_libraries(trident_test_gpt INTERFACE ${gpt_train})
target_include_directories(trident_test_gpt INTERFACE "${PROJECT_SOURCE_DIR}/examples" "${CMAKE_CURRENT_SOURCE_DIR}")
trident_add_test(gpt.local SOURCES gpt/test_gpt_local.cpp LIBRARIES trident_test_gpt LABELS gpt local)
# Checkpoints of the GPT: bit-exact resume on a 3-D grid and resharding across grid layouts.
trident_add_test(checkpoint.gpt SOURCES gpt/test_gpt_checkpoint.cpp LIBRARIES trident_test_gpt LABELS checkpoint gpt local)
if(NOT sanitized)
  trident_add_test(gpt.precision SOURCES gpt/test_gpt_precision.cpp LIBRARIES trident_test_gpt LABELS gpt local)
endif()
# Over MPI: the thread-rank tests cover the same code under the sanitizers, so the sanitizer
# build skips it (its trainer instantiation for mpi_comm is the costliest file to compile there).
if(TARGET trident::mpi AND NOT sanitized)
  trident_add_test(gpt.mpi SOURCES gpt/test_gpt_mpi.cpp LIBRARIES trident_test_gpt trident::mpi MPI_RANKS 4 LABELS gpt mpi)
endif()
# On the GPU (examples/01_flagship/gpt_cuda.cuh): NCCL ranks sharing GPU 0 against the host's
# serial run; skips (77) without a device.
if(CMAKE_CUDA_COMPILER AND TARGET trident::nccl AND TARGET trident::mpi AND TARGET trident::cuda AND NOT sanitized)
  # The GPU trainer's instantiations: the flagship's flagship_cuda, or compiled here without examples.
  if(TARGET flagship_cuda)
    set(gpt_cuda_train flagship_cuda)
    set(gpt_cuda_sources "")
  else()
    set(gpt_cuda_train "")
    set(gpt_cuda_sources "${PROJECT_SOURCE_DIR}/examples/01_flagship/train_cuda.cu"
                         "${PROJECT_SOURCE_DIR}/examples/01_flagship/train_cuda_bf16.cu")
  endif()
  trident_add_test(gpt.nccl SOURCES gpt/test_gpt_nccl.cu ${gpt_cuda_sources} LIBRARIES trident_test_gpt ${gpt_cuda_train} trident::nccl
                   trident::cuda trident::mpi Threads::Threads MPI_RANKS 4 LABELS gpt nccl gpu mpi TIMEOUT 900)
  set_property(TEST gpt.nccl APPEND PROPERTY ENVIRONMENT NCCL_SOCKET_IFNAME=lo)
endif()
