// Gradient compression over MPI ranks (mpirun -np 4): each reducer through zero_optimizer on a
// simulated network over MPI trains bit for bit as on thread ranks (the network adapter runs
// the same reduction arithmetic over either backend), ZeRO 0 and 2.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "compress/compress_training.hpp"
#include "support/mpi_main.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/mpi.hpp"
#include "trident/compress/cast.hpp"
#include "trident/compress/onebit.hpp"
#include "trident/compress/powersgd.hpp"

namespace compress = trident::compress;
using test_support::mpi_world;

namespace {

trident::cluster_map network(int n) { return trident::cluster_map::blocks(n, n % 2 == 0 ? n / 2 : 1, {}, {.latency = 0.01}); }

template <int Stage, class Make>
void same_as_threads(Make make) {
  auto& world = mpi_world();
  const int n = world.size();
  trident::optim::sgd opt;
  opt.opt.lr = 0.05f;
  opt.opt.momentum = 0.9f;
  trident::slow_link_comm<trident::mpi_comm> net(world.split(0, world.rank()), network(n));
  const auto mpi = compress_training::train<Stage>(net, opt, 8, make());
  const auto threads = trident::local_world::run(n, [&](trident::local_comm& c) {
    trident::slow_link_comm<trident::local_comm> local(c.split(0, c.rank()), network(n));
    return compress_training::train<Stage>(local, opt, 8, make());
  })[static_cast<std::size_t>(world.rank())];
  CHECK(mpi.parameters == threads.parameters);
  CHECK(mpi.losses == threads.losses);
  CHECK(mpi.gradient_bytes == threads.gradient_bytes);
}

}  // namespace

TEST_CASE("compress over MPI: every reducer trains bitwise as on thread ranks, ZeRO 0 and 2") {
  compress::powersgd_options p;
  p.rank = 2;
  p.start_iter = 2;
  compress::onebit_options b;
  b.warmup = 2;
  auto powersgd = [=] { return std::make_shared<compress::powersgd>(p); };
  auto onebit = [=] { return std::make_shared<compress::onebit>(b); };
  auto bf16 = [] { return std::make_shared<compress::cast<trident::bf16>>(); };
  same_as_threads<0>(powersgd);
  same_as_threads<0>(onebit);
  same_as_threads<0>(bf16);
  same_as_threads<2>(powersgd);
  same_as_threads<2>(onebit);
}

int main(int argc, char** argv) { return test_support::mpi_doctest_main(argc, argv); }
