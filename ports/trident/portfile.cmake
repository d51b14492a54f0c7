# vcpkg overlay port for trident, built from this checkout:
#   vcpkg install trident[mpi] --overlay-ports=<trident checkout>/ports
# then, in the consumer: find_package(trident CONFIG REQUIRED COMPONENTS mpi)
set(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../..")
set(VCPKG_BUILD_TYPE release)  # header-only: one configuration is all there is

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
  FEATURES
    cuda TRIDENT_ENABLE_CUDA
    nccl TRIDENT_ENABLE_NCCL
    mpi  TRIDENT_ENABLE_MPI
)

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    ${FEATURE_OPTIONS}
    -DTRIDENT_BUILD_TESTS=OFF
    -DTRIDENT_BUILD_BENCHMARKS=OFF
    -DTRIDENT_BUILD_EXAMPLES=OFF
    -DTRIDENT_INSTALL=ON
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME trident CONFIG_PATH share/cmake/trident)

file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/share/doc")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
