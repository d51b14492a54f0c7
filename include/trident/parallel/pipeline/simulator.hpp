#pragma once
// What a pipeline schedule costs, before it runs: a discrete-event simulation of every rank's
// list with given costs, and the pictures (issue 12).
//
//   struct action_costs   forward, backward (B and W together), backward_input, backward_weight,
//                         latency of one message
//   struct simulation     per rank: the timeline (action, start, end), busy time, peak number of
//                         micro-batches whose activations it holds; makespan, bubble fraction,
//                         and the bubble within each rank's own span (span_bubble: what is left
//                         when iterations overlap, ZB-H2's zero)
//   simulate(schedule, costs)      runs the lists (validate() them first)
//   chrome_trace(simulation)       JSON for chrome://tracing / Perfetto: one row per rank
//   svg(simulation)                the familiar pipeline diagram
//
// The model: a rank executes its actions in order; a compute action takes its cost; a message
// starts when both its send and its receive have been posted and arrives `latency` later, which
// is when both sides complete it; a group (with_next) is posted at once and completes when its
// last message does. The bubble fraction is the idle share of every rank's time up to the
// makespan: 1 - sum(busy) / (ranks x makespan). With equal costs per micro-batch and no latency,
// the simulation gives the published bubbles exactly (tests/pipeline): GPipe and 1F1B
// (p - 1) / (m + p - 1); interleaved 1F1B with costs F / v and B / v per chunk
// (p - 1) / (v m + p - 1); ZB-H1 and ZB-H2 with F = B = W (p - 1) / (3m + p - 1) for m >= p,
// and ZB-H2 a span_bubble of 0 for m >= 2p - 1. A peak counts micro-batches (for interleaved,
// chunk-micro-batches) between a forward and its backward or backward_input.
//
//   const auto s = trident::pipeline::one_f_one_b(4, 8);
//   const auto sim = trident::pipeline::simulate(s, {.forward = 1, .backward = 2});
//   sim.bubble;                                 // 3 / 11
//   std::ofstream("1f1b.svg") << trident::pipeline::svg(sim);
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/parallel/pipeline/schedule.hpp"

namespace trident::pipeline {

struct action_costs {
  double forward = 1.0;
  double backward = 2.0;  // B and W together
  double backward_input = 1.0;
  double backward_weight = 1.0;
  double latency = 0.0;  // one message, once both sides posted it

