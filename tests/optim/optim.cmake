# Optimizers (issue 4): the host step against double-precision PyTorch formulas, and the CUDA
# step against the host step (skipped without a device). Included from tests/CMakeLists.txt.
find_package(Threads REQUIRED)
trident_add_test(optim.host SOURCES optim/test_optimizers.cpp LIBRARIES Threads::Threads LABELS optim)
if(CMAKE_CUDA_COMPILER AND TARGET trident::cuda)
  trident_add_test(optim.cuda SOURCES optim/test_optimizers.cu LIBRARIES trident::cuda GPU LABELS optim cuda gpu)
endif()
# The AVX-512 / AVX2 host paths (optim/host_simd.hpp), each forced in turn, against the element
# functor, bitwise.
trident_add_test(optim.host_simd SOURCES optim/test_host_simd.cpp LIBRARIES Threads::Threads LABELS optim)
