// The pipeline simulator against the published bubble formulas (GPipe, 1F1B, interleaved 1F1B,
// ZB-H1, ZB-H2), the schedules' peak activations, and its pictures (Chrome trace, SVG).
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

TEST_CASE("pipeline simulator: interleaved 1F1B's bubble is (p - 1) / (v m + p - 1) with costs F / v and B / v per chunk") {
  for (int v = 1; v <= 3; ++v)
    for (int p = 1; p <= 6; ++p)
      for (int m = p; m <= 16; m += p) {
        CAPTURE(v);
        CAPTURE(p);
        CAPTURE(m);
        const auto s = pipeline::interleaved_one_f_one_b(p, m, v);
        const double chunks = v;
        const auto sim = pipeline::simulate(s, {.forward = 1.0 / chunks, .backward = 2.0 / chunks});
        const double formula = static_cast<double>(p - 1) / static_cast<double>(v * m + p - 1);
        CHECK(std::abs(sim.bubble - formula) < 1e-12);
        // The 1F1B bubble's idle time, 3 (p - 1), divided by v.
        CHECK(sim.makespan == doctest::Approx(3.0 * m + 3.0 * (p - 1) / chunks));
        for (int r = 0; r < p; ++r) CHECK(sim.busy[static_cast<std::size_t>(r)] == doctest::Approx(3.0 * m));
      }
  // More chunks, less bubble: 1F1B > v = 2 > v = 4 at p = 4, m = 8.
  const auto one = pipeline::simulate(pipeline::one_f_one_b(4, 8), {.forward = 1.0, .backward = 2.0});
  const auto two = pipeline::simulate(pipeline::interleaved_one_f_one_b(4, 8, 2), {.forward = 0.5, .backward = 1.0});
  const auto four = pipeline::simulate(pipeline::interleaved_one_f_one_b(4, 8, 4), {.forward = 0.25, .backward = 0.5});
  CHECK(one.bubble > two.bubble);
  CHECK(two.bubble > four.bubble);
}

TEST_CASE("pipeline simulator: ZB-H1 and ZB-H2 bubbles with F = B = W: (p - 1) / (3m + p - 1), ZB-H2 none within a rank's span") {
  const pipeline::action_costs equal{.forward = 1.0, .backward_input = 1.0, .backward_weight = 1.0};
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 16; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      const auto h1 = pipeline::simulate(pipeline::zb_h1(p, m), equal), h2 = pipeline::simulate(pipeline::zb_h2(p, m), equal);
      for (const auto* sim : {&h1, &h2}) {
        CAPTURE(sim->name);
        if (m >= p) {
          // Qi et al.: (p - 1)(T_F + T_B - T_W) idle per rank against 1F1B's (p - 1)(T_F + T_B + T_W).
          const double formula = static_cast<double>(p - 1) / static_cast<double>(3 * m + p - 1);
          CHECK(std::abs(sim->bubble - formula) < 1e-12);
          CHECK(sim->makespan == doctest::Approx(3.0 * m + p - 1));
        } else {
          CHECK(sim->makespan == doctest::Approx(2.0 * (m + p) - 1));  // the chain of B's: F down, B up, one W
        }
        for (int r = 0; r < p; ++r) CHECK(sim->busy[static_cast<std::size_t>(r)] == doctest::Approx(3.0 * m));
      }
      // ZB-H2's zero bubble: no rank idles between its first forward and its last W.
      if (m >= 2 * p - 1) CHECK(h2.span_bubble < 1e-12);
      if (p >= 2) CHECK(h1.span_bubble > 0.0);
    }
  // A third of 1F1B's idle time at p = 4, m = 8: 3 (p - 1) = 9 units against p - 1 = 3.
  const auto f = pipeline::simulate(pipeline::one_f_one_b(4, 8), {.forward = 1.0, .backward = 2.0});
  const auto z = pipeline::simulate(pipeline::zb_h1(4, 8), equal);
  CHECK(f.makespan - 24.0 == doctest::Approx(3.0 * (z.makespan - 24.0)));
}

TEST_CASE("pipeline simulator: the new schedules finish with uneven costs and latency (their groups cannot deadlock)") {
  const pipeline::action_costs uneven{.forward = 1.0, .backward = 2.3, .backward_input = 1.4, .backward_weight = 0.7, .latency = 0.15};
  for (int p = 1; p <= 5; ++p)
    for (int m = 1; m <= 10; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      CHECK_NOTHROW(pipeline::simulate(pipeline::zb_h1(p, m), uneven));
      CHECK_NOTHROW(pipeline::simulate(pipeline::zb_h2(p, m), uneven));
      if (m % p == 0) CHECK_NOTHROW(pipeline::simulate(pipeline::interleaved_one_f_one_b(p, m, 2), uneven));
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
  for (const auto& s : {pipeline::one_f_one_b(4, 8), pipeline::interleaved_one_f_one_b(4, 8, 2), pipeline::zb_h1(4, 8)}) {
    CAPTURE(s.name);
    const auto sim = pipeline::simulate(s);
    std::size_t actions = 0, compute = 0;
    for (const auto& list : s.actions)
      for (const auto& a : list) {
        ++actions;
        if (!pipeline::detail::is_p2p(a.kind)) ++compute;
      }
    const std::string trace = pipeline::chrome_trace(sim);
    CHECK(trace.rfind("{\"traceEvents\":[", 0) == 0);
    CHECK(count(trace, "\"ph\":\"X\"") == actions);
    const std::string picture = pipeline::svg(sim);
    CHECK(picture.rfind("<svg", 0) == 0);
    CHECK(count(picture, "<rect") == compute);
    CHECK(picture.find("</svg>") != std::string::npos);
  }
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
