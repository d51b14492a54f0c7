#pragma once
// The simulated network (comm/slow_link.hpp) and the hierarchical all-reduce
// (comm/hierarchical.hpp), one body per behaviour for any host backend: each function runs on
// every rank of `world` together and wraps a split of it. Inputs are small integers, so sums are
// exact in any order and results are compared bit for bit with the backend's own all_reduce.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <numeric>
#include <string>
#include <vector>

#include "trident/comm/hierarchical.hpp"
#include "trident/core/half.hpp"
#include "trident/comm/slow_link.hpp"

namespace slow_link_suite {

using trident::cluster_map;
using trident::link;
using trident::reduce_op;
using trident::slow_link_options;
using trident::wire_algorithm;

inline const char* name_of(wire_algorithm a) { return a == wire_algorithm::ring ? "ring" : "direct"; }

template <class W>
trident::slow_link_comm<W> wrap(W& world, cluster_map map, slow_link_options o = {}) {
  return trident::slow_link_comm<W>(world.split(0, world.rank()), std::move(map), o);
}

//! Rank r's input: small integers, different per rank and element.
inline std::vector<float> input(int r, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((static_cast<long long>(i) * 7 + r * 3) % 11 - 5);
  return v;
}

template <class Net>
std::uint64_t sum_over_ranks(Net& net, std::uint64_t mine) {
  std::vector<std::uint64_t> v{mine};
  net.inner().all_reduce(v);
  return v[0];
}

//! Bytes sent, per rank and over the slow link, are the algorithm's: ring 2(n-1) chunks per
//! rank, two of the ring's edges crossing; direct 2(n-1) chunks per rank, those to the other
//! cluster crossing; the hierarchical scheme sends 1/k of the data per rank across, so 2N bytes
//! cross in all, 1/k of flat direct's and k/(2k-1) of flat ring's; with the ranks placed
//! round-robin over the clusters, 1/(2k-1) of flat ring's. Results equal the backend's.
template <class W>
void wire_bytes(W& world) {
  const int n = world.size();
  if (n < 2 || n % 2 != 0) return;
  const int k = n / 2;
  const std::size_t count = 240 * static_cast<std::size_t>(n);  // divides into n and k chunks
  const std::uint64_t bytes = count * sizeof(float), chunk = bytes / static_cast<std::uint64_t>(n);
  const auto map = cluster_map::blocks(n, k, {}, {.latency = 0.05, .bandwidth = 1e6});
  std::vector<float> expected = input(world.rank(), count);
  world.all_reduce(expected);
  std::uint64_t flat_ring = 0, flat_direct = 0;
  for (wire_algorithm a : {wire_algorithm::ring, wire_algorithm::direct}) {
    INFO(n, " ranks, ", name_of(a));
    auto net = wrap(world, map, {.algorithm = a});
    auto v = input(world.rank(), count);
    net.all_reduce(v);
    CHECK(v == expected);
    const auto w = net.wire();
    CHECK(w.total().messages == 2u * static_cast<unsigned>(n - 1));
    CHECK(w.total().bytes == 2 * static_cast<std::uint64_t>(n - 1) * chunk);
    const std::uint64_t across = sum_over_ranks(net, w.across.bytes);
    if (a == wire_algorithm::ring) {
      // Ranks k-1 and n-1 send to the other cluster at every step.
      CHECK(w.across.bytes == (net.rank() == k - 1 || net.rank() == n - 1 ? w.total().bytes : 0));
      CHECK(across == 2 * 2 * static_cast<std::uint64_t>(n - 1) * chunk);
      flat_ring = across;
    } else {
      CHECK(w.across.bytes == 2 * static_cast<std::uint64_t>(k) * chunk);
      CHECK(across == static_cast<std::uint64_t>(n) * 2 * static_cast<std::uint64_t>(k) * chunk);
      flat_direct = across;
    }
  }
  // The hierarchical all-reduce over the same network.
  auto net = wrap(world, map);
  trident::hierarchical_all_reduce<decltype(net)> h(net, map.cluster_of);
  CHECK(h.equal_clusters());
  net.reset_wire();
  auto v = input(world.rank(), count);
  h(v);
  CHECK(v == expected);
  const std::uint64_t across = sum_over_ranks(net, net.wire().across.bytes);
  CHECK(net.wire().across.bytes == bytes / static_cast<std::uint64_t>(k));  // this rank's 1/k, once
  CHECK(across == 2 * bytes);
  INFO("across the slow link: hierarchical ", across, " B, flat direct ", flat_direct, " B, flat ring ", flat_ring, " B");
  CHECK(across * static_cast<std::uint64_t>(k) == flat_direct);
  CHECK(across * static_cast<std::uint64_t>(2 * k - 1) == flat_ring * static_cast<std::uint64_t>(k));

  // Ranks placed round-robin over the two clusters (mpirun --map-by node's default placement):
  // every edge of the flat ring crosses, 2(2k-1)N bytes, so the hierarchical all-reduce (over the
  // same map: its levels follow the clusters, not the rank order) sends 1/(2k-1) of the flat
  // ring's bytes across, within 1/k; and 1/k of flat direct's again.
  cluster_map alternating{std::vector<int>(static_cast<std::size_t>(n)), {}, {.latency = 0.05, .bandwidth = 1e6}};
  for (int r = 0; r < n; ++r) alternating.cluster_of[static_cast<std::size_t>(r)] = r % 2;
  std::uint64_t alt_ring = 0, alt_direct = 0;
  for (wire_algorithm a : {wire_algorithm::ring, wire_algorithm::direct}) {
    INFO(n, " ranks round-robin over 2 clusters, ", name_of(a));
    auto flat = wrap(world, alternating, {.algorithm = a});
    auto x = input(world.rank(), count);
    flat.all_reduce(x);
    CHECK(x == expected);
    (a == wire_algorithm::ring ? alt_ring : alt_direct) = sum_over_ranks(flat, flat.wire().across.bytes);
  }
  CHECK(alt_ring == static_cast<std::uint64_t>(n) * 2 * static_cast<std::uint64_t>(n - 1) * chunk);  // every edge crosses
  auto rr = wrap(world, alternating);
  trident::hierarchical_all_reduce<decltype(rr)> hr(rr, alternating.cluster_of);
  rr.reset_wire();
  auto y = input(world.rank(), count);
  hr(y);
  CHECK(y == expected);
  const std::uint64_t rr_across = sum_over_ranks(rr, rr.wire().across.bytes);
  INFO("round-robin placement, across the slow link: hierarchical ", rr_across, " B, flat ring ", alt_ring, " B, flat direct ",
       alt_direct, " B");
  CHECK(rr_across == 2 * bytes);
  CHECK(rr_across * static_cast<std::uint64_t>(2 * k - 1) == alt_ring);
  CHECK(rr_across * static_cast<std::uint64_t>(k) <= alt_ring);
  CHECK(rr_across * static_cast<std::uint64_t>(k) == alt_direct);
}

//! The hierarchical all-reduce equals all_reduce on the plain backend: equal clusters (sizes
//! that divide and that do not), clusters of different sizes (leaders), every op it offers.
template <class W>
void hierarchical_equals_flat(W& world) {
  const int n = world.size();
  std::vector<std::vector<int>> maps;
  maps.push_back(std::vector<int>(static_cast<std::size_t>(n), 0));  // one cluster
  if (n % 2 == 0) maps.push_back(cluster_map::blocks(n, n / 2, {}, {}).cluster_of);
  std::vector<int> uneven(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) uneven[static_cast<std::size_t>(r)] = r == 0 ? 0 : 1 + (r % 2);  // {0}, odd, even
  if (n >= 3) maps.push_back(uneven);
  std::vector<int> each(static_cast<std::size_t>(n));
  std::iota(each.begin(), each.end(), 0);
  maps.push_back(each);  // a cluster per rank
  // fp16 averages of large values on clusters of different sizes: scaled before the sum, as
  // the backends' own avg, so nothing overflows.
  if (n >= 3) {
    trident::hierarchical_all_reduce<W> h(world, uneven);
    std::vector<trident::fp16> v(5, trident::fp16(30000.0f));
    h(v, reduce_op::avg);
    for (auto x : v) CHECK(static_cast<float>(x) == doctest::Approx(30000.0f).epsilon(1e-2));
  }
  for (const auto& m : maps) {
    trident::hierarchical_all_reduce<W> h(world, m);
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max, reduce_op::min}) {
        INFO(n, " ranks, clusters of rank 0..: ", m[0], " ", m.back(), ", ", count, " elements, ", trident::name_of(op));
        auto expected = input(world.rank(), count);
        world.all_reduce(expected, op);
        auto v = input(world.rank(), count);
        h(v, op);
        if (op == reduce_op::avg) {
          // The levels may divide in another order: within a rounding.
          for (std::size_t i = 0; i < count; ++i) CHECK(v[i] == doctest::Approx(expected[i]).epsilon(1e-6));
        } else {
          CHECK(v == expected);
        }
      }
    }
  }
}

