# tridentComponents.cmake — the optional component targets, shared by the build tree and the
# installed package so that trident::cuda, trident::nccl and trident::mpi mean the same thing
# whether a project uses add_subdirectory, the build tree or an installed (Conan, vcpkg) copy.
#
#   trident::cuda   trident::trident + CUDA::cudart + CUDA::cublas + CUDA::cublasLt,
#                   TRIDENT_HAS_CUDA=1
#   trident::nccl   trident::cuda + NCCL::NCCL,                     TRIDENT_HAS_NCCL=1
#   trident::mpi    trident::trident + MPI::MPI_CXX,                TRIDENT_HAS_MPI=1
#
# The header-only core needs none of them. Each is defined only once its dependency has been
# found by the caller; trident_define_component reports whether it could define the target.

# Finds what a component needs. `how` is find_package (build tree) or find_dependency
# (installed config, which must forward QUIET/REQUIRED the CMake way).
macro(trident_find_component_dependencies component how)
  if("${component}" STREQUAL "cuda")
    cmake_language(CALL ${how} CUDAToolkit)
  elseif("${component}" STREQUAL "nccl")
    cmake_language(CALL ${how} CUDAToolkit)
    cmake_language(CALL ${how} NCCL)
  elseif("${component}" STREQUAL "mpi")
    cmake_language(CALL ${how} MPI COMPONENTS CXX)
  endif()
endmacro()

# Defines trident::<component> if its dependencies are present; sets <result_var> to TRUE or FALSE.
# `scope` is GLOBAL in the build tree (so a parent project of add_subdirectory sees the target)
# and empty in the installed config.
function(trident_define_component component scope result_var)
  set(${result_var} FALSE PARENT_SCOPE)
  if(TARGET trident::${component})
    set(${result_var} TRUE PARENT_SCOPE)
    return()
  endif()
  if(component STREQUAL "cuda")
    if(NOT TARGET CUDA::cudart OR NOT TARGET CUDA::cublas OR NOT TARGET CUDA::cublasLt)
      return()
    endif()
    set(links trident::trident CUDA::cudart CUDA::cublas CUDA::cublasLt)
    set(defines TRIDENT_HAS_CUDA=1)
  elseif(component STREQUAL "nccl")
    trident_define_component(cuda "${scope}" _trident_cuda_ok)
    if(NOT _trident_cuda_ok OR NOT TARGET NCCL::NCCL)
      return()
    endif()
    set(links trident::cuda NCCL::NCCL)
    set(defines TRIDENT_HAS_NCCL=1)
  elseif(component STREQUAL "mpi")
    if(NOT TARGET MPI::MPI_CXX)
      return()
    endif()
    set(links trident::trident MPI::MPI_CXX)
    set(defines TRIDENT_HAS_MPI=1)
  else()
    message(FATAL_ERROR "trident: unknown component '${component}' (known: cuda, nccl, mpi)")
  endif()
  add_library(trident::${component} INTERFACE IMPORTED ${scope})
  set_target_properties(trident::${component} PROPERTIES
    INTERFACE_LINK_LIBRARIES "${links}"
    INTERFACE_COMPILE_DEFINITIONS "${defines}")
  set(${result_var} TRUE PARENT_SCOPE)
endfunction()