  double of(action_kind k) const noexcept {
    switch (k) {
      case action_kind::forward: return forward;
      case action_kind::backward: return backward;
      case action_kind::backward_input: return backward_input;
      case action_kind::backward_weight: return backward_weight;
      default: return 0.0;
    }
  }
};

struct timed_action {
  action what;
  double start, end;
};

struct simulation {
  std::string name;
  int ranks = 0, micro_batches = 0;
  double makespan = 0;
  double bubble = 0;                          // idle share of ranks x makespan
  std::vector<double> busy;                   // per rank: time in compute
  std::vector<int> peak_activations;          // per rank: most micro-batches held at once
  std::vector<std::vector<timed_action>> timeline;  // per rank, compute and messages
  // Idle share within each rank's own span, its first compute's start to its last one's end:
  // the bubble left when one iteration's tail overlaps the next one's head (no flush between
  // them), which is what zero-bubble schedules remove (ZB-H2: 0 with equal costs).
  double span_bubble = 0;
};

//! Runs every rank's list (see the header comment); a schedule that deadlocks is a usage_error
//! (validate() says more).
inline simulation simulate(const schedule& s, const action_costs& c = {}) {
  TRIDENT_EXPECT(c.forward >= 0 && c.backward >= 0 && c.backward_input >= 0 && c.backward_weight >= 0 && c.latency >= 0,
                 "pipeline::simulate: costs must not be negative");
  const auto n = static_cast<std::size_t>(s.ranks);
  simulation out{s.name, s.ranks, s.micro_batches, 0, 0, std::vector<double>(n, 0.0), std::vector<int>(n, 0),
                 std::vector<std::vector<timed_action>>(n)};
  std::vector<std::size_t> at(n, 0);
  std::vector<double> clock(n, 0.0);
  std::vector<int> live(n, 0);
  std::vector<std::vector<double>> posted(n), finished(n);  // per action: when posted / done (-1: not yet)
  for (std::size_t r = 0; r < n; ++r) {
    posted[r].assign(s.actions[r].size(), -1.0);
    finished[r].assign(s.actions[r].size(), -1.0);
  }
  auto group_end = [&](std::size_t r, std::size_t i) {
    const auto& list = s.actions[r];
    while (i < list.size() && detail::is_p2p(list[i].kind) && list[i].with_next) ++i;
    return std::min(i + 1, list.size());
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t r = 0; r < n; ++r) {
      auto& i = at[r];
      const auto& list = s.actions[r];
      while (i < list.size()) {
        const action& a = list[i];
        if (!detail::is_p2p(a.kind)) {
          const double start = clock[r], cost = c.of(a.kind);
          clock[r] += cost;
          out.busy[r] += cost;
          out.timeline[r].push_back({a, start, clock[r]});
          if (a.kind == action_kind::forward) out.peak_activations[r] = std::max(out.peak_activations[r], ++live[r]);
          if (a.kind == action_kind::backward || a.kind == action_kind::backward_input) --live[r];
          ++i;
          progress = true;
          continue;
        }
        const std::size_t end = group_end(r, i);
        for (std::size_t k = i; k < end; ++k)
          if (posted[r][k] < 0) posted[r][k] = clock[r];
        for (std::size_t k = i; k < end; ++k) {
          if (finished[r][k] >= 0) continue;
          const auto m = detail::message_of(s, list[k]);
          const auto peer = static_cast<std::size_t>(detail::is_send(list[k].kind) ? m.to : m.from);
          const auto& other = s.actions[peer];
          const std::size_t j0 = at[peer];
          if (j0 >= other.size() || !detail::is_p2p(other[j0].kind)) continue;
          for (std::size_t j = j0; j < group_end(peer, j0); ++j)
            if (finished[peer][j] < 0 && detail::is_send(other[j].kind) != detail::is_send(list[k].kind) &&
                detail::message_of(s, other[j]) == m) {
              if (posted[peer][j] < 0) posted[peer][j] = clock[peer];
              const double arrive = std::max(posted[r][k], posted[peer][j]) + c.latency;
              finished[r][k] = finished[peer][j] = arrive;
              progress = true;
              break;
            }
        }
        double done = clock[r];
        bool all = true;
        for (std::size_t k = i; k < end; ++k) {
          all = all && finished[r][k] >= 0;
          done = std::max(done, finished[r][k]);
        }
        if (!all) break;
        for (std::size_t k = i; k < end; ++k) out.timeline[r].push_back({list[k], posted[r][k], finished[r][k]});
        clock[r] = done;
        i = end;
        progress = true;
      }
    }
  }
  for (std::size_t r = 0; r < n; ++r)
    TRIDENT_EXPECT(at[r] == s.actions[r].size(), "pipeline::simulate: schedule '", s.name, "' deadlocks on rank ", r,
                   " at action ", at[r], " (", describe(s.actions[r][at[r]]), "); run validate() for the whole story");
  for (double t : clock) out.makespan = std::max(out.makespan, t);
  double busy = 0;
  for (double b : out.busy) busy += b;
  out.bubble = out.makespan > 0 ? 1.0 - busy / (static_cast<double>(n) * out.makespan) : 0.0;
  double spans = 0;
  for (const auto& row : out.timeline) {
    double first = -1, last = 0;
    for (const auto& t : row)
      if (!detail::is_p2p(t.what.kind)) {
        if (first < 0) first = t.start;
        last = std::max(last, t.end);
      }
    if (first >= 0) spans += last - first;
  }
  out.span_bubble = spans > 0 ? 1.0 - busy / spans : 0.0;
  return out;
}

