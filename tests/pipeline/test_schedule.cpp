// Pipeline schedules as data: the generators make valid schedules for every size, with the
// peak activations their papers state, and the validator rejects broken ones naming the rank,
// the action and the reason.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "trident/parallel/pipeline/schedule.hpp"

namespace pipeline = trident::pipeline;
using pipeline::action;
using pipeline::action_kind;

namespace {

// The most micro-batches whose forward ran and whose backward did not, on rank r.
int peak_in_flight(const pipeline::schedule& s, int r) {
  int live = 0, peak = 0;
  for (const action& a : s.actions[static_cast<std::size_t>(r)]) {
    if (a.kind == action_kind::forward) peak = std::max(peak, ++live);
    if (a.kind == action_kind::backward || a.kind == action_kind::backward_input) --live;
  }
  return peak;
}

// 1F1B with each backward split into B then W at once: what zero-bubble schedules rearrange.
pipeline::schedule split_backward(pipeline::schedule s) {
  for (auto& list : s.actions) {
    std::vector<action> out;
    for (const action& a : list) {
      if (a.kind != action_kind::backward) {
        out.push_back(a);
        continue;
      }
      out.push_back({action_kind::backward_input, a.micro_batch, a.stage});
      out.push_back({action_kind::backward_weight, a.micro_batch, a.stage});
    }
    list = std::move(out);
  }
  return s;
}

}  // namespace

TEST_CASE("pipeline schedules: GPipe and 1F1B are valid for p = 1..6, m = 1..10, with their papers' peak activations") {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 10; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      const auto g = pipeline::gpipe(p, m), f = pipeline::one_f_one_b(p, m);
      CHECK_NOTHROW(pipeline::validate(g));
      CHECK_NOTHROW(pipeline::validate(f));
      CHECK_NOTHROW(pipeline::validate(split_backward(f)));
      for (int r = 0; r < p; ++r) {
        CHECK(peak_in_flight(g, r) == m);                     // GPipe keeps every micro-batch
        CHECK(peak_in_flight(f, r) == std::min(p - r, m));    // 1F1B: at most p - r on rank r
      }
    }
  CHECK_THROWS_AS(pipeline::gpipe(0, 4), trident::usage_error);
  CHECK_THROWS_AS(pipeline::one_f_one_b(4, 0), trident::usage_error);
}

TEST_CASE("pipeline validator: broken schedules are rejected naming the rank, the action and the reason") {
  auto expect = [](const pipeline::schedule& s, const std::string& where, const std::string& why) {
    try {
      pipeline::validate(s);
      FAIL("accepted a broken schedule: ", why);
    } catch (const trident::usage_error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find(where) != std::string::npos);
      CHECK(what.find(why) != std::string::npos);
    }
  };
  // A missing weight-gradient step.
  auto no_w = split_backward(pipeline::one_f_one_b(3, 4));
  auto& r1 = no_w.actions[1];
  r1.erase(std::find(r1.begin(), r1.end(), action{action_kind::backward_weight, 2, 1}));
  expect(no_w, "rank 1", "backward_input without backward_weight");

  // Crossed sends: rank 0 sends micro-batch 1's activation before micro-batch 0's.
  auto crossed = pipeline::gpipe(2, 2);
  crossed.actions[0] = {{action_kind::forward, 0, 0},         {action_kind::forward, 1, 0},
                        {action_kind::send_activation, 1, 0}, {action_kind::send_activation, 0, 0},
                        {action_kind::recv_gradient, 0, 0},   {action_kind::backward, 0, 0},
                        {action_kind::recv_gradient, 1, 0},   {action_kind::backward, 1, 0}};
  expect(crossed, "rank 0, action 2 (send_activation(micro-batch 1, stage 0))", "crossed");

  // A deadlock: rank 0 waits for a gradient before sending the activation it depends on.
  auto stuck = pipeline::gpipe(2, 1);
  stuck.actions[0] = {{action_kind::forward, 0, 0}, {action_kind::recv_gradient, 0, 0},
                      {action_kind::send_activation, 0, 0}, {action_kind::backward, 0, 0}};
  expect(stuck, "rank 0, action 1 (recv_gradient(micro-batch 0, stage 0))", "deadlock");

  // 1F1B without its groups: each rank's blocking send waits for a peer in its own blocking send.
  auto ungrouped = pipeline::one_f_one_b(2, 2);
  for (auto& list : ungrouped.actions)
    for (auto& a : list) a.with_next = false;
  expect(ungrouped, "rank 0", "deadlock with blocking point-to-point");
  auto bad_group = pipeline::gpipe(2, 1);
  bad_group.actions[0][0].with_next = true;  // a forward cannot be grouped
  expect(bad_group, "rank 0, action 0", "only sends and receives form groups");

  // A micro-batch twice.
  auto twice = pipeline::gpipe(2, 2);
  twice.actions[0].insert(twice.actions[0].begin() + 1, action{action_kind::forward, 0, 0});
  expect(twice, "rank 0, action 1 (forward(micro-batch 0, stage 0))", "a second forward");

  // A backward before its output gradient arrived, and a stage on the wrong rank.
  auto early = pipeline::gpipe(2, 1);
  std::swap(early.actions[0][2], early.actions[0][3]);  // backward before recv_gradient
  expect(early, "rank 0, action 2 (backward(micro-batch 0, stage 0))", "before its output gradient arrived");
  auto misplaced = pipeline::gpipe(2, 1);
  misplaced.actions[0][0].stage = 1;
  expect(misplaced, "rank 0, action 0", "stage 1 runs on rank 1, not here");

  // A micro-batch nobody runs backward for.
  auto missing = pipeline::gpipe(1, 2);
  missing.actions[0].pop_back();
  expect(missing, "rank 0", "has no backward");
}
