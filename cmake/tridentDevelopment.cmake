# tridentDevelopment.cmake — helpers for trident's own tests, benchmarks and examples.
# Not installed: consumers never see these flags.

# -Wall -Wextra -Wpedantic -Werror on a target of ours (never on trident::trident, which would
# push our warning policy onto every consumer).
function(trident_strict_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)
  # GCC 12 at -O3 warns -Wrestrict inside libstdc++ on `"text" + std::string` (GCC bug 105329,
  # fixed in 13): with -Werror a Release build of the tests failed on correct code.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
  endif()
endfunction()

# trident_add_test(<name> SOURCES <files...> [LIBRARIES <targets...>] [MPI_RANKS <n>] [GPU] [LABELS <labels...>])
#
# One executable and one ctest test named <name>. MPI_RANKS runs it under mpirun with n ranks.
# GPU marks a test that needs a CUDA device: its main exits with 77 when there is none, which
# ctest reports as skipped rather than passed.
function(trident_add_test name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "GPU" "MPI_RANKS;TIMEOUT" "SOURCES;LIBRARIES;LABELS")
  string(REPLACE "." "_" target "test_${name}")
  add_executable(${target} ${arg_SOURCES})
  target_link_libraries(${target} PRIVATE ${arg_LIBRARIES})
  if(arg_GPU)
    target_link_libraries(${target} PRIVATE trident_test_main_gpu)
  else()
    target_link_libraries(${target} PRIVATE trident_test_main)
  endif()
  trident_strict_warnings(${target})
  if(arg_MPI_RANKS)
    # --oversubscribe: CI machines have 2 cores; root is allowed because containers run as root.
    add_test(NAME ${name}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${arg_MPI_RANKS} --oversubscribe
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS})
    # Under the asan preset, leak checking is off for MPI tests only: OpenMPI's plug-ins are
    # unloaded at MPI_Finalize with their allocations alive, and LSan cannot name (so cannot
    # suppress) code from an unloaded module. Outside ASan the variable is ignored.
    set_tests_properties(${name} PROPERTIES
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;ASAN_OPTIONS=detect_leaks=0:abort_on_error=1"
      PROCESSORS ${arg_MPI_RANKS})
  else()
    add_test(NAME ${name} COMMAND ${target})
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT ${arg_TIMEOUT} LABELS "${arg_LABELS}")
endfunction()

# trident_add_header_checks(): every public header compiled alone, twice included (include
# guard), in its own translation unit, with -Werror:
#   header_check_host   plain host compiler, trident::trident only: no CUDA, NCCL or MPI
#                       anywhere on the include path
#   header_check_cuda   the same headers with trident::cuda (TRIDENT_HAS_CUDA=1, host compiler)
#   header_check_nvcc   every header through nvcc: each .cuh (and nvcc-only header) alone, and the
#                       host headers together in one translation unit (each alone is the host
#                       flavours' check; what nvcc adds is its own front end, which one unit
#                       checks as well as 63: this saved about 280 s of compiling per CI run)
#   header_check_nccl / header_check_mpi   headers that need that dependency
# A header declares what it needs with a line "// trident-requires: nvcc|nccl|mpi" near its top.
# The targets are built by the ctest tests packaging.headers.*, not by `all`.
function(trident_add_header_checks)
  file(GLOB_RECURSE headers RELATIVE "${PROJECT_SOURCE_DIR}/include" CONFIGURE_DEPENDS
       "${PROJECT_SOURCE_DIR}/include/trident/*.hpp" "${PROJECT_SOURCE_DIR}/include/trident/*.cuh")
  set(dir "${CMAKE_CURRENT_BINARY_DIR}/header_check")
  foreach(header IN LISTS headers)
    file(STRINGS "${PROJECT_SOURCE_DIR}/include/${header}" requires REGEX "^// trident-requires: " LIMIT_COUNT 1)
    string(REGEX REPLACE "^// trident-requires: *([a-z]+).*" "\\1" requires "${requires}")
    string(MAKE_C_IDENTIFIER "${header}" stem)
    set(body "#include <${header}>\n#include <${header}>  // a second time: the include guard must hold\n")
    file(CONFIGURE OUTPUT "${dir}/${stem}.cpp" CONTENT "${body}")
    file(CONFIGURE OUTPUT "${dir}/${stem}.cu" CONTENT "${body}")
    if(requires STREQUAL "")
      list(APPEND host_sources "${dir}/${stem}.cpp")
      string(APPEND all_host_headers "${body}")
    elseif(requires STREQUAL "nvcc")
      list(APPEND nvcc_sources "${dir}/${stem}.cu")
    elseif(requires STREQUAL "nccl")
      list(APPEND nccl_sources "${dir}/${stem}.cpp")
      list(APPEND nvcc_nccl_sources "${dir}/${stem}.cu")
    elseif(requires STREQUAL "mpi")
      list(APPEND mpi_sources "${dir}/${stem}.cpp")
    else()
      message(FATAL_ERROR "${header}: unknown 'trident-requires: ${requires}' (known: nvcc, nccl, mpi)")
    endif()
  endforeach()
  file(CONFIGURE OUTPUT "${dir}/all_host_headers.cu" CONTENT "${all_host_headers}")
  list(APPEND nvcc_sources "${dir}/all_host_headers.cu")
  # With the CUDA runtime (TRIDENT_HAS_CUDA=1) the host headers compile in one unit: each one
  # alone is checked without CUDA above (header_check_host), and one unit instead of one per
  # header takes a fifth of the time (CI's 30 minutes are short).
  file(CONFIGURE OUTPUT "${dir}/all_host_headers.cpp" CONTENT "${all_host_headers}")
  set(cuda_host_sources "${dir}/all_host_headers.cpp")

  set(checks "")
  macro(_trident_header_target name sources library)
    if(${sources})
      add_library(${name} OBJECT EXCLUDE_FROM_ALL ${${sources}})
      target_link_libraries(${name} PRIVATE ${library})
      trident_strict_warnings(${name})
      list(APPEND checks ${name})
    endif()
  endmacro()
  _trident_header_target(header_check_host host_sources trident::trident)
  if(TARGET trident::cuda)
    _trident_header_target(header_check_cuda cuda_host_sources trident::cuda)
    if(CMAKE_CUDA_COMPILER)
      _trident_header_target(header_check_nvcc nvcc_sources trident::cuda)
      # One architecture is enough to check that a header compiles; the tests build for all.
      set_target_properties(header_check_nvcc PROPERTIES CUDA_ARCHITECTURES 90)
    endif()
  endif()
  if(TARGET trident::nccl)
    _trident_header_target(header_check_nccl nccl_sources trident::nccl)
    if(CMAKE_CUDA_COMPILER)
      _trident_header_target(header_check_nvcc_nccl nvcc_nccl_sources trident::nccl)
      set_target_properties(header_check_nvcc_nccl PROPERTIES CUDA_ARCHITECTURES 90)
    endif()
  endif()
  if(TARGET trident::mpi)
    _trident_header_target(header_check_mpi mpi_sources trident::mpi)
  endif()

  foreach(check IN LISTS checks)
    string(REPLACE "header_check_" "" flavour "${check}")
    add_test(NAME packaging.headers.${flavour}
             COMMAND ${CMAKE_COMMAND} --build "${PROJECT_BINARY_DIR}" --target ${check})
    set_tests_properties(packaging.headers.${flavour} PROPERTIES LABELS packaging TIMEOUT 900
                         RESOURCE_LOCK trident_build_tree)
  endforeach()
endfunction()