//! Time with count_compute off: a message of b bytes over a link takes latency + b/bandwidth;
//! two to the same peer queue on the link; a ring all_reduce over equal links takes 2(n-1)
//! steps of one chunk, a direct one two; a barrier brings every clock to the latest.
template <class W>
void clock(W& world) {
  const int n = world.size();
  const link l{.latency = 0.01, .bandwidth = 1e6};
  const auto map = cluster_map::blocks(n, 1, l, l);  // every link the same
  {
    auto net = wrap(world, map, {.count_compute = false});
    CHECK(net.now() == 0.0);
    if (n >= 2) {
      std::vector<float> a(2500, 1.0f), b(2500, 2.0f);  // 10 kB each: 0.01 s per message
      using op = trident::p2p_op<trident::host_space>;
      if (net.rank() == 0) net.exchange({op::send(a, 1), op::send(b, 1)});
      if (net.rank() == 1) {
        net.exchange({op::recv(a, 0), op::recv(b, 0)});
        CHECK(net.now() == doctest::Approx(0.01 + 2 * 0.01));  // the second waited for the first
      }
      if (net.rank() > 1) CHECK(net.now() == 0.0);
    }
  }
  for (wire_algorithm a : {wire_algorithm::ring, wire_algorithm::direct}) {
    INFO(n, " ranks, ", name_of(a));
    auto net = wrap(world, map, {.algorithm = a, .count_compute = false});
    std::vector<float> v(1000 * static_cast<std::size_t>(n), 1.0f);
    net.all_reduce(v);
    const double step = l.seconds(4000);
    const double expected = n == 1 ? 0.0 : a == wire_algorithm::ring ? 2.0 * (n - 1) * step : 2.0 * step;
    CHECK(net.now() == doctest::Approx(expected));
    // Asynchronous: the rank works on while it is in flight; wait() catches up.
    const double t0 = net.now(), comm = expected;
    auto r = net.all_reduce_async(v);
    CHECK(net.now() == t0);
    net.advance(10.0);  // longer than the all-reduce
    r.wait();
    CHECK(net.now() == doctest::Approx(t0 + 10.0));
    auto r2 = net.all_reduce_async(v);
    net.advance(comm / 2);
    r2.wait();
    CHECK(net.now() == doctest::Approx(t0 + 10.0 + comm));  // half of it hidden behind the compute
    // Split: the same clock, the same counters.
    auto pair = net.split(net.rank() / 2, net.rank());
    const double before = net.now();
    pair.barrier();
    CHECK(net.now() >= before);
    const double t1 = net.now();  // the same on every rank here
    net.advance(0.5 * net.rank());
    net.barrier();
    CHECK(net.now() >= t1 + 0.5 * (n - 1));
    CHECK(net.now() <= t1 + 0.5 * (n - 1) + 2.0 * n * l.latency + 1.0);
  }
}

