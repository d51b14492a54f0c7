// The pipeline simulator against the published bubble formula, the schedules' peak
// activations, and its pictures (Chrome trace, SVG).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "trident/parallel/pipeline/schedule.hpp"
#include "trident/parallel/pipeline/simulator.hpp"

namespace pipeline = trident::pipeline;

namespace {
std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("pipeline simulator: GPipe and 1F1B bubbles are (p - 1) / (m + p - 1), peaks m and p - r") {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 10; ++m)
      for (const auto& s : {pipeline::gpipe(p, m), pipeline::one_f_one_b(p, m)}) {
        CAPTURE(p);
        CAPTURE(m);
        CAPTURE(s.name);
        const auto sim = pipeline::simulate(s, {.forward = 1.0, .backward = 2.0});
        const double formula = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
        CHECK(std::abs(sim.bubble - formula) < 1e-12);
        CHECK(sim.makespan == doctest::Approx(3.0 * (m + p - 1)));
        for (int r = 0; r < p; ++r) {
          CHECK(sim.busy[static_cast<std::size_t>(r)] == doctest::Approx(3.0 * m));
          CHECK(sim.peak_activations[static_cast<std::size_t>(r)] == (s.name == "gpipe" ? m : std::min(p - r, m)));
        }
      }
}

TEST_CASE("pipeline simulator: message latency lengthens the pipeline; a deadlock is an error") {
  const auto fast = pipeline::simulate(pipeline::one_f_one_b(4, 8), {.forward = 1.0, .backward = 2.0});
  const auto slow = pipeline::simulate(pipeline::one_f_one_b(4, 8), {.forward = 1.0, .backward = 2.0, .latency = 0.5});
  CHECK(slow.makespan > fast.makespan);
  CHECK(slow.bubble > fast.bubble);
  auto stuck = pipeline::gpipe(2, 1);
  stuck.actions[0] = {{pipeline::action_kind::forward, 0, 0}, {pipeline::action_kind::recv_gradient, 0, 0},
                      {pipeline::action_kind::send_activation, 0, 0}, {pipeline::action_kind::backward, 0, 0}};
  CHECK_THROWS_WITH_AS(pipeline::simulate(stuck), doctest::Contains("deadlocks on rank"), trident::usage_error);
}

TEST_CASE("pipeline simulator: Chrome trace and SVG have one entry per action") {
  const auto s = pipeline::one_f_one_b(4, 8);
  const auto sim = pipeline::simulate(s);
  std::size_t actions = 0, compute = 0;
  for (const auto& list : s.actions)
    for (const auto& a : list) {
      ++actions;
      if (a.kind == pipeline::action_kind::forward || a.kind == pipeline::action_kind::backward) ++compute;
    }
  const std::string trace = pipeline::chrome_trace(sim);
  CHECK(trace.rfind("{\"traceEvents\":[", 0) == 0);
  CHECK(count(trace, "\"ph\":\"X\"") == actions);
  const std::string picture = pipeline::svg(sim);
  CHECK(picture.rfind("<svg", 0) == 0);
  CHECK(count(picture, "<rect") == compute);
  CHECK(picture.find("</svg>") != std::string::npos);
}

TEST_CASE("pipeline: from_compute_order rebuilds 1F1B from its compute order alone") {
  for (int p = 1; p <= 5; ++p)
    for (int m = 1; m <= 8; ++m) {
      // 1F1B's compute order alone, communication inserted: the same timeline as the hand-made one.
      const auto f = pipeline::one_f_one_b(p, m);
      std::vector<std::vector<pipeline::action>> compute(static_cast<std::size_t>(p));
      for (int r = 0; r < p; ++r)
        for (const auto& a : f.actions[static_cast<std::size_t>(r)])
          if (a.kind == pipeline::action_kind::forward || a.kind == pipeline::action_kind::backward)
            compute[static_cast<std::size_t>(r)].push_back(a);
      const auto rebuilt = pipeline::from_compute_order("1f1b (rebuilt)", p, p, m, compute);
      CHECK_NOTHROW(pipeline::validate(rebuilt));
      CHECK(pipeline::simulate(rebuilt).makespan == pipeline::simulate(f).makespan);
    }
}
