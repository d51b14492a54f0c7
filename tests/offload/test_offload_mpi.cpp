// Offload of the optimizer state (issue 14) under MPI (mpirun -np 4): the host and NVMe tiers
// train bit for bit as the in-memory optimizer on the same ranks, ZeRO 1, 2 and 3, each process
// its own file.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <vector>

#include "offload/offload_training.hpp"
#include "support/mpi_main.hpp"
#include "trident/comm/mpi.hpp"

namespace optim = trident::optim;
namespace offload = trident::offload;
using offload_training::scratch_dir;
using offload_training::with;
using zero_training::by_name;

namespace {

template <int Stage, class Precision>
void check(trident::mpi_comm& comm, const std::filesystem::path& dir) {
  optim::adamw opt;
  opt.opt.lr = 3e-3f;
  const auto memory = by_name<Stage, optim::adamw, Precision>(comm, opt, 6);
  INFO("ZeRO-", Stage, " on ", comm.size(), " MPI ranks, rank ", comm.rank());
  CHECK(by_name<Stage, optim::adamw, Precision>(comm, opt, 6, with(offload::host())) == memory);
  CHECK(by_name<Stage, optim::adamw, Precision>(comm, opt, 6, with(offload::nvme(dir))) == memory);
}

}  // namespace

TEST_CASE("offload over MPI: host and NVMe tiers = in memory, bitwise, ZeRO 1-3") {
  auto& comm = test_support::mpi_world();
  scratch_dir dir("mpi-rank" + std::to_string(comm.rank()));
  using bf16 = trident::mixed_precision<trident::bf16>;
  check<1, bf16>(comm, dir.path);
  check<2, bf16>(comm, dir.path);
  check<3, bf16>(comm, dir.path);
  check<3, trident::full_precision>(comm, dir.path);
  CHECK(dir.files() == 0);
}

int main(int argc, char** argv) { return test_support::mpi_doctest_main(argc, argv); }
