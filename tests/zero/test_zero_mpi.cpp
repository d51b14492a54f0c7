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
#include "trident/zero/zero_optimizer.hpp"
#include "mlp.hpp"

namespace zero = trident::zero;
namespace optim = trident::optim;

namespace {

constexpr std::size_t global_batch = 24;

zero::zero_options small_buckets() {
  zero::zero_options o;
  o.bucket_bytes = 700 * sizeof(float);
  o.first_bucket_bytes = 150 * sizeof(float);
  o.persistence_threshold = 0;
  return o;
}

template <int Stage, class Opt, class Comm>
std::vector<float> by_name(Comm& comm, Opt opt, int steps) {
  const mlp::dims d;
  const auto spec = mlp::spec(d);
  zero::zero_optimizer<Stage, Opt, Comm> z(comm, spec, opt, small_buckets());
  mlp::initialise(z, d);
  const std::size_t rows = global_batch / static_cast<std::size_t>(comm.size());
  for (int s = 0; s < steps; ++s) {
    const std::size_t first = static_cast<std::size_t>(s) * global_batch + static_cast<std::size_t>(comm.rank()) * rows;
    mlp::train_step(z, d, first, rows, rows, z.loss_scale());
    z.step();
  }
  const auto full = z.full_master();
  std::vector<float> out;
  for (const auto& t : spec.tensors()) {
    const auto& p = z.layout().find(t.name);
    out.insert(out.end(), full.begin() + static_cast<std::ptrdiff_t>(p.offset), full.begin() + static_cast<std::ptrdiff_t>(p.offset + p.numel));
  }
  return out;
}

double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

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
