// The NCCL communicator's host-side parts, which need no GPU: the reduction mapping, the
// communicator's type properties and defaults, and the unique id's file bootstrap on a rank
// other than 0 (which makes no NCCL call).
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <type_traits>
#include <unistd.h>

#include "trident/comm/nccl.hpp"

TEST_CASE("reduce_op maps to NCCL's reductions") {
  static_assert(trident::to_nccl(trident::reduce_op::sum) == ncclSum);
  static_assert(trident::to_nccl(trident::reduce_op::avg) == ncclAvg);
  static_assert(trident::to_nccl(trident::reduce_op::max) == ncclMax);
  static_assert(trident::to_nccl(trident::reduce_op::min) == ncclMin);
  static_assert(trident::to_nccl(trident::reduce_op::prod) == ncclProd);
  CHECK(trident::to_nccl(trident::reduce_op::avg) == ncclAvg);
}

TEST_CASE("nccl_unique_id_from_file: a missing file is an error naming the path") {
  const auto path = std::filesystem::temp_directory_path() / ("trident-nccl-host-" + std::to_string(::getpid()) + ".id");
  CHECK_THROWS_WITH_AS((void)trident::nccl_unique_id_from_file(path, 1, std::chrono::milliseconds(50)),
                       doctest::Contains(path.string().c_str()), trident::error);
  CHECK_THROWS_AS((void)trident::nccl_unique_id_from_file(path, -1, std::chrono::seconds(1)), trident::usage_error);
}

TEST_CASE("nccl_comm models the communicator concept, over cuda_space") {
  static_assert(trident::communicator<trident::nccl_comm>);
  static_assert(std::is_same_v<trident::nccl_comm::space, trident::cuda_space>);
  static_assert(!std::is_copy_constructible_v<trident::nccl_comm>);
  static_assert(!std::is_copy_constructible_v<trident::nccl_comm::request>);
  static_assert(std::is_nothrow_move_constructible_v<trident::nccl_comm>);
  const trident::nccl_options defaults;
  CHECK(defaults.timeout == std::chrono::minutes(5));
  CHECK_FALSE(defaults.host_id_per_rank);
  CHECK(defaults.stream == nullptr);
}
