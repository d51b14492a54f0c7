// ZeRO stages 0-3 over MPI (mpirun -np 4): the same MLP as the thread tests, compared with
// single-rank training on the global batch, which each process computes for itself on one
// thread rank.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "support/mpi_main.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/mpi.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"
#include "zero/zero_training.hpp"

namespace zero = trident::zero;
namespace optim = trident::optim;

namespace {

using zero_training::by_name;
using zero_training::relative_difference;

template <class Opt>
void check(Opt opt, const char* name) {
  const auto serial = trident::local_world::run(1, [&](trident::local_comm& c) { return by_name<0>(c, opt, 20); })[0];
  auto& comm = test_support::mpi_world();
  const auto s0 = by_name<0>(comm, opt, 20);
  const auto s1 = by_name<1>(comm, opt, 20);
  const auto s2 = by_name<2>(comm, opt, 20);
  const auto s3 = by_name<3>(comm, opt, 20);
  INFO(name, " on ", comm.size(), " MPI ranks");
  CHECK(relative_difference(s0, serial) <= 1e-5);
  CHECK(relative_difference(s1, serial) <= 1e-5);
  CHECK(relative_difference(s2, serial) <= 1e-5);
  CHECK(relative_difference(s3, serial) <= 1e-5);
}

}  // namespace

TEST_CASE("zero over MPI: stages 0-3 = one rank on the global batch (SGD momentum, AdamW)") {
  optim::sgd sgd;
  sgd.opt.lr = 0.05f;
  sgd.opt.momentum = 0.9f;
  check(sgd, "sgd");
  optim::adamw adamw;
  adamw.opt.lr = 3e-3f;
  check(adamw, "adamw");
}

int main(int argc, char** argv) { return test_support::mpi_doctest_main(argc, argv); }
