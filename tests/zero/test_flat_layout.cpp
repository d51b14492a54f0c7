// flat_layout: layers without tensors fall in exactly one bucket (issue 17: a layer pointing at a
// bucket that did not cover it corrupted the heap), bucket sizes, and tensor handles.
#include <doctest/doctest.h>

#include <array>
#include <utility>

#include "trident/model/flat_layout.hpp"

TEST_CASE("flat_layout: layers without tensors fall in the bucket of the next layer that has some") {
  trident::model_spec first_empty;  // a first layer without tensors, then a layer larger than the cap
  first_empty.add("big", {100}, 1).add("tail", {8}, 2);
  const trident::flat_layout a(first_empty, 2, 30, 30);
  REQUIRE(a.buckets().size() == 2);
  CHECK(a.layers() == 3);
  CHECK(a.buckets()[0].first_layer == 0);
  CHECK(a.buckets()[0].last_layer == 1);
  CHECK(a.bucket_of_layer(0) == 0);
  CHECK(a.layer_elements(0) == 0);
  CHECK(a.layer_elements(1) == 100);
  trident::model_spec late;  // first tensors on layer 2, small buckets
  late.add("a", {24}, 2).add("b", {24}, 3).add("c", {24}, 4).add("d", {4}, 7);
  const trident::flat_layout b(late, 3, 30, 30);
  int expect_first = 0;
  for (std::size_t k = 0; k < b.buckets().size(); ++k) {
    const auto& bk = b.buckets()[k];
    CHECK(bk.first_layer == expect_first);  // contiguous, covering every layer once
    CHECK(bk.used > 0);
    CHECK(b.piece_size(k) * 3 == bk.size);
    for (int l = bk.first_layer; l <= bk.last_layer; ++l) CHECK(b.bucket_of_layer(l) == k);
    expect_first = bk.last_layer + 1;
  }
  CHECK(expect_first == late.layers());
  CHECK(b.bucket_of_layer(5) == b.bucket_of_layer(7));  // layers 5 and 6 join layer 7
  CHECK_THROWS_WITH_AS((void)b.bucket_of_layer(8), doctest::Contains("(8): not a layer of the model; expected 0..7"), trident::usage_error);
}

TEST_CASE("flat_layout: a bucket boundary keeps the layers on either side in different buckets") {
  trident::model_spec spec;  // everything fits one bucket of 1000 without the boundaries
  spec.add("emb", {8}, 0).add("h0", {8}, 1).add("h1", {8}, 2).add("h2", {8}, 3).add("head", {8}, 5);
  const trident::flat_layout together(spec, 2, 1000, 1000);
  CHECK(together.buckets().size() == 1);
  spec.bucket_boundary(1).bucket_boundary(3).bucket_boundary(5);
  CHECK(spec.boundary_before(3));
  CHECK_FALSE(spec.boundary_before(2));
  const trident::flat_layout apart(spec, 2, 1000, 1000);
  REQUIRE(apart.buckets().size() == 4);
  // Layer 4 has no tensors: it joins the next layer that has some, as without boundaries.
  const std::array<std::pair<int, int>, 4> want{{{0, 0}, {1, 2}, {3, 3}, {4, 5}}};
  for (std::size_t k = 0; k < 4; ++k) {
    CHECK(apart.buckets()[k].first_layer == want[k].first);
    CHECK(apart.buckets()[k].last_layer == want[k].second);
  }
  trident::model_spec empty_side;  // a boundary with only empty layers beyond it changes nothing
  empty_side.add("a", {8}, 0).add("b", {8}, 1).bucket_boundary(2);
  CHECK(trident::flat_layout(empty_side, 1, 1000, 1000).buckets().size() == 1);
  CHECK_THROWS_WITH_AS(spec.bucket_boundary(0), doctest::Contains("the layer must be >= 1"), trident::usage_error);
}

TEST_CASE("flat_layout: bucket sizes and the granule must be at least one element") {
  trident::model_spec late;
  late.add("a", {24}, 2);
  CHECK_THROWS_WITH_AS(trident::flat_layout(late, 2, 0, 30), doctest::Contains("got 0 (bucket_elements)"), trident::usage_error);
  CHECK_THROWS_WITH_AS(trident::flat_layout(late, 2, 30, 30, 0), doctest::Contains("granule must be at least one element, got 0"), trident::usage_error);
}

TEST_CASE("flat_layout: a handle is an index into its layout and its copies; any other layout refuses it") {
  trident::model_spec spec;
  spec.add("a", {24}, 2).add("b", {24}, 3).add("c", {24}, 4);
  const trident::flat_layout a(spec, 2, 30, 30), b(spec, 3, 30, 30);
  const auto h = b.handle("c");
  CHECK(b.at(h).offset == b.find("c").offset);
  CHECK(b.name(h) == "c");
  const trident::flat_layout copy = b;
  CHECK(copy.at(h).offset == b.find("c").offset);
  CHECK_THROWS_WITH_AS((void)a.at(h), doctest::Contains("comes from another layout"), trident::usage_error);
  CHECK_THROWS_WITH_AS((void)a.at(trident::tensor_handle{}), doctest::Contains("is empty"), trident::usage_error);
  CHECK_THROWS_WITH_AS((void)b.handle("nope"), doctest::Contains("no tensor named 'nope'"), trident::usage_error);
}
