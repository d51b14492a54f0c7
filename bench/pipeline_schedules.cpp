// Draws and compares pipeline schedules (parallel/pipeline/): validates each, simulates it with
// the given costs and prints makespan, bubble fraction beside the published formula, and the
// peak micro-batches of activations per rank; optionally writes each as SVG and Chrome trace.
//
//   pipeline_schedules [-s gpipe|1f1b|all] [-p 4] [-m 8] [--forward 1] [--backward 2]
//                      [--latency 0] [--svg DIR] [--trace DIR]
//   pipeline_schedules -p 4 -m 8 --svg docs/pipeline        # the diagrams in docs/
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
  int p = 4, m = 8;
  pipeline::action_costs costs;
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
    else if (a == "--forward") costs.forward = std::atof(value().c_str());
    else if (a == "--backward") costs.backward = std::atof(value().c_str());
    else if (a == "--latency") costs.latency = std::atof(value().c_str());
    else if (a == "--svg") svg_dir = value();
    else if (a == "--trace") trace_dir = value();
    else {
      fmt::print(stderr, "usage: pipeline_schedules [-s gpipe|1f1b|all] [-p P] [-m M] [--forward F] [--backward B] "
                         "[--latency L] [--svg DIR] [--trace DIR]\n");
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  try {
    std::vector<pipeline::schedule> schedules;
    if (which == "gpipe" || which == "all") schedules.push_back(pipeline::gpipe(p, m));
    if (which == "1f1b" || which == "all") schedules.push_back(pipeline::one_f_one_b(p, m));
    if (schedules.empty()) {
      fmt::print(stderr, "pipeline_schedules: unknown schedule '{}' (gpipe, 1f1b, all)\n", which);
      return 2;
    }
    fmt::print("# p = {} ranks, m = {} micro-batches; costs: forward {}, backward {}, latency {}\n", p, m, costs.forward,
               costs.backward, costs.latency);
    fmt::print("{:<8} {:>10} {:>8} {:>10}  {}\n", "schedule", "makespan", "bubble", "(p-1)/(m+p-1)", "peak activations per rank");
    for (const auto& s : schedules) {
      pipeline::validate(s);
      const auto sim = pipeline::simulate(s, costs);
      std::string peaks;
      for (int peak : sim.peak_activations) peaks += fmt::format("{} ", peak);
      fmt::print("{:<8} {:>10.2f} {:>8.4f} {:>10.4f}     {}\n", s.name, sim.makespan, sim.bubble,
                 static_cast<double>(p - 1) / (m + p - 1), peaks);
      if (!svg_dir.empty()) std::ofstream(svg_dir + "/" + s.name + ".svg") << pipeline::svg(sim);
      if (!trace_dir.empty()) std::ofstream(trace_dir + "/" + s.name + ".json") << pipeline::chrome_trace(sim);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "pipeline_schedules: {}\n", e.what());
    return 1;
  }
}
