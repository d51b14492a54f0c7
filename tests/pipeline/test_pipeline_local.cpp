// The pipeline executor on thread ranks: every schedule equals gradient accumulation on one
// rank (p = 1..4, m = 1..8), peak activations as the papers state, measured bubbles as the
// simulator and the formulas say, and bad input named on every rank instead of a hang.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "pipeline/pipeline_suite.hpp"
#include "trident/comm/local.hpp"

using trident::local_comm;
using trident::local_world;
namespace pp = trident::pipeline;

TEST_CASE("pipeline executor: GPipe, 1F1B, split-backward 1F1B, ZB-H1, ZB-H2, interleaved 1F1B and a user's list = gradient accumulation on one rank (threads, p = 1..4, "
          "m = 1..8)") {
  for (int p = 1; p <= 4; ++p) local_world::run(p, [](local_comm& comm) { pipeline_suite::all_schedules_equal_serial(comm); });
}

TEST_CASE("pipeline executor: peak activation bytes from the ledger as the papers of GPipe, 1F1B, interleaved 1F1B and ZB-H1/H2 state (threads)") {
  for (int p : {2, 4})
    for (int m : {1, 3, 8}) local_world::run(p, [m](local_comm& comm) { pipeline_suite::activation_memory(comm, m); });
}

namespace {

using clock_type = pipeline_suite::sleeping_stage::clock;
using interval = std::pair<clock_type::time_point, clock_type::time_point>;

// Runs `s` on thread ranks whose stages sleep, and returns the measured bubble fraction:
// 1 - busy / (ranks x makespan), the makespan from the first compute's start to the last's end.
double measured_bubble(const pp::schedule& s, pipeline_suite::sleeping_stage::costs costs) {
  std::vector<std::vector<interval>> busy(static_cast<std::size_t>(s.ranks));
  local_world::run(s.ranks, [&](local_comm& comm) {
    auto* mine = &busy[static_cast<std::size_t>(comm.rank())];
    pipeline_suite::with_stages(s.stages, [&]<std::size_t N>() {
      pp::uniform_pipeline<pipeline_suite::sleeping_stage, N> pipe(comm, [&](auto) { return pipeline_suite::sleeping_stage(costs, mine); });
      const std::vector<float> x(4, 1.0f);
      comm.barrier();
      mine->clear();
      pipe.run(comm, s, [&](int) -> const std::vector<float>& { return x; },
               [](const std::vector<float>&, int, std::vector<float>& dy) {
                 std::fill(dy.begin(), dy.end(), 1.0f);
                 return 0.0;
               });
    });
  });
  auto first = clock_type::time_point::max(), last = clock_type::time_point::min();
  double total = 0;
  for (const auto& rank : busy)
    for (const auto& [a, b] : rank) {
      first = std::min(first, a);
      last = std::max(last, b);
      total += std::chrono::duration<double>(b - a).count();
    }
  const double makespan = std::chrono::duration<double>(last - first).count();
  return 1.0 - total / (static_cast<double>(s.ranks) * makespan);
}

}  // namespace

