# Execution contexts. The CUDA context needs a device (skipped without one; scripts/gpu_check.sh
# runs it on a GPU).
if(CMAKE_CUDA_COMPILER AND TARGET trident::cuda)
  trident_add_test(exec.cuda_stream SOURCES exec/test_cuda_stream.cu LIBRARIES trident::cuda GPU LABELS exec cuda gpu)
endif()
