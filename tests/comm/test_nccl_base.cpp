// NCCL's vocabulary: runs without a GPU (no communicator is created).
#include <doctest/doctest.h>

#include <string>

#include "trident/comm/nccl/base.hpp"

TEST_CASE("every dtype maps to the NCCL datatype of the same element") {
  using trident::dtype;
  CHECK(trident::to_nccl(dtype::float32) == ncclFloat32);
  CHECK(trident::to_nccl(dtype::float64) == ncclFloat64);
  CHECK(trident::to_nccl(dtype::float16) == ncclFloat16);
  CHECK(trident::to_nccl(dtype::bfloat16) == ncclBfloat16);
  CHECK(trident::to_nccl(dtype::int8) == ncclInt8);
  CHECK(trident::to_nccl(dtype::uint8) == ncclUint8);
  CHECK(trident::to_nccl(dtype::int32) == ncclInt32);
  CHECK(trident::to_nccl(dtype::uint32) == ncclUint32);
  CHECK(trident::to_nccl(dtype::int64) == ncclInt64);
  CHECK(trident::to_nccl(dtype::uint64) == ncclUint64);
  static_assert(trident::nccl_type_of<trident::bf16> == ncclBfloat16);
  static_assert(trident::nccl_type_of<double> == ncclFloat64);
}

TEST_CASE("the NCCL library loaded is the one whose header we compiled against") {
  int version = 0;
  TRIDENT_NCCL_CHECK(ncclGetVersion(&version));
  CHECK(version == NCCL_VERSION_CODE);
}

TEST_CASE("TRIDENT_NCCL_CHECK turns a failed call into nccl_error with NCCL's own explanation") {
  int count = 0;
  try {
    TRIDENT_NCCL_CHECK(ncclCommCount(nullptr, &count));
    FAIL("ncclCommCount(nullptr) did not fail");
  } catch (const trident::nccl_error& e) {
    CHECK(e.status() == ncclInvalidArgument);
    CHECK(e.operation() == "ncclCommCount(nullptr, &count)");
    CHECK(std::string(e.what()).find("invalid argument") != std::string::npos);
    CHECK(std::string(e.what()).find("comm argument is NULL") != std::string::npos);
  }
}