//! The rank's own CPU time is time: a busy loop of about 30 ms moves the clock by about that.
template <class W>
void compute_counts(W& world) {
  auto net = wrap(world, cluster_map::blocks(world.size(), 1, {}, {}));
  const double before = net.now();
  const double start = trident::detail::thread_cpu_seconds();
  volatile double x = 0;
  while (trident::detail::thread_cpu_seconds() - start < 0.03) x = x + std::sqrt(x + 1.0);
  const double spent = net.now() - before;
  CHECK(spent >= 0.03);
  CHECK(spent < 1.0);
  auto quiet = wrap(world, cluster_map::blocks(world.size(), 1, {}, {}), {.count_compute = false});
  const double q = quiet.now();
  while (trident::detail::thread_cpu_seconds() - start < 0.04) x = x + std::sqrt(x + 1.0);
  CHECK(quiet.now() == q);
}

//! Maps that do not cover the world, bad ids and bad links are usage errors naming them.
template <class W>
void bad_maps(W& world) {
  const int n = world.size();
  using trident::usage_error;
  const std::string too_many = "places " + std::to_string(n + 1) + " ranks; the communicator has " + std::to_string(n);
  CHECK_THROWS_WITH_AS(wrap(world, cluster_map{std::vector<int>(static_cast<std::size_t>(n) + 1, 0), {}, {}}),
                       doctest::Contains(too_many.c_str()), usage_error);
  std::vector<int> negative(static_cast<std::size_t>(n), 0);
  negative.back() = -1;
  CHECK_THROWS_WITH_AS(wrap(world, cluster_map{negative, {}, {}}), doctest::Contains("is in cluster -1"), usage_error);
  CHECK_THROWS_WITH_AS(wrap(world, cluster_map::blocks(n, 1, {}, {.latency = -1.0})), doctest::Contains("across link's latency"),
                       usage_error);
  CHECK_THROWS_WITH_AS(wrap(world, cluster_map::blocks(n, 1, {.bandwidth = 0.0}, {})), doctest::Contains("inside link's bandwidth"),
                       usage_error);
  CHECK_THROWS_WITH_AS(cluster_map::blocks(n, n + 1, {}, {}), doctest::Contains("do not split into clusters of"), usage_error);
  std::vector<int> short_map(static_cast<std::size_t>(n) - 1, 0);
  const std::string too_few = "places " + std::to_string(n - 1) + " ranks";
  CHECK_THROWS_WITH_AS(trident::hierarchical_all_reduce<W>(world, short_map), doctest::Contains(too_few.c_str()), usage_error);
}

}  // namespace slow_link_suite
