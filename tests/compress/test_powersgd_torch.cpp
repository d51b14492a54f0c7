// compress::powersgd against PyTorch's own PowerSGD DDP hook (tests/fixtures/torch_powersgd.txt,
// recorded by scripts/reference/make_powersgd_fixture.py from torch's powerSGD_hook on two gloo
// processes): the same gradients on two thread ranks, step for step, give the buckets torch's
// hook returned. Four cases: rank 2 (Gram-Schmidt), rank 3 (QR), rank 1 without warm starts (a
// new start every step), rank 2 without error feedback; two plain all-reduces first
// (start_iter 2), then four compressed steps with warm starts and error feedback carried over.
// Only the random start of Q is trident's on both sides (the script hands trident's draw to the
// hook), so everything after it is PyTorch's arithmetic against ours.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "support/fixtures.hpp"
#include "trident/comm/local.hpp"
#include "trident/compress/powersgd.hpp"

namespace compress = trident::compress;

namespace {

// "a:16x12,b:12x1,..." -> the bucket's tensors, packed in order.
std::vector<compress::tensor_part> parts_of(const std::string& spec) {
  std::vector<compress::tensor_part> out;
  std::istringstream in(spec);
  std::string item;
  std::size_t offset = 0;
  while (std::getline(in, item, ',')) {
    const auto colon = item.find(':'), x = item.find('x');
    REQUIRE((colon != std::string::npos && x != std::string::npos));
    compress::tensor_part t{item.substr(0, colon), offset, std::stoul(item.substr(colon + 1, x - colon - 1)),
                            std::stoul(item.substr(x + 1))};
    offset += t.numel();
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

TEST_CASE("compress: PowerSGD reduces each step's bucket to what PyTorch's powerSGD_hook returned (fixture, 2 ranks)") {
  const auto records = test_support::read_fixture("torch_powersgd.txt");
  const auto input = std::find_if(records.begin(), records.end(), [](const auto& r) { return r.keyword == "gradients"; });
  REQUIRE(input != records.end());
  const auto parts = parts_of(input->text("tensors"));
  const std::size_t n = parts.back().offset + parts.back().numel();
  const int world = static_cast<int>(input->integer("world")), steps = static_cast<int>(input->integer("steps"));
  REQUIRE(world == 2);
  REQUIRE(input->lines.size() == static_cast<std::size_t>(world * steps));
  int cases = 0;
  for (const auto& r : records) {
    if (r.keyword != "powersgd") continue;
    ++cases;
    REQUIRE(r.lines.size() == static_cast<std::size_t>(steps));
    compress::powersgd_options o;
    o.rank = static_cast<std::size_t>(r.integer("rank"));
    o.start_iter = r.integer("start_iter");
    o.error_feedback = r.integer("error_feedback") != 0;
    o.warm_start = r.integer("warm_start") != 0;
    o.min_compression_rate = r.number("min_compression_rate");
    o.seed = static_cast<std::uint64_t>(r.integer("seed"));
    // Rank 0's results (both ranks' are compared: the reduction leaves them equal).
    const auto got = trident::local_world::run(world, [&](trident::local_comm& comm) {
      compress::powersgd psgd(o);
      std::vector<std::vector<float>> out;
      for (int s = 0; s < steps; ++s) {
        const auto row = input->row(static_cast<std::size_t>(world * s + comm.rank()));
        REQUIRE(row.size() == n);
        std::vector<float> data(row.begin(), row.end());
        psgd.all_reduce(comm, compress::bucket_view<float, trident::host_space>{
                                  .index = 0, .data = data, .tensors = parts, .op = trident::reduce_op::avg});
        out.push_back(std::move(data));
      }
      return out;
    });
    double worst = 0;
    for (int s = 0; s < steps; ++s) {
      const auto want = r.row(static_cast<std::size_t>(s));
      REQUIRE(want.size() == n);
      for (std::size_t i = 0; i < n; ++i) {
        INFO("case ", r.text("name"), ", step ", s + 1, ", element ", i, ": trident ", got[0][s][i], ", torch ", want[i]);
        CHECK(got[0][s][i] == got[1][s][i]);
        const double diff = std::abs(got[0][s][i] - want[i]);
        CHECK(diff <= 1e-5 * (1.0 + std::abs(want[i])));
        worst = std::max(worst, diff / (1.0 + std::abs(want[i])));
      }
    }
    std::printf("powersgd vs torch, case %s: largest difference %.3g (relative to 1 + |x|)\n", r.text("name").c_str(), worst);
  }
  CHECK(cases == 4);
}
