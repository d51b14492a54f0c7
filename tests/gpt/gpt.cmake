# The flagship GPT trainer (examples/01_flagship): every grid and ZeRO stage against one rank,
# the trace, bad input, bf16 and fp16. The trainer's instantiations compile once, into the
# flagship's own flagship_train library (examples/01_flagship/train_<precision>.cpp), which the
# flagship and these tests link; without the examples, into a library of the tests' own.
find_package(Threads REQUIRED)
# The sanitizer build does not build the flagship's trainer: its instantiation is the costliest
# file to compile there (89 s of CI's 30 minutes for train_fp32.cpp alone, and gpt.local's 34 s
# run), and the library code it drives (ZeRO, the tensor and pipeline layers, the
# communicators, checkpoints, the data loader) runs under ASan + UBSan in those parts' own tests.
# The DeepSpeed config loader (config.cmake) stays in it.
if(CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  return()
endif()
if(TARGET flagship_train)
  set(gpt_train flagship_train)
  # In a build of the tests, the trainer's instantiations take the tests' flags too (scripts/test.sh:
  # -O1): its three units are the costliest host files to compile (58 s each at -O2, 40 s at -O1
  # in CI's build) and here only the tests run them. The README's flagship builds without tests.
  if(trident_test_cxx_flags)
    target_compile_options(flagship_train PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${trident_test_cxx_flags}>")
  endif()
else()
  set(flagship_dir "${PROJECT_SOURCE_DIR}/examples/01_flagship")
  add_library(trident_test_gpt_train STATIC "${flagship_dir}/train_fp32.cpp" "${flagship_dir}/train_bf16.cpp"
                                            "${flagship_dir}/train_fp16.cpp")
  target_link_libraries(trident_test_gpt_train PUBLIC trident::trident Threads::Threads)
  if(TARGET trident::mpi)
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
trident_add_test(gpt.precision SOURCES gpt/test_gpt_precision.cpp LIBRARIES trident_test_gpt LABELS gpt local)
# The flagship's command line as a hostile user meets it (gpt/flagship_cli.sh): values out of
# range, a diverging run, and under MPI an error's message and ranks started differently.
if(TARGET flagship)
  set(cli_mpiexec "")
  set(cli_labels gpt local)
  if(TARGET trident::mpi)
    set(cli_mpiexec "${MPIEXEC_EXECUTABLE}")
    list(APPEND cli_labels mpi)
  endif()
  add_test(NAME gpt.cli COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/gpt/flagship_cli.sh" $<TARGET_FILE:flagship>
                                "${CMAKE_CURRENT_BINARY_DIR}/gpt_cli" "${cli_mpiexec}")
  set_tests_properties(gpt.cli PROPERTIES LABELS "${cli_labels}" TIMEOUT 600 PROCESSORS 2)
endif()
if(TARGET trident::mpi)
  trident_add_test(gpt.mpi SOURCES gpt/test_gpt_mpi.cpp LIBRARIES trident_test_gpt trident::mpi MPI_RANKS 4 LABELS gpt mpi)
endif()
# On the GPU (examples/01_flagship/gpt_cuda.cuh): NCCL ranks sharing GPU 0 against the host's
# serial run; skips (77) without a device.
if(CMAKE_CUDA_COMPILER AND TARGET trident::nccl AND TARGET trident::mpi AND TARGET trident::cuda)
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
