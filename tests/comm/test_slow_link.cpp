// The simulated network (comm/slow_link.hpp) over thread ranks: the shared collective suite on
// every group size through the adapter, with both of its algorithms; then bytes on each link,
// the simulated clock, the hierarchical all-reduce and bad cluster maps.
#include <doctest/doctest.h>

#include "comm/collective_suite.hpp"
#include "comm/slow_link_suite.hpp"
#include "trident/comm/local.hpp"

using trident::local_comm;
using trident::local_world;
using trident::slow_link_comm;

namespace {

// A two-cluster network (a slow link between them) over n = 1..8 thread ranks.
template <class Body>
void on_every_size(trident::wire_algorithm algorithm, Body body) {
  for (int n = 1; n <= 8; ++n) {
    CAPTURE(n);
    local_world::run(n, [&](local_comm& comm) {
      auto map = trident::cluster_map::blocks(n, 1, {.latency = 1e-6, .bandwidth = 1e10}, {.latency = 0.1, .bandwidth = 1e8});
      for (int r = 0; r < n; ++r) map.cluster_of[static_cast<std::size_t>(r)] = 2 * r < n ? 0 : 1;
      slow_link_comm<local_comm> net(comm.split(0, comm.rank()), map, {.algorithm = algorithm});
      body(net);
    });
  }
}

template <class Body>
void both(Body body) {
  for (auto a : {trident::wire_algorithm::ring, trident::wire_algorithm::direct}) {
    CAPTURE(slow_link_suite::name_of(a));
    on_every_size(a, body);
  }
}

template <class Body>
void plain(Body body) {
  for (int n = 1; n <= 8; ++n) {
    CAPTURE(n);
    local_world::run(n, [&](local_comm& comm) { body(comm); });
  }
}

}  // namespace

TEST_CASE("slow_link: all_reduce, every type x op x size, ring and direct") { both([](auto& c) { suite::all_reduce(c); }); }
TEST_CASE("slow_link: results identical on every rank and run to run") { both([](auto& c) { suite::deterministic(c); }); }
TEST_CASE("slow_link: reduce_scatter, all_gather, broadcast, reduce, all_to_all") {
  both([](auto& c) {
    suite::reduce_scatter(c);
    suite::all_gather(c);
    suite::broadcast(c);
    suite::reduce(c);
    suite::all_to_all(c);
  });
}
TEST_CASE("slow_link: point to point, asynchronous forms, split, bad input, avg, NaN, traffic") {
  both([](auto& c) {
    suite::point_to_point(c);
    suite::asynchronous(c);
    suite::split(c);
    suite::bad_input(c);
    suite::average_without_overflow(c);
    suite::max_min_with_nan(c);
    suite::traffic(c);
  });
}
TEST_CASE("slow_link: bytes on each link are the algorithm's; hierarchical sends 1/k of flat direct's across") {
  plain([](auto& c) { slow_link_suite::wire_bytes(c); });
}
TEST_CASE("slow_link: hierarchical all-reduce equals all_reduce (equal, uneven and one-rank clusters)") {
  plain([](auto& c) { slow_link_suite::hierarchical_equals_flat(c); });
}
TEST_CASE("slow_link: the simulated clock (latency, bandwidth, queueing, barrier, compute)") {
  plain([](auto& c) {
    slow_link_suite::clock(c);
    slow_link_suite::compute_counts(c);
  });
}
TEST_CASE("slow_link: bad cluster maps are usage errors naming them") {
  plain([](auto& c) { slow_link_suite::bad_maps(c); });
}
