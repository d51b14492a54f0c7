// Checkpoints of the flagship GPT on thread ranks (issue 15): a run saved and resumed equals an
// uninterrupted one bitwise in the same layout (3-D: tensor, pipeline and data parallel, ZeRO-3),
// and a checkpoint saved in one grid layout continues in another (d = 4 ZeRO-3 -> t = 2, d = 2
// ZeRO-1; t = 2, p = 2, d = 2 -> t = 1, p = 4, d = 2) as training in the new layout from the
// start does, within 1e-6.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gpt/gpt_suite.hpp"
#include "trident/comm/local.hpp"

using trident::local_comm;
using trident::local_world;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const auto p = fs::temp_directory_path() / ("trident_gpt_ckpt_" + std::to_string(::getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<flagship::step_report> run(int world, const flagship::train_options& o) {
  std::vector<flagship::step_report> out;
  local_world::run(world, [&](local_comm& comm) {
    auto r = flagship::train(comm, o);
    if (comm.rank() == 0) out = std::move(r);
  });
  return out;
}

flagship::train_options layout(int d, int t, int p, int stage, int global_rows) {
  auto o = gpt_suite::small_options();
  o.tensor = t;
  o.pipeline = p;
  o.zero_stage = stage;
  o.accumulation = global_rows / (d * static_cast<int>(o.micro_batch));
  return o;
}

}  // namespace

TEST_CASE("gpt checkpoint: 10 steps, save, resume, 10 steps equals 20 steps bitwise (t = 2, p = 2, d = 2, ZeRO-3, threads)") {
  const auto straight_dir = fresh_dir("straight"), resumed_dir = fresh_dir("resumed");
  auto o = layout(2, 2, 2, 3, 8);
  o.save_every = 10;
  o.checkpoint_dir = straight_dir.string();
  const auto straight = run(8, o);
  REQUIRE(straight.size() == 20);

  o.checkpoint_dir = resumed_dir.string();
  o.steps = 10;
  const auto first = run(8, o);
  REQUIRE(first.size() == 10);
  o.steps = 20;
  o.resume = true;
  const auto second = run(8, o);
  REQUIRE(second.size() == 10);  // steps 11..20
  for (std::size_t s = 0; s < 10; ++s) {
    CAPTURE(s + 11);
    CHECK(second[s].step == straight[s + 10].step);
    CHECK(second[s].loss == straight[s + 10].loss);
    CHECK(second[s].grad_norm == straight[s + 10].grad_norm);
  }
  // Parameters, master weights and optimizer states at step 20: the same bytes, file by file.
  for (const auto& e : fs::directory_iterator(straight_dir / "step_00000020")) {
    CAPTURE(e.path().filename().string());
    CHECK(bytes_of(e.path()) == bytes_of(resumed_dir / "step_00000020" / e.path().filename()));
  }
  fs::remove_all(straight_dir.parent_path());
}

TEST_CASE("gpt checkpoint: saved in one grid layout, continued in another as if trained there from the start (threads)") {
  struct case_t {
    int d, t, p, stage;      // saved in
    int d2, t2, p2, stage2;  // continued in
  };
  for (const case_t c : {case_t{4, 1, 1, 3, 2, 2, 1, 1}, case_t{2, 2, 2, 2, 2, 1, 4, 3}}) {
    CAPTURE(c.d);
    CAPTURE(c.t);
    CAPTURE(c.p);
    CAPTURE(c.t2);
    CAPTURE(c.p2);
    const auto dir = fresh_dir("reshard");
    auto saved = layout(c.d, c.t, c.p, c.stage, 16);
    saved.steps = 10;
    saved.save_every = 10;
    saved.checkpoint_dir = dir.string();
    (void)run(c.d * c.t * c.p, saved);

    auto next = layout(c.d2, c.t2, c.p2, c.stage2, 16);
    const auto continuous = run(c.d2 * c.t2 * c.p2, next);
    REQUIRE(continuous.size() == 20);
    next.resume = true;
    next.checkpoint_dir = dir.string();
    const auto resumed = run(c.d2 * c.t2 * c.p2, next);
    REQUIRE(resumed.size() == 10);
    double worst = 0;
    for (std::size_t s = 0; s < 10; ++s) {
      CAPTURE(s + 11);
      CHECK(resumed[s].step == continuous[s + 10].step);
      worst = std::max({worst, gpt_suite::relative(resumed[s].loss, continuous[s + 10].loss),
                        gpt_suite::relative(resumed[s].grad_norm, continuous[s + 10].grad_norm)});
    }
    MESSAGE("largest relative difference of loss or gradient norm over steps 11-20: ", worst);
    CHECK(worst <= 1e-6);
    CHECK(resumed.back().loss < continuous.front().loss - 0.5);  // it goes on learning
  }
  fs::remove_all(fs::temp_directory_path() / ("trident_gpt_ckpt_" + std::to_string(::getpid())));
}