TEST_CASE("pipeline executor: measured bubbles of sleeping stages match the simulator and the published formulas within 2 "
          "points (threads, p = 4, m = 8)") {
  const int p = 4, m = 8, v = 2;
  // Under the sanitizers (CI builds them at -O0) the executor's own work per action is a larger
  // share of a short action: interleaved 1F1B's 6 ms chunks measured 2.3 points over the model
  // there. Longer actions keep that share as small as in the optimised build.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const auto unit = std::chrono::milliseconds(30);
#else
  const auto unit = std::chrono::milliseconds(12);
#endif
  const pipeline_suite::sleeping_stage::costs costs{unit, unit, unit}, chunk{unit / v, unit / v, unit / v};
  const pp::action_costs model{.forward = 1, .backward = 2, .backward_input = 1, .backward_weight = 1};
  const pp::action_costs chunk_model{.forward = 0.5, .backward = 1, .backward_input = 0.5, .backward_weight = 0.5};
  struct row {
    pp::schedule s;
    pipeline_suite::sleeping_stage::costs costs;
    pp::action_costs model;
    double formula;
    std::string which;
  };
  // GPipe and 1F1B: (p - 1) / (m + p - 1) (Huang et al. 2019; Narayanan et al. 2021).
  // Interleaved with v chunks per rank, each 1/v of the rank's work: (p - 1) / (v m + p - 1).
  // ZB-H1 with F = B = W: each rank idles (p - 1)(F + B - W) instead of 1F1B's (p - 1)(F + B + W),
  // a third (Qi et al. 2023, section 2.1), so the bubble is (p - 1) / (3 m + p - 1).
  const double classic = static_cast<double>(p - 1) / (m + p - 1);
  const std::vector<row> rows{
      {pp::gpipe(p, m), costs, model, classic, "(p-1)/(m+p-1)"},
      {pp::one_f_one_b(p, m), costs, model, classic, "(p-1)/(m+p-1)"},
      {pipeline_suite::split_backward(pp::one_f_one_b(p, m)), costs, model, classic, "(p-1)/(m+p-1)"},
      {pp::interleaved_one_f_one_b(p, m, v), chunk, chunk_model, static_cast<double>(p - 1) / (v * m + p - 1), "(p-1)/(vm+p-1)"},
      {pp::zb_h1(p, m), costs, model, static_cast<double>(p - 1) / (3 * m + p - 1), "(p-1)/(3m+p-1)"},
  };
  double one_f_one_b = 0, zb = 0;
  for (const auto& [s, c, cost_model, formula, which] : rows) {
    const double simulated = pp::simulate(s, cost_model).bubble;
    // The least of up to five runs: a loaded machine only ever adds idle time (waking a rank's
    // thread takes longer when the cores are busy), so stop at the first run near the model.
    double measured = 1.0;
    for (int attempt = 0; attempt < 5 && std::abs(measured - simulated) > 0.01; ++attempt)
      measured = std::min(measured, measured_bubble(s, c));
    MESSAGE(s.name, ": measured bubble ", measured, ", simulated ", simulated, ", formula ", which, " = ", formula);
    CHECK(std::abs(measured - simulated) <= 0.02);
    CHECK(std::abs(measured - formula) <= 0.02);
    if (s.name == "1f1b") one_f_one_b = measured;
    if (s.name == "zb-h1") zb = measured;
  }
  // Idle time per rank: ZB-H1's is about a third of 1F1B's (the bubble fraction less so, since
  // the makespan shrinks with it).
  const double idle_ratio = (zb / (1 - zb)) / (one_f_one_b / (1 - one_f_one_b));
  MESSAGE("ZB-H1 idles ", idle_ratio, " as long as 1F1B (a third expected)");
  CHECK(idle_ratio == doctest::Approx(1.0 / 3).epsilon(0.25));
}

namespace {

// A stage that returns the wrong number of elements from forward (stage 0) or backward (stage 1).
struct wrong_size_stage {
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  int k = 0;
  int wrong = 0;  // 0: stage 0's forward, 2: stage 1's backward, else neither
  std::size_t input_numel() const { return 4; }
  std::size_t output_numel() const { return 4; }
  std::vector<float> forward(const std::vector<float>& x, int) { return std::vector<float>(k == 0 && wrong == 0 ? 3 : x.size(), 1.0f); }
  std::vector<float> backward(const std::vector<float>& dy, int) { return std::vector<float>(k == 1 && wrong == 2 ? 1 : dy.size()); }
};

// Another stage type, for ranks that build a different pipeline than their peers.
struct other_stage {
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  std::size_t input_numel() const { return 18; }
  std::size_t output_numel() const { return 18; }
  std::vector<float> forward(const std::vector<float>& x, int) { return x; }
  std::vector<float> backward(const std::vector<float>& dy, int) { return dy; }
};

template <class F>
void expect_error(F&& f, const std::string& words) {
  try {
    f();
    FAIL("no error; expected one saying: ", words);
  } catch (const trident::usage_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find(words) != std::string::npos);
  }
}

pipeline_suite::dense_stack make_dense(std::size_t k, std::size_t rows = 3) { return {k, k + 1, 6, rows, 1}; }

}  // namespace

