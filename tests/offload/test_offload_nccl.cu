// Offload of the optimizer state (issue 14) for a device optimizer: NCCL ranks sharing GPU 0
// (NCCL_HOSTID per rank), the MLP through the host staging adapter. Each bucket's gradients
// come down to pinned memory, the host step updates the state (host memory or NVMe files) and
// the half parameters go back up; the result must equal the same optimizer with its state on
// the device, bit for bit (the CUDA step is bitwise the host step), ZeRO 1-3, fp32 and bf16.
// Skips (77) without a device; scripts/gpu_check.sh runs it with 2 and 4 ranks.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <optional>
#include <vector>

#include "offload/offload_training.hpp"
#include "support/nccl_mpi_main.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/parallel/data/cuda/zero_engine.cuh"

namespace optim = trident::optim;
namespace offload = trident::offload;
using offload_training::scratch_dir;
using offload_training::with;
using zero_training::by_name;

namespace {

std::optional<trident::nccl_comm> world;

template <int Stage, class Precision>
void check(const std::filesystem::path& dir) {
  auto& comm = *world;
  optim::adamw opt;
  opt.opt.lr = 3e-3f;
  const auto device = by_name<Stage, optim::adamw, Precision>(comm, opt, 6);
  INFO("ZeRO-", Stage, " on ", comm.size(), " NCCL ranks, rank ", comm.rank());
  CHECK(by_name<Stage, optim::adamw, Precision>(comm, opt, 6, with(offload::host())) == device);
  CHECK(by_name<Stage, optim::adamw, Precision>(comm, opt, 6, with(offload::nvme(dir))) == device);
}

}  // namespace

TEST_CASE("offload over NCCL: host and NVMe tiers = the state on the device, bitwise, ZeRO 1-3") {
  scratch_dir dir("nccl-rank" + std::to_string(world->rank()));
  using bf16 = trident::mixed_precision<trident::bf16>;
  check<1, bf16>(dir.path);
  check<2, bf16>(dir.path);
  check<3, bf16>(dir.path);
  check<2, trident::full_precision>(dir.path);  // no master weights: fp32 parameters come down too
  CHECK(dir.files() == 0);
}

int main(int argc, char** argv) { return test_support::nccl_mpi_doctest_main(argc, argv, world); }
