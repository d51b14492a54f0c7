// The simulated network and the hierarchical all-reduce over MPI ranks (mpirun -np 4): the
// adapter's collectives against the suite, bytes per link, the clock, bad maps.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "comm/collective_suite.hpp"
#include "comm/slow_link_suite.hpp"
#include "support/mpi_main.hpp"
#include "trident/comm/mpi.hpp"

using test_support::mpi_world;

namespace {

template <class Body>
void over_network(Body body) {
  auto& world = mpi_world();
  const int n = world.size();
  for (auto a : {trident::wire_algorithm::ring, trident::wire_algorithm::direct}) {
    CAPTURE(slow_link_suite::name_of(a));
    trident::slow_link_comm<trident::mpi_comm> net(world.split(0, world.rank()),
                                                   trident::cluster_map::blocks(n, n % 2 == 0 ? n / 2 : 1, {}, {.latency = 0.1}),
                                                   {.algorithm = a});
    body(net);
  }
}

}  // namespace

TEST_CASE("slow_link over MPI: the collective suite through the adapter") {
  over_network([](auto& c) {
    suite::all_reduce(c);
    suite::reduce_scatter(c);
    suite::all_gather(c);
    suite::broadcast(c);
    suite::reduce(c);
    suite::all_to_all(c);
    suite::point_to_point(c);
    suite::split(c);
  });
}
TEST_CASE("slow_link over MPI: bytes per link, hierarchical all-reduce, clock, bad maps") {
  slow_link_suite::wire_bytes(mpi_world());
  slow_link_suite::hierarchical_equals_flat(mpi_world());
  slow_link_suite::clock(mpi_world());
  slow_link_suite::compute_counts(mpi_world());
  slow_link_suite::bad_maps(mpi_world());
}

int main(int argc, char** argv) { return test_support::mpi_doctest_main(argc, argv); }