TEST_CASE("pipeline executor: bad input is a usage_error on every rank, never a hang (threads)") {
  // More ranks than a multiple of the stages: 3 stages on 2 ranks.
  local_world::run(2, [](local_comm& comm) {
    expect_error([&] { pp::uniform_pipeline<pipeline_suite::dense_stack, 3> pipe(comm, [](auto k) { return make_dense(k); }); },
                 "3 stages on 2 pipeline ranks; expected a multiple");
  });
  // The ranks build different pipelines (another stage type on rank 1).
  local_world::run(2, [](local_comm& comm) {
    expect_error(
        [&] {
          if (comm.rank() == 0) pp::pipeline<pipeline_suite::dense_stack, pipeline_suite::dense_stack> pipe(comm, [](auto k) { return make_dense(k); });
          else pp::pipeline<pipeline_suite::dense_stack, other_stage> pipe(comm, [](auto k) {
            if constexpr (decltype(k)::value == 0) return make_dense(0);
            else return other_stage{};
          });
        },
        "hold different lists of stages");
  });
  // Sizes that do not chain: stage 0 sends 3 x 6 elements, stage 1 expects 2 x 6.
  local_world::run(2, [](local_comm& comm) {
    expect_error([&] { pp::uniform_pipeline<pipeline_suite::dense_stack, 2> pipe(comm, [](auto k) { return make_dense(k, 3 - k); }); },
                 "stage 0 (rank 0) sends 18 elements per micro-batch, but stage 1 (rank 1) expects 12");
  });
  local_world::run(2, [](local_comm& comm) {
    pp::uniform_pipeline<pipeline_suite::dense_stack, 2> pipe(comm, [](auto k) { return make_dense(k); });
    pipeline_suite::problem pb;
    auto input = [&](int mb) { return pb.input(mb); };
    auto loss = [&](const std::vector<float>& y, int mb, std::vector<float>& dy) { return pb.loss(y, mb, dy); };
    // A schedule for another pipeline size.
    expect_error([&] { pipe.run(comm, pp::one_f_one_b(4, 4), input, loss); }, "is for 4 stages on 4 ranks; this pipeline has 2 stages on 2 ranks");
    // Ranks that run different schedules (a different m on rank 1).
    expect_error([&] { pipe.run(comm, pp::one_f_one_b(2, comm.rank() == 0 ? 4 : 5), input, loss); }, "the ranks run different schedules");
    // A broken schedule: the validator's message.
    auto broken = pp::one_f_one_b(2, 4);
    broken.actions[1].pop_back();
    expect_error([&] { pipe.run(comm, broken, input, loss); }, "pipeline schedule '1f1b'");
  });
  // Input of the wrong size on the first stage: only rank 0 sees it; the error escapes its
  // thread and the thread backend fails rank 1's receive instead of letting it wait.
  expect_error(
      [] {
        local_world::run(2, [](local_comm& comm) {
          pp::uniform_pipeline<pipeline_suite::dense_stack, 2> pipe(comm, [](auto k) { return make_dense(k); });
          pipeline_suite::problem pb;
          pb.rows = 2;
          pipe.run(comm, pp::gpipe(2, 2), [&](int mb) { return pb.input(mb); },
                   [&](const std::vector<float>& y, int mb, std::vector<float>& dy) { return pb.loss(y, mb, dy); });
        });
      },
      "the input of micro-batch 0 has 12 elements; stage 0 expects 18");
  // Stages on one rank hand over in memory: a wrong size there (forward output, the loss's dy, a
  // backward's dx) was passed on unseen; across ranks the communicator caught it.
  for (int ranks : {1, 2})
    for (int what : {0, 1, 2}) {
      INFO("ranks ", ranks, ", case ", what);
      expect_error(
          [&] {
            local_world::run(ranks, [&](local_comm& comm) {
              pp::uniform_pipeline<wrong_size_stage, 2> pipe(comm, [&](auto k) {
                return wrong_size_stage{static_cast<int>(decltype(k)::value), what};
              });
              const std::vector<float> x(4, 1.0f);
              pipe.run(comm, ranks == 1 ? pp::interleaved_one_f_one_b(1, 1, 2) : pp::gpipe(2, 1), [&](int) -> const std::vector<float>& { return x; },
                       [&](const std::vector<float>&, int, std::vector<float>& dy) {
                         if (what == 1) dy.clear();
                         return 0.0;
                       });
            });
          },
          what == 0   ? "stage 0's forward of micro-batch 0 returned 3 elements; its output_numel() is 4"
          : what == 1 ? "the loss of micro-batch 0 left dy with 0 elements"
                      : "stage 1's backward of micro-batch 0 returned 1 elements; its input_numel() is 4");
    }
  // A schedule that splits the backward, over stages that cannot.
  local_world::run(2, [](local_comm& comm) {
    pp::uniform_pipeline<other_stage, 2> pipe(comm, [](auto) { return other_stage{}; });
    const std::vector<float> x(18, 1.0f);
    expect_error(
        [&] {
          pipe.run(comm, pipeline_suite::split_backward(pp::one_f_one_b(2, 2)), [&](int) -> const std::vector<float>& { return x; },
                   [](const std::vector<float>&, int, std::vector<float>&) { return 0.0; });
        },
        "into backward_input and backward_weight, but its type has no backward_input");
  });
}
