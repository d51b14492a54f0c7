# Reference layers (nn/): the host layers against double-precision references and central
# differences; again with OpenBLAS behind nn::gemm where it is found; against PyTorch's own output
# (nn.torch_layers); the CUDA layers against the host ones (skipped without a device). Included
# from tests/CMakeLists.txt.
find_package(Threads REQUIRED)
trident_add_test(nn.host SOURCES nn/test_nn.cpp LIBRARIES Threads::Threads LABELS nn)
# The host layers against PyTorch's own float32 output (tests/fixtures/torch_layers.txt).
trident_add_test(nn.torch_layers SOURCES nn/test_nn_reference.cpp LABELS nn)
target_compile_definitions(test_nn_torch_layers PRIVATE TRIDENT_FIXTURES="${PROJECT_SOURCE_DIR}/tests/fixtures")

# trident_test_blas: the opt-in CBLAS path of nn/gemm.hpp (TRIDENT_HAS_CBLAS=1 + a CBLAS). Only
# our tests use it; the library itself never requires a BLAS. BLA_VENDOR is restored so that no
# other find_package(BLAS) in this directory is affected.
if(NOT TARGET trident_test_blas)
  set(_trident_saved_bla_vendor "${BLA_VENDOR}")
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS QUIET)
  set(BLA_VENDOR "${_trident_saved_bla_vendor}")
  if(BLAS_FOUND)
    include(CheckIncludeFileCXX)
    check_include_file_cxx(cblas.h TRIDENT_HAVE_CBLAS_H)
    if(TRIDENT_HAVE_CBLAS_H)
      add_library(trident_test_blas INTERFACE)
      target_link_libraries(trident_test_blas INTERFACE BLAS::BLAS)
      target_compile_definitions(trident_test_blas INTERFACE TRIDENT_HAS_CBLAS=1)
    endif()
  endif()
endif()
if(TARGET trident_test_blas)
  trident_add_test(nn.host_cblas SOURCES nn/test_nn.cpp LIBRARIES trident_test_blas Threads::Threads LABELS nn blas)
else()
  message(STATUS "trident: no OpenBLAS with cblas.h; nn.host_cblas is not built")
endif()

if(CMAKE_CUDA_COMPILER AND TARGET trident::cuda)
  trident_add_test(nn.cuda SOURCES nn/test_nn.cu LIBRARIES trident::cuda GPU LABELS nn cuda gpu)
endif()