namespace detail {
// Odd virtual chunks (interleaved schedules) in darker shades, so the two passes of a
// micro-batch through a rank are told apart.
inline const char* colour_of(action_kind k, bool odd_chunk = false) noexcept {
  switch (k) {
    case action_kind::forward: return odd_chunk ? "#2b4a6f" : "#4e79a7";
    case action_kind::backward: return odd_chunk ? "#2f6b2a" : "#59a14f";
    case action_kind::backward_input: return odd_chunk ? "#4f9a42" : "#8cd17d";
    case action_kind::backward_weight: return odd_chunk ? "#b35f0f" : "#f28e2b";
    default: return "#bab0ac";
  }
}
inline const char* letter_of(action_kind k) noexcept {
  switch (k) {
    case action_kind::forward: return "F";
    case action_kind::backward: return "B";
    case action_kind::backward_input: return "B";
    case action_kind::backward_weight: return "W";
    default: return "";
  }
}
}  // namespace detail

//! The timeline as Chrome trace events ("ph": "X", microseconds = cost units x 1000): open
//! in chrome://tracing or ui.perfetto.dev; one row (tid) per rank, messages included.
inline std::string chrome_trace(const simulation& sim) {
  std::string out = "{\"traceEvents\":[";
  bool first = true;
  for (std::size_t r = 0; r < sim.timeline.size(); ++r)
    for (const auto& t : sim.timeline[r]) {
      out += trident::detail::concat(first ? "" : ",", "\n{\"name\":\"", name_of(t.what.kind), " mb", t.what.micro_batch, " s",
                                     t.what.stage, "\",\"ph\":\"X\",\"pid\":0,\"tid\":", r, ",\"ts\":", t.start * 1000.0,
                                     ",\"dur\":", (t.end - t.start) * 1000.0, "}");
      first = false;
    }
  out += trident::detail::concat("\n],\"otherData\":{\"schedule\":\"", sim.name, "\",\"makespan\":", sim.makespan,
                                 ",\"bubble\":", sim.bubble, "}}\n");
  return out;
}

//! The pipeline diagram: a row per rank, a box per compute action (F blue, B green, split B
//! light green, W orange) labelled with its micro-batch, time to the right.
inline std::string svg(const simulation& sim, double unit_px = 24.0, double row_px = 26.0) {
  const double left = 60, top = 30;
  const double width = left + sim.makespan * unit_px + 20, height = top + row_px * sim.ranks + 30;
  std::string out = trident::detail::concat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", width, "\" height=\"", height,
                                            "\" font-family=\"sans-serif\" font-size=\"11\">\n<text x=\"", left, "\" y=\"18\">",
                                            sim.name, ": ", sim.ranks, " ranks, ", sim.micro_batches,
                                            " micro-batches, bubble ", sim.bubble, "</text>\n");
  for (std::size_t r = 0; r < sim.timeline.size(); ++r) {
    const double y = top + row_px * static_cast<double>(r);
    out += trident::detail::concat("<text x=\"4\" y=\"", y + row_px * 0.65, "\">rank ", r, "</text>\n");
    for (const auto& t : sim.timeline[r]) {
      if (detail::is_p2p(t.what.kind) || t.end <= t.start) continue;
      const double x = left + t.start * unit_px, w = (t.end - t.start) * unit_px;
      const bool odd_chunk = sim.ranks > 0 && (t.what.stage / sim.ranks) % 2 == 1;
      // The label shrinks to fit short boxes (a chunk of an interleaved schedule).
      const double font = std::min(11.0, 0.45 * w);
      out += trident::detail::concat("<rect x=\"", x, "\" y=\"", y, "\" width=\"", w, "\" height=\"", row_px - 4, "\" fill=\"",
                                     detail::colour_of(t.what.kind, odd_chunk), "\" stroke=\"white\"/><text x=\"", x + 2, "\" y=\"",
                                     y + row_px * 0.6, "\" font-size=\"", font, "\" fill=\"white\">", detail::letter_of(t.what.kind),
                                     t.what.micro_batch, "</text>\n");
    }
  }
  out += "</svg>\n";
  return out;
}

}  // namespace trident::pipeline
