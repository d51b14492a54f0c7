# cmake -P consume.cmake: builds and runs tests/packaging/consumer against trident.
#   MODE=install            cmake --install the build tree into a prefix, then find_package
#   MODE=build_tree         find_package with trident_DIR = the build tree (export())
#   MODE=add_subdirectory   add_subdirectory of the source tree
# Other variables: SOURCE_DIR, BINARY_DIR, WORK, GENERATOR, CXX_COMPILER, COMPONENTS (comma-separated).
cmake_minimum_required(VERSION 3.23)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

string(REPLACE "," ";" components "${COMPONENTS}")
file(REMOVE_RECURSE "${WORK}")

if(MODE STREQUAL "install")
  run(${CMAKE_COMMAND} --install "${BINARY_DIR}" --prefix "${WORK}/prefix")
  # The installed tree: headers, the package files, nothing built for tests.
  foreach(expected include/trident/trident.hpp include/trident/core/half.hpp include/trident/core/cuda/convert.cuh
                   share/cmake/trident/tridentConfig.cmake share/cmake/trident/tridentConfigVersion.cmake
                   share/cmake/trident/tridentTargets.cmake share/cmake/trident/tridentComponents.cmake
                   share/cmake/trident/FindNCCL.cmake share/doc/trident/LICENSE)
    if(NOT EXISTS "${WORK}/prefix/${expected}")
      message(FATAL_ERROR "the install lacks ${expected}")
    endif()
  endforeach()
  file(GLOB_RECURSE executables "${WORK}/prefix/bin/*")
  if(executables)
    message(FATAL_ERROR "the install contains programs: ${executables}")
  endif()
  file(READ "${WORK}/prefix/share/cmake/trident/tridentConfigVersion.cmake" version_file)
  # ARCH_INDEPENDENT: a header-only package must not be refused by a 32-bit (or other) consumer.
  if(NOT version_file MATCHES "if\\(\"TRUE\"\\)[ \n]*return\\(\\)")
    message(FATAL_ERROR "tridentConfigVersion.cmake is not ARCH_INDEPENDENT:\n${version_file}")
  endif()
  set(consumer_args -DCONSUMER_MODE=find_package "-DCMAKE_PREFIX_PATH=${WORK}/prefix")
elseif(MODE STREQUAL "build_tree")
  set(consumer_args -DCONSUMER_MODE=find_package "-Dtrident_DIR=${BINARY_DIR}")
elseif(MODE STREQUAL "add_subdirectory")
  set(consumer_args -DCONSUMER_MODE=add_subdirectory "-DTRIDENT_SOURCE_DIR=${SOURCE_DIR}")
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()

string(REPLACE ";" "\\;" components_arg "${components}")
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/packaging/consumer" -B "${WORK}/build" -G "${GENERATOR}"
    "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCONSUMER_COMPONENTS=${components_arg}" ${consumer_args})
run(${CMAKE_COMMAND} --build "${WORK}/build")

# Each executable reports exactly the capabilities of the target it linked.
set(expect_consumer "cuda=0 nccl=0 mpi=0")
set(expect_consumer_cuda "cuda=1 nccl=0 mpi=0")
set(expect_consumer_nccl "cuda=1 nccl=1 mpi=0")
set(expect_consumer_mpi "cuda=0 nccl=0 mpi=1")
set(programs consumer)
foreach(component IN LISTS components)
  list(APPEND programs consumer_${component})
endforeach()
file(READ "${SOURCE_DIR}/include/trident/core/config.hpp" config)
string(REGEX MATCH "TRIDENT_VERSION_STRING \"([0-9.]+)\"" _ "${config}")
set(version "${CMAKE_MATCH_1}")
foreach(program IN LISTS programs)
  run("${WORK}/build/${program}")
  if(NOT last_output MATCHES "trident ${version} ${expect_${program}}")
    message(FATAL_ERROR "${program} printed:\n${last_output}\nexpected: trident ${version} ${expect_${program}}")
  endif()
  message(STATUS "${program}: ${last_output}")
endforeach()
