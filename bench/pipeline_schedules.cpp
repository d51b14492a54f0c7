// Draws and compares pipeline schedules (parallel/pipeline/): validates each, simulates it with
// the given costs and prints makespan, bubble fraction beside the published formula, the bubble
// within each rank's own span (what is left when iterations overlap), and the peak
// micro-batches of activations per rank; optionally writes each as SVG and Chrome trace.
//
//   pipeline_schedules [-s gpipe|1f1b|interleaved|zb-h1|zb-h2|all] [-p 4] [-m 8] [-v 2]
//                      [--forward 1] [--backward 2] [--backward-input 1] [--backward-weight 1]
//                      [--latency 0] [--svg DIR] [--trace DIR]
//   pipeline_schedules -p 4 -m 8 --svg docs/pipeline        # the diagrams in docs/
//
// Costs are those of a rank's whole share of the model: the interleaved schedule runs each of
// its v chunks at forward / v and backward / v, so that every schedule does the same work.
// The formulas: GPipe and 1F1B (p-1)/(m+p-1) (Huang et al. 2019, Narayanan et al. 2021);
// interleaved (p-1)/(v m+p-1) (Narayanan et al. 2021); ZB-H1 and ZB-H2 with the paper's idle
// time per rank (p-1)(F+B-W) (Qi et al. 2023), i.e. (p-1)/(3m+p-1) for F = B = W and m >= p.
// Peaks for interleaved count chunk-micro-batches.
#include <fmt/core.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "trident/parallel/pipeline/schedule.hpp"
#include "trident/parallel/pipeline/simulator.hpp"

namespace pipeline = trident::pipeline;

int main(int argc, char** argv) {
  std::string which = "all", svg_dir, trace_dir;
  int p = 4, m = 8, v = 2;
  pipeline::action_costs costs;
  constexpr const char* usage =
      "usage: pipeline_schedules [-s gpipe|1f1b|interleaved|zb-h1|zb-h2|all] [-p P] [-m M] [-v V] [--forward F] "
      "[--backward B] [--backward-input B] [--backward-weight W] [--latency L] [--svg DIR] [--trace DIR]\n";
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        fmt::print(stderr, "pipeline_schedules: {} needs a value\n", a);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-s") which = value();
    else if (a == "-p") p = std::atoi(value().c_str());
    else if (a == "-m") m = std::atoi(value().c_str());
    else if (a == "-v") v = std::atoi(value().c_str());
    else if (a == "--forward") costs.forward = std::atof(value().c_str());
    else if (a == "--backward") costs.backward = std::atof(value().c_str());
    else if (a == "--backward-input") costs.backward_input = std::atof(value().c_str());
    else if (a == "--backward-weight") costs.backward_weight = std::atof(value().c_str());
    else if (a == "--latency") costs.latency = std::atof(value().c_str());
    else if (a == "--svg") svg_dir = value();
    else if (a == "--trace") trace_dir = value();
    else {
      fmt::print(stderr, "{}", usage);
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  const bool all = which == "all";
  if (!all && which != "gpipe" && which != "1f1b" && which != "interleaved" && which != "zb-h1" && which != "zb-h2") {
    fmt::print(stderr, "pipeline_schedules: unknown schedule '{}' (gpipe, 1f1b, interleaved, zb-h1, zb-h2, all)\n", which);
    return 2;
  }
  try {
    struct entry {
      pipeline::schedule s;
      pipeline::action_costs costs;
      double formula;
    };
    const double P = p, M = m, V = v, F = costs.forward, B = costs.backward_input, W = costs.backward_weight;
    const double flush = (P - 1) / (M + P - 1);
    // ZB: (p-1)(F+B-W) idle per rank beside m(F+B+W) of work.
    const double zb = (P - 1) * (F + B - W) / (M * (F + B + W) + (P - 1) * (F + B - W));
    std::vector<entry> schedules;
    if (all || which == "gpipe") schedules.push_back({pipeline::gpipe(p, m), costs, flush});
    if (all || which == "1f1b") schedules.push_back({pipeline::one_f_one_b(p, m), costs, flush});
    if (all || which == "interleaved") {
      if (all && (v < 1 || m % p != 0)) {
        fmt::print("# interleaved skipped: needs m a multiple of p and v >= 1\n");
      } else {
        auto per_chunk = costs;
        per_chunk.forward /= V;
        per_chunk.backward /= V;
        schedules.push_back({pipeline::interleaved_one_f_one_b(p, m, v), per_chunk, (P - 1) / (V * M + P - 1)});
      }
    }
    if (all || which == "zb-h1") schedules.push_back({pipeline::zb_h1(p, m), costs, zb});
    if (all || which == "zb-h2") schedules.push_back({pipeline::zb_h2(p, m), costs, zb});
    fmt::print("# p = {} ranks, m = {} micro-batches, v = {} chunks (interleaved); costs: forward {}, backward {}, "
               "backward_input {}, backward_weight {}, latency {}\n",
               p, m, v, costs.forward, costs.backward, costs.backward_input, costs.backward_weight, costs.latency);
    fmt::print("{:<17} {:>9} {:>8} {:>8} {:>8}  {}\n", "schedule", "makespan", "bubble", "formula", "in span",
               "peak activations per rank");
    for (const auto& [s, c, formula] : schedules) {
      pipeline::validate(s);
      const auto sim = pipeline::simulate(s, c);
      std::string peaks;
      for (int peak : sim.peak_activations) peaks += fmt::format("{} ", peak);
      fmt::print("{:<17} {:>9.2f} {:>8.4f} {:>8.4f} {:>8.4f}  {}\n", s.name, sim.makespan, sim.bubble, formula, sim.span_bubble,
                 peaks);
      if (!svg_dir.empty()) std::ofstream(svg_dir + "/" + s.name + ".svg") << pipeline::svg(sim);
      if (!trace_dir.empty()) std::ofstream(trace_dir + "/" + s.name + ".json") << pipeline::chrome_trace(sim);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "pipeline_schedules: {}\n", e.what());
    return 1;
  }
}
