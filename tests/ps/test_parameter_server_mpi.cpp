// The parameter server over MPI ranks (mpirun -np 4: 1 server, 3 workers; each server thread on
// its own communicator, MPI_THREAD_MULTIPLE): synchronous equals data parallelism bit for bit,
// staleness 0 equals synchronous, staleness 2 keeps pulls at most 2 steps behind.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "ps/ps_suite.hpp"
#include "support/mpi_main.hpp"
#include "trident/comm/mpi.hpp"

using test_support::mpi_world;
namespace optim = trident::optim;

namespace {

optim::adamw adamw() {
  optim::adamw o;
  o.opt.lr = 3e-3f;
  return o;
}

// The server's shard broadcast to every rank (one server: the whole model).
std::vector<float> model_after(trident::ps::options o, int steps) {
  auto& world = mpi_world();
  auto out = ps_suite::train(world, 1, adamw(), o, steps, ps_suite::no_delay);
  std::vector<float> model = ps_suite::initial();
  if (world.rank() == 0) model = out.shard;
  world.broadcast(model, 0);
  return model;
}

}  // namespace

TEST_CASE("ps over MPI: synchronous = data parallelism, staleness 0 = synchronous, staleness 2 bounded") {
  int level = 0;
  MPI_Query_thread(&level);
  REQUIRE(level == MPI_THREAD_MULTIPLE);
  const int workers = mpi_world().size() - 1;
  const auto sync = model_after({}, 6);
  CHECK(sync == ps_suite::data_parallel(workers, adamw(), 6));
  CHECK(model_after({.staleness = 0}, 6) == sync);
  auto out = ps_suite::train(mpi_world(), 1, adamw(), {.staleness = 2}, 20, ps_suite::stragglers);
  for (std::size_t t = 0; t < out.versions.size(); ++t) {
    CHECK(out.versions[t] >= static_cast<std::int64_t>(t) - 2);
    CHECK(out.versions[t] <= static_cast<std::int64_t>(t));
  }
}

int main(int argc, char** argv) { return test_support::mpi_doctest_main(argc, argv); }
