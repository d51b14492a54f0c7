// The one sharding rule (model/sharding.hpp): parts partition the extent in order, padding is
// what the rule says, and flat_layout's buckets and sharded<T> are that rule, not copies of it.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <span>
#include <vector>
#include <random>

#include "trident/model/flat_layout.hpp"
#include "trident/model/sharding.hpp"

using trident::sharding;

TEST_CASE("sharding: a padded 1-D split is ZeRO's rule") {
  const auto s = sharding::split({10}, 0, 4);
  CHECK(s.is_split());
  CHECK(s.parts() == 4);
  CHECK(s.extent() == 10);
  CHECK(s.part_extent() == 3);
  CHECK(s.padded_extent() == 12);
  CHECK(s.padding() == 2);
  CHECK(s.local_numel() == 3);
  CHECK(s.owned(0) == trident::index_range{0, 3});
  CHECK(s.owned(3) == trident::index_range{9, 10});
  CHECK(s.slice(3) == trident::index_range{9, 12});
  CHECK(s.owner(9) == 3);
  CHECK(s.owner(2) == 0);
  // A granule pads to whole multiples of parts x granule.
  const auto g = sharding::split({10}, 0, 4, 16);
  CHECK(g.padded_extent() == 64);
  CHECK(g.part_extent() == 16);
  CHECK(g.owned(1) == trident::index_range{10, 10});  // nothing real: all padding
  CHECK(g.owned(1).empty());
}

TEST_CASE("sharding: exact splits of matrices (tensor parallelism's rule)") {
  const auto rows = sharding::split_exact({1024, 768}, 0, 4, "fc1.weight");
  CHECK(rows.local_shape() == std::vector<std::size_t>{256, 768});
  CHECK(rows.local_numel() == 256 * 768);
  CHECK(rows.padding() == 0);
  CHECK(rows.owned(2) == trident::index_range{512, 768});
  const auto cols = sharding::split_exact({1024, 768}, 1, 4, "fc2.weight");
  CHECK(cols.local_shape() == std::vector<std::size_t>{1024, 192});
  CHECK(cols.padded_numel() == 1024 * 768);
  const auto rep = sharding::replicated({3, 5});
  CHECK_FALSE(rep.is_split());
  CHECK(rep.local_shape() == std::vector<std::size_t>{3, 5});
  CHECK(rep.local_numel() == 15);
  CHECK(rep.padding() == 0);
  CHECK(rep.owned(0) == trident::index_range{0, 15});
}

