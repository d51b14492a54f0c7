// ZeRO stages 0-3 on NCCL: the MLP trained on every rank of mpirun (several ranks share GPU 0,
// told apart by NCCL_HOSTID), compared with single-rank training on the global batch computed
// in the same process on one thread rank. Forward and backward run on the host through a
// staging adapter (the model is tiny); what is under test is the optimizer's device path:
// bucket reductions on NCCL, the fused step, gradient statistics, stage-3 gathering.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include "zero/zero_training.hpp"
#include "support/nccl_mpi_main.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/parallel/data/cuda/zero_engine.cuh"

namespace zero = trident::zero;
namespace optim = trident::optim;

namespace {

std::optional<trident::nccl_comm> world;
using zero_training::by_name;
using zero_training::relative_difference;

template <class Precision, class Opt>
void check(Opt opt, const char* name, double tolerance) {
  const auto serial = trident::local_world::run(1, [&](trident::local_comm& c) { return by_name<0, Opt, Precision>(c, opt, 20); })[0];
  auto& comm = *world;
  const std::vector<float> results[] = {by_name<0, Opt, Precision>(comm, opt, 20), by_name<1, Opt, Precision>(comm, opt, 20),
                                        by_name<2, Opt, Precision>(comm, opt, 20), by_name<3, Opt, Precision>(comm, opt, 20)};
  for (int stage = 0; stage < 4; ++stage) {
    INFO(name, " stage ", stage, " on ", comm.size(), " NCCL ranks");
    CHECK(relative_difference(results[stage], serial) <= tolerance);
  }
}

}  // namespace

TEST_CASE("zero over NCCL: stages 0-3 = one rank on the global batch (SGD momentum, AdamW, fp32)") {
  optim::sgd sgd;
  sgd.opt.lr = 0.05f;
  sgd.opt.momentum = 0.9f;
  check<trident::full_precision>(sgd, "sgd", 1e-5);
  optim::adamw adamw;
  adamw.opt.lr = 3e-3f;
  check<trident::full_precision>(adamw, "adamw", 1e-5);
}

TEST_CASE("zero over NCCL: bf16 mixed precision stays close to the host's bf16 run") {
  optim::adamw adamw;
  adamw.opt.lr = 3e-3f;
  // NCCL sums bf16 in its own order and precision, so this is a closeness check, not 1e-5.
  check<trident::mixed_precision<trident::bf16>>(adamw, "adamw bf16", 2e-2);
}

int main(int argc, char** argv) { return test_support::nccl_mpi_doctest_main(argc, argv, world); }
