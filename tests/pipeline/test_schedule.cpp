// Pipeline schedules as data: the generators (GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-H2) make
// valid schedules for every size, with the peak activations their papers state, and the
// validator rejects broken ones naming the rank, the action and the reason.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "trident/parallel/pipeline/schedule.hpp"

namespace pipeline = trident::pipeline;
using pipeline::action;
using pipeline::action_kind;

namespace {

// The most micro-batches whose forward ran and whose backward did not, on rank r (with
// `until_weight`, whose backward_weight did not).
int peak_in_flight(const pipeline::schedule& s, int r, bool until_weight = false) {
  int live = 0, peak = 0;
  for (const action& a : s.actions[static_cast<std::size_t>(r)]) {
    if (a.kind == action_kind::forward) peak = std::max(peak, ++live);
    if (a.kind == action_kind::backward) --live;
    if (a.kind == (until_weight ? action_kind::backward_weight : action_kind::backward_input)) --live;
  }
  return peak;
}

// The largest group of sends and receives posted together on any rank.
std::size_t largest_group(const pipeline::schedule& s) {
  std::size_t most = 0;
  for (const auto& list : s.actions)
    for (std::size_t i = 0, run = 0; i < list.size(); ++i) {
      const bool p2p = list[i].kind != action_kind::forward && list[i].kind != action_kind::backward &&
                       list[i].kind != action_kind::backward_input && list[i].kind != action_kind::backward_weight;
      run = p2p ? run + 1 : 0;
      most = std::max(most, run);
      if (!list[i].with_next) run = 0;
    }
  return most;
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

TEST_CASE("pipeline schedules: interleaved 1F1B is valid for p = 1..6, m = p..16 (multiples of p), v = 1..3, "
          "with Megatron's warm-up as its peak") {
  for (int v = 1; v <= 3; ++v)
    for (int p = 1; p <= 6; ++p)
      for (int m = p; m <= 16; m += p) {
        CAPTURE(v);
        CAPTURE(p);
        CAPTURE(m);
        const auto s = pipeline::interleaved_one_f_one_b(p, m, v);
        CHECK(s.stages == v * p);
        CHECK(s.ranks == p);
        CHECK_NOTHROW(pipeline::validate(s));
        for (int r = 0; r < p; ++r) {
          // Megatron: 2 (p - r - 1) + (v - 1) p warm-up forwards (every one when m = p), one more in
          // the steady state before the first backward; counted in chunk-micro-batches.
          const int megatron = m == p ? v * m : std::min(2 * (p - r - 1) + (v - 1) * p + 1, v * m);
          CHECK(peak_in_flight(s, r) == megatron);
        }
        if (m > p) CHECK(peak_in_flight(s, 0) == (v + 1) * p - 1);
        // The steady state's send_forward_backward_recv_forward_backward: four messages in a group.
        if (p >= 2 && v >= 2 && m > p) CHECK(largest_group(s) == 4);
      }
  // The published example: 4 ranks, 8 micro-batches, 2 chunks; rank 0 holds 11 chunk-micro-batches.
  CHECK(peak_in_flight(pipeline::interleaved_one_f_one_b(4, 8, 2), 0) == 11);
  CHECK_THROWS_WITH_AS(pipeline::interleaved_one_f_one_b(4, 6, 2), doctest::Contains("multiple of the ranks"), trident::usage_error);
  CHECK_THROWS_WITH_AS(pipeline::interleaved_one_f_one_b(4, 2, 2), doctest::Contains("multiple of the ranks"), trident::usage_error);
  CHECK_THROWS_AS(pipeline::interleaved_one_f_one_b(4, 8, 0), trident::usage_error);
  CHECK_THROWS_AS(pipeline::interleaved_one_f_one_b(0, 8, 2), trident::usage_error);
}

TEST_CASE("pipeline schedules: interleaved 1F1B needs its prefetching receives; posted just before their consumer it deadlocks") {
  // The same compute order with the messages inserted by from_compute_order (each receive right
  // before its consumer): rank p - 1 feeds rank 0's next chunk and waits in a cycle.
  const auto s = pipeline::interleaved_one_f_one_b(4, 8, 2);
  std::vector<std::vector<action>> compute(4);
  for (int r = 0; r < 4; ++r)
    for (const action& a : s.actions[static_cast<std::size_t>(r)])
      if (a.kind == action_kind::forward || a.kind == action_kind::backward) compute[static_cast<std::size_t>(r)].push_back(a);
  const auto late = pipeline::from_compute_order("interleaved, late receives", 8, 4, 8, compute);
  CHECK_THROWS_WITH_AS(pipeline::validate(late), doctest::Contains("deadlock"), trident::usage_error);
}

TEST_CASE("pipeline schedules: ZB-H1 and ZB-H2 are valid for p = 1..6, m = 1..16, with the paper's memory") {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 16; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      const auto h1 = pipeline::zb_h1(p, m), h2 = pipeline::zb_h2(p, m);
      CHECK_NOTHROW(pipeline::validate(h1));
      CHECK_NOTHROW(pipeline::validate(h2));
      for (const auto& s : {h1, h2})
        for (const auto& list : s.actions)
          for (const action& a : list) CHECK(a.kind != action_kind::backward);  // always split into B and W
      int h1_w = 0, h2_w = 0;
      for (int r = 0; r < p; ++r) {
        CHECK(peak_in_flight(h1, r) == std::min(p - r, m));          // 1F1B's: p - r on rank r
        CHECK(peak_in_flight(h2, r) == std::min(2 * (p - r) - 1, m));  // 2p - 1 on rank 0
        h1_w = std::max(h1_w, peak_in_flight(h1, r, true));
        h2_w = std::max(h2_w, peak_in_flight(h2, r, true));
      }
      CHECK(h1_w == std::min(p, m));  // the same in-flight count on every rank until W
      CHECK(h2_w <= std::min(2 * p - 1, m));
    }
  CHECK_THROWS_AS(pipeline::zb_h1(0, 4), trident::usage_error);
  CHECK_THROWS_AS(pipeline::zb_h2(4, 0), trident::usage_error);
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

  // A value cast into action_kind (the executor skipped it).
  auto cast = pipeline::gpipe(2, 1);
  cast.actions[0].insert(cast.actions[0].begin(), action{static_cast<action_kind>(42), 0, 0});
  expect(cast, "rank 0, action 0", "kind 42 is not an action_kind");

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

  // A weight gradient before its input gradient, in ZB-H1.
  auto w_first = pipeline::zb_h1(3, 4);
  auto& r2 = w_first.actions[2];
  const auto b = std::find(r2.begin(), r2.end(), action{action_kind::backward_input, 1, 2});
  const auto w = std::find(r2.begin(), r2.end(), action{action_kind::backward_weight, 1, 2});
  std::iter_swap(b, w);
  expect(w_first, "rank 2", "before backward_input of this micro-batch and stage");

  // Interleaved: a chunk on the wrong rank, and a prefetched receive moved after its consumer.
  auto wrong_chunk = pipeline::interleaved_one_f_one_b(2, 2, 2);
  wrong_chunk.actions[1].front().stage = 2;  // stage 2 is rank 0's second chunk
  expect(wrong_chunk, "rank 1, action 0", "stage 2 runs on rank 0, not here");
  auto late_input = pipeline::interleaved_one_f_one_b(2, 4, 2);
  auto& r0 = late_input.actions[0];
  const auto recv = std::find_if(r0.begin(), r0.end(), [](const action& a) { return a.kind == action_kind::recv_activation; });
  const auto use = std::find(r0.begin(), r0.end(), action{action_kind::forward, recv->micro_batch, recv->stage});
  if (recv != r0.begin()) std::prev(recv)->with_next = recv->with_next;  // out of its group
  recv->with_next = false;
  std::rotate(recv, recv + 1, use + 1);  // the receive now follows the forward that needs it
  expect(late_input, "rank 0", "before its input arrived");

  // A micro-batch nobody runs backward for.
  auto missing = pipeline::gpipe(1, 2);
  missing.actions[0].pop_back();
  expect(missing, "rank 0", "has no backward");
}

TEST_CASE("pipeline schedules: sizes past 2^24 computations are refused (they overflowed or ran out of memory)") {
  constexpr int big = std::numeric_limits<int>::max();
  for (auto make : std::initializer_list<std::function<pipeline::schedule()>>{
           [] { return pipeline::gpipe(big, 1); }, [] { return pipeline::one_f_one_b(3, big); }, [] { return pipeline::zb_h1(1 << 13, 1 << 12); },
           [] { return pipeline::zb_h2(big, 1); }, [] { return pipeline::interleaved_one_f_one_b(2, 2, 1 << 30); },
           [] { return pipeline::interleaved_one_f_one_b(65536, 65536, 65536); }})
    CHECK_THROWS_WITH_AS(make(), doctest::Contains("(micro-batch, stage) computations; expected at most 16777216"), trident::usage_error);
  CHECK_NOTHROW(pipeline::gpipe(4, 1 << 10));
}