TEST_CASE("sharding: bad input is a usage_error that names what was expected") {
  CHECK_THROWS_WITH_AS(sharding::split_exact({1000, 64}, 0, 3, "lm_head.weight"),
                       doctest::Contains("lm_head.weight: 1000 elements along axis 0 do not divide into 3 equal parts"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(sharding::split({4, 4}, 2, 2), doctest::Contains("axis 2 is not an axis of a 2-dimensional shape"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(sharding::split({}, 0, 2), doctest::Contains("axis 0 is not an axis of a 0-dimensional shape"),
                       trident::usage_error);  // a scalar has no axis to split
  CHECK_THROWS_WITH_AS(sharding::split({4}, 0, 0), doctest::Contains("expected at least one part, got 0"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(sharding::split({4}, 0, 2, 0), doctest::Contains("granule must be at least one"),
                       trident::usage_error);
  // Sizes whose padding would wrap std::size_t are refused, not wrapped to a zero quantum.
  CHECK_THROWS_AS(sharding::split({~std::size_t{0}}, 0, 1 << 30, std::size_t{1} << 40), trident::usage_error);
  CHECK_THROWS_AS(sharding::split({~std::size_t{0} - 1}, 0, 4), trident::usage_error);  // 2^64 - 2 up to 2^64
  // A shape whose element count wraps (2^62 x 8 was 0 elements), and one whose padding does.
  CHECK_THROWS_WITH_AS(sharding::replicated({std::size_t{1} << 62, 8}), doctest::Contains("more elements than std::size_t counts"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(sharding::split_exact({8, std::size_t{1} << 62}, 0, 2), doctest::Contains("more elements than"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(sharding::split({3, std::size_t{1} << 62}, 0, 4), doctest::Contains("overflow std::size_t in all"),
                       trident::usage_error);
  const auto s = sharding::split({10}, 0, 4);
  CHECK_THROWS_WITH_AS((void)s.owned(4), doctest::Contains("not a part; expected 0..3"), trident::usage_error);
  CHECK_THROWS_WITH_AS((void)s.owner(10), doctest::Contains("the split axis has 10 elements"), trident::usage_error);
}

TEST_CASE("sharding: random shapes: the parts cover the extent exactly once, in order") {
  std::mt19937_64 rng(20261124);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::size_t dims = 1 + rng() % 3;
    std::vector<std::size_t> shape(dims);
    for (auto& d : shape) d = 1 + rng() % 40;
    const std::size_t axis = rng() % dims;
    const int parts = 1 + static_cast<int>(rng() % 9);
    const std::size_t granule = 1 + rng() % 5;
    const auto s = sharding::split(shape, axis, parts, granule);
    CAPTURE(trial);
    CHECK(s.padded_extent() % (static_cast<std::size_t>(parts) * granule) == 0);
    CHECK(s.padded_extent() >= s.extent());
    CHECK(s.padded_extent() - s.extent() < static_cast<std::size_t>(parts) * granule);
    CHECK(s.local_numel() * static_cast<std::size_t>(parts) == s.padded_numel());
    CHECK(s.padded_numel() - s.padding() == s.numel());
    std::size_t next = 0;
    for (int p = 0; p < parts; ++p) {
      const auto o = s.owned(p);
      CHECK(o.begin == std::min(next, s.extent()));
      CHECK(o.size() <= s.part_extent());
      for (std::size_t i = o.begin; i < o.end; ++i) REQUIRE(s.owner(i) == p);
      next = s.slice(p).end;
    }
    CHECK(next == s.padded_extent());
  }
}

TEST_CASE("sharding: flat_layout's buckets and sharded<T> follow the same rule") {
  trident::model_spec spec;
  spec.add("a", {37}, 0).add("b", {5, 7}, 1).add("c", {100}, 2).add("d", {3}, 3);
  for (int ranks : {1, 2, 3, 4, 7}) {
    const trident::flat_layout layout(spec, ranks, 64, 40, 4);
    for (std::size_t b = 0; b < layout.buckets().size(); ++b) {
      const auto& k = layout.buckets()[b];
      CAPTURE(ranks);
      CAPTURE(b);
      CHECK(k.split == sharding::split({k.used}, 0, ranks, 4));
      CHECK(k.size == k.split.padded_extent());
      CHECK(layout.piece_size(b) == k.split.part_extent());
      for (int r = 0; r < ranks; ++r) CHECK(layout.piece_begin(b, r) == k.begin + k.split.slice(r).begin);
    }
    const trident::sharded<float> w(spec.parameters(), ranks - 1, ranks);
    CHECK(w.split() == sharding::split({spec.parameters()}, 0, ranks));
    CHECK(w.shard_size() == w.split().part_extent());
    CHECK(w.padded_size() == w.split().padded_extent());
    CHECK(w.shard_begin() == w.split().slice(ranks - 1).begin);
  }
}

TEST_CASE("sharding: a model_spec tensor registered by its global sharding knows what it is a part of") {
  trident::model_spec spec;
  const auto fc1 = sharding::split_exact({12, 5}, 0, 3, "fc1.weight");
  spec.add("fc1.weight", fc1, 2, 0).add("ln.weight", sharding::replicated({5}), 2, 1).add("head", {4, 5}, 2);
  const auto& t = spec.tensors();
  CHECK(t[0].shape == std::vector<std::size_t>{4, 5});
  CHECK(t[0].numel == 20);
  CHECK(t[0].copy == trident::model_copy::shard);
  CHECK(t[0].global == fc1);
  CHECK(t[0].part == 2);
  CHECK(t[1].copy == trident::model_copy::replica);  // a replicated sharding is a replica
  CHECK(t[1].global == sharding::replicated({5}));
  CHECK(t[2].global == sharding::replicated({4, 5}));  // by shape: the whole tensor, part 0
  CHECK(t[2].part == 0);
  const trident::flat_layout layout(spec, 2, 64, 64);
  CHECK(layout.spec_at(0).global == fc1);
  CHECK(layout.spec_at(2).name == "head");
  CHECK_THROWS_WITH_AS(spec.add("fc2.weight", fc1, 3, 3), doctest::Contains("part 3 of a tensor split into 3 parts; expected 0..2"),
                       trident::usage_error);
}

TEST_CASE("sharding: take_part cuts a part out of the global array, put_part puts it back") {
  // A [3, 4] matrix split by columns into 2: rank 1 holds columns 2..3 of every row.
  std::vector<float> global(12);
  std::iota(global.begin(), global.end(), 0.0f);
  const auto columns = sharding::split_exact({3, 4}, 1, 2, "w");
  CHECK(columns.outer() == 3);
  CHECK(columns.inner() == 1);
  std::vector<float> part(columns.local_numel());
  trident::take_part<float>(columns, 1, global, part);
  CHECK(part == std::vector<float>{2, 3, 6, 7, 10, 11});
  CHECK_THROWS_AS(trident::take_part<float>(columns, 1, global, std::span<float>(part.data(), 5)), trident::usage_error);

  // Random shapes, axes and part counts, padded splits included: every part put back once
  // rebuilds the array, and a part's padding is zero.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::size_t> shape(1 + rng() % 3);
    for (auto& d : shape) d = 1 + rng() % 6;
    const std::size_t axis = rng() % shape.size();
    const int parts = 1 + static_cast<int>(rng() % 5);
    const auto s = sharding::split(shape, axis, parts, 1 + rng() % 2);
    std::vector<float> whole(s.numel());
    std::iota(whole.begin(), whole.end(), 1.0f);
    std::vector<float> rebuilt(s.numel(), 0.0f);
    std::size_t real = 0;
    for (int p = 0; p < parts; ++p) {
      std::vector<float> local(s.local_numel(), -1.0f);
      trident::take_part<float>(s, p, whole, local);
      const auto zeros = static_cast<std::size_t>(std::count(local.begin(), local.end(), 0.0f));
      CHECK(zeros == s.local_numel() - s.owned(p).size() * s.outer() * s.inner());  // the values start at 1
      real += s.local_numel() - zeros;
      trident::put_part<float>(s, p, local, rebuilt);
    }
    CAPTURE(trial);
    CHECK(real == s.numel());
    CHECK(rebuilt == whole);
  }
}
