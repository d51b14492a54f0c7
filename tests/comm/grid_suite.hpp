#pragma once
// process_grid on any backend: coordinates, axis groups and their collectives checked on every
// rank against an independent computation of the layout.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <vector>

#include "comm/collective_suite.hpp"
#include "trident/comm/process_grid.hpp"

namespace suite {

//! Every (tensor, pipeline) factorisation of the world size, in the default and a custom order.
template <class C>
void grid(C& world) {
  using trident::grid_axis;
  const int n = world.size();
  const trident::grid_order orders[] = {trident::grid_order::megatron(),
                                        {{grid_axis::pipeline, grid_axis::tensor, grid_axis::data}}};
  for (const auto& order : orders)
    for (int t = 1; t <= n; ++t)
      for (int p = 1; t * p <= n; ++p) {
        if (n % (t * p) != 0) continue;
        const int d = n / (t * p);
        trident::process_grid<C> g(world, t, p, order);
        INFO("world ", n, " tensor ", t, " pipeline ", p, " order[0] ", static_cast<int>(order.fastest_first[0]));
        CHECK(g.tensor_size() == t);
        CHECK(g.pipeline_size() == p);
        CHECK(g.data_size() == d);
        // Independent layout: decompose the rank by the order, fastest first.
        std::array<int, 3> sizes{t, d, p};
        std::array<int, 3> want{};
        int rest = world.rank();
        for (grid_axis a : order.fastest_first) {
          want[static_cast<std::size_t>(a)] = rest % sizes[static_cast<std::size_t>(a)];
          rest /= sizes[static_cast<std::size_t>(a)];
        }
        for (grid_axis a : {grid_axis::tensor, grid_axis::data, grid_axis::pipeline}) {
          CHECK(g.coordinate(a) == want[static_cast<std::size_t>(a)]);
          CHECK(g.comm(a).size() == sizes[static_cast<std::size_t>(a)]);
          CHECK(g.comm(a).rank() == want[static_cast<std::size_t>(a)]);
          // The group's members are the ranks agreeing on the other two coordinates: sum them.
          std::int64_t members = 0;
          for (int q = 0; q < n; ++q) {
            const auto c = g.coordinates_of(q);
            bool same = true;
            for (grid_axis b : {grid_axis::tensor, grid_axis::data, grid_axis::pipeline})
              if (b != a && c[static_cast<std::size_t>(b)] != want[static_cast<std::size_t>(b)]) same = false;
            if (same) members += q;
          }
          auto x = upload<C>(std::vector<std::int64_t>{world.rank()});
          g.comm(a).all_reduce(x);
          CHECK(download(g.comm(a), x)[0] == members);
        }
        CHECK(g.rank_of(g.coordinates_of(world.rank())) == world.rank());
      }
  // A world size that does not factor: the same usage_error on every rank, naming the sizes.
  if (n > 1) {
    CHECK_THROWS_WITH_AS((trident::process_grid<C>(world, n + 1, 1)), doctest::Contains("is not divisible by tensor size"),
                         trident::usage_error);
  }
  CHECK_THROWS_AS((trident::process_grid<C>(world, 0, 1)), trident::usage_error);
  // Sizes whose product overflows an int: a usage_error, not a division by zero (SIGFPE).
  CHECK_THROWS_WITH_AS((trident::process_grid<C>(world, 65536, 65536)), doctest::Contains("4294967296"),
                       trident::usage_error);
  // Ranks that disagree on the sizes or the order (each choice valid on its own): the same
  // usage_error everywhere, instead of a grid that contradicts its own communicators.
  if (n > 1) {
    CHECK_THROWS_WITH_AS((trident::process_grid<C>(world, world.rank() == 0 ? 1 : n, 1)),
                         doctest::Contains("ranks disagree on the tensor size (from 1 to"), trident::usage_error);
    const trident::grid_order swapped{{trident::grid_axis::data, trident::grid_axis::tensor, trident::grid_axis::pipeline}};
    CHECK_THROWS_WITH_AS((trident::process_grid<C>(world, 1, 1, world.rank() == n - 1 ? swapped : trident::grid_order{})),
                         doctest::Contains("ranks disagree on the order[0]"), trident::usage_error);
  }
  world.barrier();
}

}  // namespace suite
