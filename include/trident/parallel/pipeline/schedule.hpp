#pragma once
// Pipeline schedules as data (issue 12, first step): for every rank, the ordered list of what it
// does (forward, backward, and the sends and receives between stages, with micro-batch and
// stage), made by a generator or by hand, and a validator that any schedule must pass before it
// runs.
//
//   enum class action_kind   forward, backward (input and weight gradients together),
//                            backward_input, backward_weight (split, for zero-bubble
//                            schedules), send/recv of activations and of gradients
//   struct action            kind, micro_batch, stage
//   struct schedule          stages, ranks, micro_batches, one list of actions per rank;
//                            stage s runs on rank s % ranks (interleaved: v = stages / ranks)
//   gpipe(p, m)              every forward, then every backward (Huang et al. 2019)
//   one_f_one_b(p, m)        p - r - 1 warm-up forwards on rank r, then one forward and one
//                            backward in turn, then the rest of the backwards (PipeDream-Flush,
//                            Megatron-LM's non-interleaved schedule)
//   interleaved_one_f_one_b(p, m, v)
//                            Megatron-LM's interleaved 1F1B (Narayanan et al. 2021): v chunks per
//                            rank, v p stages, m a multiple of p; receives prefetched a step
//                            ahead, up to four messages a group; bubble (p - 1) / (v m + p - 1)
//   zb_h1(p, m)              zero-bubble ZB-H1 (Qi et al. 2023): backward split into B and W,
//                            1F1B's memory, W's fill 1F1B's bubbles: (p - 1) / (3m + p - 1)
//                            with F = B = W, a third of 1F1B's idle time
//   zb_h2(p, m)              ZB-H2: p - 1 more warm-up forwards (2p - 1 micro-batches on rank
//                            0), no idle time between a rank's first and last compute
//   from_compute_order(...)  a schedule from each rank's order of computes: the sends and
//                            receives are inserted and paired (users' own schedules)
//   validate(schedule)       a usage_error naming the rank, the action and the reason, or nothing
//
// A send or receive names the stage whose compute is on this rank: send_activation{mb, s} sends
// stage s's output to stage s + 1 and is received as recv_activation{mb, s + 1}; send_gradient
// {mb, s} sends the gradient of stage s's input to stage s - 1, received as recv_gradient{mb,
// s - 1}. Consecutive stages on one rank hand over in memory, without either.
//
// What validate() checks, in this order:
//   - shape: each action's stage lives on its rank, micro-batches and stages in range;
//   - exactly once: every (micro-batch, stage) has one forward and either one backward or one
//     backward_input and one backward_weight;
//   - order on each rank: a forward after its input arrived (or its previous stage ran here), a
//     send after what it sends was computed, a backward after its forward and after its output
//     gradient arrived (the last stage starts from the loss), a weight gradient after the input
//     gradient;
//   - links: on every ordered pair of ranks the sends and the receives are the same messages in
//     the same order (messages between two ranks match in issue order, as MPI's and NCCL's do);
//   - no deadlock with blocking point-to-point: executing every rank's list where a send and its
//     receive complete only together (the strictest semantics; buffered sends only loosen it), all
//     lists finish.
//
//   const auto s = trident::pipeline::one_f_one_b(4, 8);
//   trident::pipeline::validate(s);
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <utility>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "trident/core/error.hpp"

namespace trident::pipeline {

enum class action_kind : std::uint8_t {
  forward,
  backward,         // input and weight gradients together
  backward_input,   // B: the gradient of the stage's input only
  backward_weight,  // W: the gradients of the stage's weights, after B
  send_activation,
  recv_activation,
  send_gradient,
  recv_gradient,
};

constexpr std::string_view name_of(action_kind k) noexcept {
  switch (k) {
    case action_kind::forward: return "forward";
    case action_kind::backward: return "backward";
    case action_kind::backward_input: return "backward_input";
    case action_kind::backward_weight: return "backward_weight";
    case action_kind::send_activation: return "send_activation";
    case action_kind::recv_activation: return "recv_activation";
    case action_kind::send_gradient: return "send_gradient";
    case action_kind::recv_gradient: return "recv_gradient";
  }
  return "unknown";
}

//! One step of one rank. A send or receive with `with_next` is posted together with the next
//! one (a group, as communicator::exchange issues it): the group completes when each of its
//! messages has met its counterpart, in whatever order, which is how 1F1B's steady state sends
//! an activation and receives a gradient without a cycle of blocking sends.
struct action {
  action_kind kind;
  int micro_batch;
  int stage;
  bool with_next = false;
  friend bool operator==(const action&, const action&) = default;
};

inline std::string describe(const action& a) {
  return trident::detail::concat(name_of(a.kind), "(micro-batch ", a.micro_batch, ", stage ", a.stage, ")");
}

//! What every rank does, in order. Stage s runs on rank s % ranks.
struct schedule {
  std::string name;
  int stages = 0;
  int ranks = 0;
  int micro_batches = 0;
  std::vector<std::vector<action>> actions;  // per rank

  int rank_of(int stage) const noexcept { return stage % ranks; }
};

namespace detail {

// A schedule holds a few actions per (micro-batch, stage): past this many its lists take
// gigabytes and the generators' int arithmetic (2 p, v m, ...) comes near overflowing.
inline constexpr std::int64_t max_computations = std::int64_t{1} << 24;

inline void check_sizes(const char* who, int p, int m, int v = 1) {
  TRIDENT_EXPECT(p >= 1 && m >= 1, who, "(", p, " stages, ", m, " micro-batches): expected at least one of each");
  const std::int64_t computations = std::int64_t{p} * std::int64_t{m} * std::int64_t{v};
  TRIDENT_EXPECT(computations <= max_computations && std::int64_t{p} * v <= max_computations, who, "(", p, " ranks, ", m,
                 " micro-batches", v > 1 ? trident::detail::concat(", ", v, " chunks") : std::string(), "): ", computations,
                 " (micro-batch, stage) computations; expected at most ", max_computations);
}

// The forward of (mb, stage s) on its rank, with the receive before and the send after it.
inline void push_forward(std::vector<action>& out, int mb, int s, int p) {
  if (s > 0) out.push_back({action_kind::recv_activation, mb, s});
  out.push_back({action_kind::forward, mb, s});
  if (s < p - 1) out.push_back({action_kind::send_activation, mb, s});
}
inline void push_backward(std::vector<action>& out, int mb, int s, int p) {
  if (s < p - 1) out.push_back({action_kind::recv_gradient, mb, s});
  out.push_back({action_kind::backward, mb, s});
  if (s > 0) out.push_back({action_kind::send_gradient, mb, s});
}

}  // namespace detail

//! GPipe: on every rank all m forwards, then all m backwards; a stage per rank. Peak: m
//! micro-batches of activations on every rank.
inline schedule gpipe(int p, int m) {
  detail::check_sizes("gpipe", p, m);
  schedule s{"gpipe", p, p, m, std::vector<std::vector<action>>(static_cast<std::size_t>(p))};
  for (int r = 0; r < p; ++r) {
    auto& out = s.actions[static_cast<std::size_t>(r)];
    for (int mb = 0; mb < m; ++mb) detail::push_forward(out, mb, r, p);
    for (int mb = 0; mb < m; ++mb) detail::push_backward(out, mb, r, p);
  }
  return s;
}

//! 1F1B: rank r runs min(p - r - 1, m) forwards, then alternates one forward and one backward,
//! then drains the backwards; at most p - r micro-batches of activations live on rank r.
//! Megatron-LM's order: in the steady state the activation just computed goes out together
//! with the receipt of the oldest micro-batch's output gradient, and that backward's input
//! gradient goes out together with the receipt of the next micro-batch's input (two groups per
//! step; one blocking send after the other would deadlock, which validate() finds).
inline schedule one_f_one_b(int p, int m) {
  detail::check_sizes("one_f_one_b", p, m);
  schedule s{"1f1b", p, p, m, std::vector<std::vector<action>>(static_cast<std::size_t>(p))};
  for (int r = 0; r < p; ++r) {
    auto& out = s.actions[static_cast<std::size_t>(r)];
    const bool first = r == 0, last = r == p - 1;
    // Appends a group of the given sends and receives (those that exist on this rank).
    auto group = [&](std::initializer_list<action> ops) {
      const std::size_t begin = out.size();
      for (const action& a : ops) {
        const bool exists = (a.kind == action_kind::send_activation || a.kind == action_kind::recv_gradient) ? !last : !first;
        if (exists) out.push_back(a);
      }
      for (std::size_t i = begin; i + 1 < out.size(); ++i) out[i].with_next = true;
    };
    const int warmup = std::min(p - r - 1, m), steady = m - warmup;
    for (int mb = 0; mb < warmup; ++mb) detail::push_forward(out, mb, r, p);
    if (steady > 0) group({{action_kind::recv_activation, warmup, r}});
    for (int i = 0; i < steady; ++i) {
      const int f = warmup + i, b = i;
      out.push_back({action_kind::forward, f, r});
      group({{action_kind::send_activation, f, r}, {action_kind::recv_gradient, b, r}});
      out.push_back({action_kind::backward, b, r});
      if (i + 1 < steady) group({{action_kind::send_gradient, b, r}, {action_kind::recv_activation, f + 1, r}});
      else group({{action_kind::send_gradient, b, r}});
    }
    for (int b = steady; b < m; ++b) detail::push_backward(out, b, r, p);
  }
  return s;
}

namespace detail {

// Python's modulo: never negative (Megatron's chunk arithmetic looks behind the first micro-batch).
constexpr int wrap(int k, int n) noexcept { return ((k % n) + n) % n; }

// A group of sends and receives in one rank's list: what one batched p2p call posts (Megatron's
// send_forward_backward_recv_forward_backward and its smaller siblings). The receives name their
// message later (fill_receives), once every rank's order is known.
inline void push_group(std::vector<action>& out, std::initializer_list<action> ops) {
  const std::size_t begin = out.size();
  for (const action& a : ops)
    if (a.micro_batch >= 0) out.push_back(a);
  for (std::size_t i = begin; i + 1 < out.size(); ++i) out[i].with_next = true;
}

// Gives the i-th receive of each kind on rank r the i-th message that rank needs, in the order
// its computes consume them: messages between two ranks match in issue order, and the senders
// issue in that same order, so this names each receive after the message it will meet.
inline void fill_receives(schedule& s) {
  const int last = s.stages - 1;
  for (int r = 0; r < s.ranks; ++r) {
    auto& list = s.actions[static_cast<std::size_t>(r)];
    std::vector<action> inputs, gradients;  // the computes that need a message, in order
    for (const action& a : list) {
      if (a.kind == action_kind::forward && a.stage > 0 && s.rank_of(a.stage - 1) != r) inputs.push_back(a);
      const bool input_gradient = a.kind == action_kind::backward || a.kind == action_kind::backward_input;
      if (input_gradient && a.stage < last && s.rank_of(a.stage + 1) != r) gradients.push_back(a);
    }
    std::size_t next_input = 0, next_gradient = 0;
    for (action& a : list) {
      auto& from = a.kind == action_kind::recv_activation ? inputs : gradients;
      auto& next = a.kind == action_kind::recv_activation ? next_input : next_gradient;
      if (a.kind != action_kind::recv_activation && a.kind != action_kind::recv_gradient) continue;
      TRIDENT_EXPECT(next < from.size(), "pipeline::", s.name, ": rank ", r, " receives more ",
                     a.kind == action_kind::recv_activation ? "activations" : "gradients", " than it consumes");
      a.micro_batch = from[next].micro_batch;
      a.stage = from[next].stage;
      ++next;
    }
  }
}

}  // namespace detail

//! Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model
//! Training on GPU Clusters Using Megatron-LM", section 2.2.2): each rank holds v model chunks,
//! so there are v x p stages and stage s runs on rank s % p (chunk s / p). Rank r runs the
//! chunks' forwards in groups of p micro-batches per chunk (micro-batches 0..p-1 through chunk
//! 0, then through chunk 1, ..., then p..2p-1 through chunk 0, ...), with
//! min(2 (p - r - 1) + (v - 1) p, v m) warm-up forwards (all v m when m = p), then one forward
//! and one backward in turn, then the remaining backwards; backwards take the chunks in reverse.
//!
//! Communication is Megatron's: after each compute step one group posts the sends of what was
//! just computed together with the receives for the next step (send_forward_recv_forward in
//! the warm-up, send_forward_backward_recv_forward_backward, up to four messages, in the steady
//! state, send_backward_recv_backward in the cool-down). A receive is thus posted a whole step
//! before its consumer, which is what keeps the ring of chunks (rank p - 1 feeds rank 0's next
//! chunk) free of deadlock; receives posted right before their consumer (from_compute_order)
//! deadlock here.
//!
//! Expects m a multiple of p (Megatron's condition: the micro-batches go through the chunks in
//! groups of p). With equal costs per chunk (forward F / v, backward B / v) and no latency the
//! bubble is the published (p - 1) / (v m + p - 1): the 1F1B bubble's idle time divided by v.
//! Peak activations, in chunk-micro-batches (one micro-batch through one chunk): Megatron's
//! warm-up plus the steady state's forward, min(2 (p - r - 1) + (v - 1) p + 1, v m) on rank r;
//! on rank 0, (v + 1) p - 1 when m > p (with v = 1 this is 2p - 1, against 1F1B's p).
//!
//!   const auto s = trident::pipeline::interleaved_one_f_one_b(4, 8, 2);  // 8 stages on 4 ranks
//!   trident::pipeline::validate(s);
inline schedule interleaved_one_f_one_b(int p, int m, int v) {
  TRIDENT_EXPECT(p >= 1 && m >= 1 && v >= 1, "interleaved_one_f_one_b(", p, " ranks, ", m, " micro-batches, ", v,
                 " chunks): expected at least one of each");
  TRIDENT_EXPECT(m % p == 0, "interleaved_one_f_one_b(", p, " ranks, ", m, " micro-batches, ", v,
                 " chunks): expected the micro-batches to be a multiple of the ranks (", p,
                 ", 2 x ", p, ", ...), as Megatron-LM's interleaved schedule requires");
  detail::check_sizes("interleaved_one_f_one_b", p, m, v);
  const int stages = v * p, last = stages - 1, total = v * m;
  schedule s{"interleaved-1f1b", stages, p, m, std::vector<std::vector<action>>(static_cast<std::size_t>(p))};
  // Megatron's virtual micro-batch k: which micro-batch and which chunk, forwards and backwards.
  auto chunk_f = [&](int k) { return detail::wrap(k, p * v) / p; };
  auto chunk_b = [&](int k) { return v - 1 - chunk_f(k); };
  auto micro_batch = [&](int k) { return (k / (p * v)) * p + k % p; };
  constexpr action none{action_kind::forward, -1, -1};  // a message this step does not have
  for (int r = 0; r < p; ++r) {
    auto& out = s.actions[static_cast<std::size_t>(r)];
    const bool first = r == 0, last_rank = r == p - 1, alone = p == 1;  // alone: every chunk here, no messages
    auto forward = [&](int k) { return action{action_kind::forward, micro_batch(k), chunk_f(k) * p + r}; };
    auto backward = [&](int k) { return action{action_kind::backward, micro_batch(k), chunk_b(k) * p + r}; };
    // The messages of one step; receives get their micro-batch and stage from fill_receives.
    auto send_f = [&](int k) {
      const action f = forward(k);
      return f.stage < last && !alone ? action{action_kind::send_activation, f.micro_batch, f.stage} : none;
    };
    auto send_b = [&](int k) {
      const action b = backward(k);
      return b.stage > 0 && !alone ? action{action_kind::send_gradient, b.micro_batch, b.stage} : none;
    };
    auto recv_f = [&](bool yes) { return yes && !alone ? action{action_kind::recv_activation, 0, 0} : none; };
    auto recv_b = [&](bool yes) { return yes && !alone ? action{action_kind::recv_gradient, 0, 0} : none; };
    const int warmup = m == p ? total : std::min(2 * (p - r - 1) + (v - 1) * p, total);
    const bool all_warmup = warmup == total;
    const int steady = total - warmup;
    detail::push_group(out, {recv_f(!first)});
    for (int k = 0; k < warmup; ++k) {
      out.push_back(forward(k));
      const bool recv_prev = !(first && chunk_f(k + 1) == 0) && k != total - 1;
      // The last warm-up step also fetches the first backward's output gradient.
      const bool recv_next = k == warmup - 1 && !all_warmup && !last_rank;
      detail::push_group(out, {send_f(k), recv_f(recv_prev), recv_b(recv_next)});
    }
    for (int k = 0; k < steady; ++k) {
      const int fk = warmup + k, bk = k;
      out.push_back(forward(fk));
      out.push_back(backward(bk));
      // Rank 0 is p - 1 steps ahead of rank p - 1 (and the other way round for gradients): what
      // arrives now is what the peer computed p - 1 steps ago, nothing when that was its last chunk.
      bool recv_prev = first ? chunk_f(fk - (p - 1)) != v - 1 : true;
      const bool recv_next = last_rank ? chunk_b(bk - (p - 1)) != 0 : true;
      if (k == steady - 1) recv_prev = false;
      detail::push_group(out, {send_f(fk), send_b(bk), recv_f(recv_prev), recv_b(recv_next)});
    }
    if (all_warmup) detail::push_group(out, {recv_b(!last_rank)});
    for (int k = steady; k < total; ++k) {
      out.push_back(backward(k));
      const bool recv_next = !(last_rank && chunk_b(k + 1) == v - 1) && k != total - 1;
      detail::push_group(out, {send_b(k), recv_b(recv_next)});
    }
  }
  detail::fill_receives(s);
  return s;
}

namespace detail {

// The zero-bubble schedules, built in two passes.
//
// First, each rank's order of computes, from a run with unit costs (F = B = W = 1, messages
// free): the forwards and backward_inputs keep 1F1B's order after `warmup[r]` forwards, and a
// rank runs its oldest pending backward_weight whenever its next F or B cannot start yet, or
// when that next one is a forward and it already holds `in_flight` micro-batches whose W has
// not run (the papers' memory rule), and runs the rest at the end. This is where Qi et al.'s
// figures put the W's: in the bubbles that 1F1B would leave.
//
// Second, the messages: each is posted on both sides at the time its producer finished in that
// run (a group per rank and time), so in that run no rank ever waits for a peer. The groups
// carry their times in increasing order on every rank, and a message's two ends have the same
// time, so the blocked group with the smallest time always finds its peers at that same group:
// no deadlock whatever the real costs are.
inline schedule zero_bubble(std::string name, int p, int m, const std::vector<int>& warmup, int in_flight) {
  const auto n = static_cast<std::size_t>(p);
  std::vector<std::vector<action>> fb(n);  // each rank's forwards and backward_inputs, 1F1B's order
  for (int r = 0; r < p; ++r) {
    auto& list = fb[static_cast<std::size_t>(r)];
    const int w = std::min(warmup[static_cast<std::size_t>(r)], m);
    for (int k = 0; k < w; ++k) list.push_back({action_kind::forward, k, r});
    for (int i = 0; i < m - w; ++i) {
      list.push_back({action_kind::forward, w + i, r});
      list.push_back({action_kind::backward_input, i, r});
    }
    for (int b = m - w; b < m; ++b) list.push_back({action_kind::backward_input, b, r});
  }
  struct timed {
    action what;
    int start;
  };
  std::vector<std::vector<timed>> order(n);
  std::vector<std::vector<int>> forward_end(n, std::vector<int>(static_cast<std::size_t>(m), -1)), backward_end = forward_end;
  std::vector<std::size_t> at(n, 0);
  std::vector<int> forwards(n, 0), weights(n, 0), oldest_w(n, 0), inputs(n, 0);
  auto done_by = [](int end, int t) { return end >= 0 && end <= t; };
  for (int t = 0, left = 3 * m * p; left > 0; ++t) {
    for (std::size_t r = 0; r < n; ++r) {
      const bool pending_w = oldest_w[r] < inputs[r];
      if (at[r] < fb[r].size()) {
        const action& a = fb[r][at[r]];
        const auto mb = static_cast<std::size_t>(a.micro_batch);
        const bool ready = a.kind == action_kind::forward ? (r == 0 || done_by(forward_end[r - 1][mb], t))
                                                          : (r + 1 == n || done_by(backward_end[r + 1][mb], t));
        const bool held = a.kind == action_kind::forward && forwards[r] - weights[r] >= in_flight && pending_w;
        if (ready && !held) {
          order[r].push_back({a, t});
          ++at[r];
          --left;
          if (a.kind == action_kind::forward) {
            forward_end[r][mb] = t + 1;
            ++forwards[r];
          } else {
            backward_end[r][mb] = t + 1;
            ++inputs[r];
          }
          continue;
        }
      }
      if (pending_w) {
        order[r].push_back({{action_kind::backward_weight, oldest_w[r]++, static_cast<int>(r)}, t});
        ++weights[r];
        --left;
      }
    }
  }
  // Messages at the time their producer finished, on both ranks.
  std::vector<std::map<int, std::vector<action>>> groups(n);
  for (std::size_t r = 0; r < n; ++r)
    for (const auto& [a, start] : order[r]) {
      if (a.kind == action_kind::forward && r + 1 < n) {
        groups[r][start + 1].push_back({action_kind::send_activation, a.micro_batch, a.stage});
        groups[r + 1][start + 1].push_back({action_kind::recv_activation, a.micro_batch, a.stage + 1});
      }
      if (a.kind == action_kind::backward_input && r > 0) {
        groups[r][start + 1].push_back({action_kind::send_gradient, a.micro_batch, a.stage});
        groups[r - 1][start + 1].push_back({action_kind::recv_gradient, a.micro_batch, a.stage - 1});
      }
    }
  schedule s{std::move(name), p, p, m, std::vector<std::vector<action>>(n)};
  for (std::size_t r = 0; r < n; ++r) {
    auto& out = s.actions[r];
    auto g = groups[r].begin();
    auto post_until = [&](int t) {
      for (; g != groups[r].end() && g->first <= t; ++g) {
        for (std::size_t i = 0; i < g->second.size(); ++i) {
          out.push_back(g->second[i]);
          out.back().with_next = i + 1 < g->second.size();
        }
      }
    };
    for (const auto& [a, start] : order[r]) {
      post_until(start);
      out.push_back(a);
    }
    post_until(std::numeric_limits<int>::max());
  }
  return s;
}

}  // namespace detail

//! ZB-H1, the memory-efficient zero-bubble schedule (Qi et al. 2023, "Zero Bubble Pipeline
//! Parallelism", ICLR 2024, section 2.1): the backward is split into backward_input (B, the
//! gradient sent upstream) and backward_weight (W, local, any time after B). Forwards and B's
//! keep 1F1B's order (p - r - 1 warm-up forwards on rank r), so at most p - r micro-batches
//! wait for their B on rank r, as in 1F1B; the W's go where 1F1B would idle, with at most p
//! micro-batches whose W has not run on any rank (the paper's "same number of in-flight
//! micro-batches"), the rest fill the tail.
//!
//! Bubble: the paper's (p - 1)(T_F + T_B - T_W) idle time per rank, against 1F1B's
//! (p - 1)(T_F + T_B + T_W): with F = B = W and no latency, a bubble fraction of
//! (p - 1) / (3m + p - 1) for m >= p, a third of 1F1B's idle time (the simulation gives it
//! exactly). For m < p the chain of B's bounds it: a makespan of 2(m + p) - 1 units.
//! Messages are grouped by when they are ready (see detail::zero_bubble), not as 1F1B pairs them.
//!
//!   const auto s = trident::pipeline::zb_h1(4, 8);
//!   trident::pipeline::simulate(s, {.backward_input = 1, .backward_weight = 1}).bubble;  // 3 / 27
inline schedule zb_h1(int p, int m) {
  detail::check_sizes("zb_h1", p, m);
  std::vector<int> warmup(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) warmup[static_cast<std::size_t>(r)] = p - r - 1;
  return detail::zero_bubble("zb-h1", p, m, warmup, p);
}

//! ZB-H2, the zero-bubble schedule (Qi et al. 2023, section 2.2): like ZB-H1, with p - 1 more
//! warm-up forwards on every rank (2 (p - r - 1) on rank r), so that the first B reaches each
//! rank just as its forwards run out: at most 2 (p - r) - 1 micro-batches wait for their B on
//! rank r, 2p - 1 on rank 0 (the paper's (2p - 1) M_B), and at most 2p - 1 wait for their W.
//!
//! Bubble: with F = B = W, no latency and m >= 2p - 1 every rank computes without a gap from
//! its first forward to its last W (simulation::span_bubble is 0: the paper's zero bubble,
//! which needs the next iteration to start without a flush, e.g. its optimizer post-validation).
//! Within one flushed iteration the ranks still start p - 1 units apart, so the bubble
//! fraction is that of ZB-H1, (p - 1) / (3m + p - 1).
//!
//!   const auto s = trident::pipeline::zb_h2(4, 8);
//!   trident::pipeline::simulate(s, {.backward_input = 1, .backward_weight = 1}).span_bubble;  // 0
inline schedule zb_h2(int p, int m) {
  detail::check_sizes("zb_h2", p, m);
  std::vector<int> warmup(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) warmup[static_cast<std::size_t>(r)] = 2 * (p - r - 1);
  return detail::zero_bubble("zb-h2", p, m, warmup, 2 * p - 1);
}

namespace detail {

[[noreturn]] inline void reject(const schedule& s, int rank, std::size_t index, const action& a, const std::string& why) {
  throw usage_error(trident::detail::concat("pipeline schedule '", s.name, "': rank ", rank, ", action ", index, " (", describe(a), "): ", why));
}

// The message a send or receive stands for: (from rank, to rank, kind, micro-batch, sending stage).
struct message {
  int from, to;
  bool gradient;
  int micro_batch, stage;
  friend bool operator==(const message&, const message&) = default;
};

inline bool is_p2p(action_kind k) noexcept {
  return k == action_kind::send_activation || k == action_kind::recv_activation || k == action_kind::send_gradient ||
         k == action_kind::recv_gradient;
}
inline bool is_send(action_kind k) noexcept { return k == action_kind::send_activation || k == action_kind::send_gradient; }

inline message message_of(const schedule& s, const action& a) {
  switch (a.kind) {
    case action_kind::send_activation: return {s.rank_of(a.stage), s.rank_of(a.stage + 1), false, a.micro_batch, a.stage};
    case action_kind::recv_activation: return {s.rank_of(a.stage - 1), s.rank_of(a.stage), false, a.micro_batch, a.stage - 1};
    case action_kind::send_gradient: return {s.rank_of(a.stage), s.rank_of(a.stage - 1), true, a.micro_batch, a.stage};
    case action_kind::recv_gradient: return {s.rank_of(a.stage + 1), s.rank_of(a.stage), true, a.micro_batch, a.stage + 1};
    default: return {};
  }
}

inline std::string describe(const message& m) {
  return trident::detail::concat(m.gradient ? "the gradient" : "the activation", " of micro-batch ", m.micro_batch, " from stage ", m.stage,
                " (rank ", m.from, " to rank ", m.to, ")");
}

}  // namespace detail

//! A schedule from each rank's order of compute actions (forward, backward, backward_input,
//! backward_weight): the sends and receives between stages on different ranks are inserted
//! (a receive before the compute that needs it, a send after the compute that makes it), and
//! those between two computes are posted as one group, as Megatron-LM pairs them in 1F1B
//! (send_forward_recv_backward, ...): how users hand in their own schedules. Orders that need
//! a receive posted earlier than the compute just before its consumer (Megatron's interleaved
//! schedule prefetches across chunks) deadlock this way; validate() says where.
inline schedule from_compute_order(std::string name, int stages, int ranks, int micro_batches,
                                   const std::vector<std::vector<action>>& compute) {
  TRIDENT_EXPECT(ranks >= 1 && stages >= ranks && stages % ranks == 0 && micro_batches >= 1, "pipeline::from_compute_order(",
                 name, "): ", stages, " stages on ", ranks, " ranks and ", micro_batches,
                 " micro-batches; expected a whole number of stages per rank and at least one micro-batch");
  TRIDENT_EXPECT(compute.size() == static_cast<std::size_t>(ranks), "pipeline::from_compute_order(", name, "): orders for ",
                 compute.size(), " ranks; expected ", ranks);
  schedule s{std::move(name), stages, ranks, micro_batches, std::vector<std::vector<action>>(static_cast<std::size_t>(ranks))};
  const int last = stages - 1;
  for (int r = 0; r < ranks; ++r) {
    auto& out = s.actions[static_cast<std::size_t>(r)];
    std::vector<action> pending;  // sends after the previous compute, receives before the next
    auto flush = [&] {
      for (std::size_t i = 0; i < pending.size(); ++i) {
        pending[i].with_next = i + 1 < pending.size();
        out.push_back(pending[i]);
      }
      pending.clear();
    };
    for (const action& a : compute[static_cast<std::size_t>(r)]) {
      TRIDENT_EXPECT(!detail::is_p2p(a.kind) && !a.with_next, "pipeline::from_compute_order(", s.name, "): rank ", r,
                     " lists ", describe(a), "; expected compute actions only (the sends and receives are inserted)");
      const bool remote_in = a.stage > 0 && s.rank_of(a.stage - 1) != r;
      const bool remote_out = a.stage < last && s.rank_of(a.stage + 1) != r;
      if (a.kind == action_kind::forward && remote_in) pending.push_back({action_kind::recv_activation, a.micro_batch, a.stage});
      const bool input_gradient = a.kind == action_kind::backward || a.kind == action_kind::backward_input;
      if (input_gradient && remote_out) pending.push_back({action_kind::recv_gradient, a.micro_batch, a.stage});
      flush();
      out.push_back(a);
      if (a.kind == action_kind::forward && remote_out) pending.push_back({action_kind::send_activation, a.micro_batch, a.stage});
      if (input_gradient && remote_in) pending.push_back({action_kind::send_gradient, a.micro_batch, a.stage});
    }
    flush();
  }
  return s;
}

//! Throws usage_error naming the rank, the action and the reason when `s` is not a correct
//! schedule (see the header comment for what is checked).
inline void validate(const schedule& s) {
  const char* head = "pipeline::validate";
  TRIDENT_EXPECT(s.ranks >= 1 && s.stages >= s.ranks && s.stages % s.ranks == 0 && s.micro_batches >= 1, head, ": schedule '",
                 s.name, "' has ", s.stages, " stages on ", s.ranks, " ranks and ", s.micro_batches,
                 " micro-batches; expected a whole number of stages per rank and at least one micro-batch");
  TRIDENT_EXPECT(s.actions.size() == static_cast<std::size_t>(s.ranks), head, ": schedule '", s.name, "' has action lists for ",
                 s.actions.size(), " ranks; expected ", s.ranks);
  const int last = s.stages - 1;
  using key = std::pair<int, int>;  // (micro-batch, stage)
  std::map<key, int> forwards, backwards, inputs, weights;
  // Shape, and each rank's own order.
  for (int r = 0; r < s.ranks; ++r) {
    const auto& list = s.actions[static_cast<std::size_t>(r)];
    std::map<key, bool> arrived_act, arrived_grad, done_f, done_b, sent;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const action& a = list[i];
      auto fail = [&](const std::string& why) { detail::reject(s, r, i, a, why); };
      if (a.micro_batch < 0 || a.micro_batch >= s.micro_batches || a.stage < 0 || a.stage > last)
        fail(trident::detail::concat("outside the schedule's ", s.micro_batches, " micro-batches and stages 0..", last));
      if (s.rank_of(a.stage) != r) fail(trident::detail::concat("stage ", a.stage, " runs on rank ", s.rank_of(a.stage), ", not here"));
      if (a.with_next && (!detail::is_p2p(a.kind) || i + 1 >= list.size() || !detail::is_p2p(list[i + 1].kind)))
        fail("grouped with the next action (with_next), but only sends and receives form groups");
      const key k{a.micro_batch, a.stage};
      const bool local_in = a.stage > 0 && s.rank_of(a.stage - 1) == r;     // the previous stage is on this rank
      const bool local_out = a.stage < last && s.rank_of(a.stage + 1) == r;  // so is the next
      switch (a.kind) {
        case action_kind::forward:
          if (++forwards[k] > 1) fail("a second forward of this micro-batch and stage");
          if (a.stage > 0 && !(local_in ? done_f[{a.micro_batch, a.stage - 1}] : arrived_act[k]))
            fail(local_in ? "before the forward of the previous stage on this rank"
                          : "before its input arrived (no recv_activation of it earlier on this rank)");
          done_f[k] = true;
          break;
        case action_kind::backward:
        case action_kind::backward_input: {
          if (++backwards[k] > 1) fail("a second backward of this micro-batch and stage");
          if (a.kind == action_kind::backward_input) ++inputs[k];
          if (!done_f[k]) fail("before the forward of this micro-batch and stage");
          if (a.stage < last && !(local_out ? done_b[{a.micro_batch, a.stage + 1}] : arrived_grad[k]))
            fail(local_out ? "before the backward of the next stage on this rank"
                           : "before its output gradient arrived (no recv_gradient of it earlier on this rank)");
          done_b[k] = true;
          break;
        }
        case action_kind::backward_weight:
          if (++weights[k] > 1) fail("a second backward_weight of this micro-batch and stage");
          if (inputs[k] == 0) fail("before backward_input of this micro-batch and stage (W needs B's gradient)");
          break;
        case action_kind::send_activation:
          if (a.stage == last || local_out) fail("nothing to send: the next stage is not on another rank");
          if (!done_f[k]) fail("before the forward that computes it");
          if (sent[{a.micro_batch, 2 * a.stage}]) fail("sent twice");
          sent[{a.micro_batch, 2 * a.stage}] = true;
          break;
        case action_kind::send_gradient:
          if (a.stage == 0 || local_in) fail("nothing to send: the previous stage is not on another rank");
          if (!done_b[k]) fail("before the backward that computes it");
          if (sent[{a.micro_batch, 2 * a.stage + 1}]) fail("sent twice");
          sent[{a.micro_batch, 2 * a.stage + 1}] = true;
          break;
        case action_kind::recv_activation:
          if (a.stage == 0 || local_in) fail("nothing to receive: the previous stage is not on another rank");
          if (arrived_act[k]) fail("received twice");
          arrived_act[k] = true;
          break;
        case action_kind::recv_gradient:
          if (a.stage == last || local_out) fail("nothing to receive: the next stage is not on another rank");
          if (arrived_grad[k]) fail("received twice");
          arrived_grad[k] = true;
          break;
        default:  // a value cast into the enum: the executor would skip it silently
          fail(trident::detail::concat("kind ", static_cast<int>(a.kind), " is not an action_kind"));
      }
    }
  }
  // Exactly once, everywhere.
  for (int mb = 0; mb < s.micro_batches; ++mb)
    for (int st = 0; st <= last; ++st) {
      const key k{mb, st};
      const int r = s.rank_of(st);
      const action probe{action_kind::forward, mb, st};
      const std::size_t end = s.actions[static_cast<std::size_t>(r)].size();
      if (forwards[k] == 0) detail::reject(s, r, end, probe, "this micro-batch and stage has no forward");
      if (backwards[k] == 0) detail::reject(s, r, end, {action_kind::backward, mb, st}, "this micro-batch and stage has no backward");
      if (inputs[k] == 1 && weights[k] == 0)
        detail::reject(s, r, end, {action_kind::backward_weight, mb, st},
                       "backward_input without backward_weight: the weight gradient is never computed");
    }
  // Links: sends and receives between each ordered pair of ranks, the same messages in order.
  std::map<std::pair<int, int>, std::vector<std::pair<detail::message, std::size_t>>> sends, recvs;
  for (int r = 0; r < s.ranks; ++r) {
    const auto& list = s.actions[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (!detail::is_p2p(list[i].kind)) continue;
      const auto m = detail::message_of(s, list[i]);
      (detail::is_send(list[i].kind) ? sends : recvs)[{m.from, m.to}].push_back({m, i});
    }
  }
  for (const auto& [link, out] : sends) {
    const auto& in = recvs[link];
    for (std::size_t j = 0; j < out.size(); ++j) {
      const auto& a = s.actions[static_cast<std::size_t>(link.first)][out[j].second];
      if (j >= in.size())
        detail::reject(s, link.first, out[j].second, a, trident::detail::concat("rank ", link.second, " never receives ", describe(out[j].first)));
      if (!(in[j].first == out[j].first))
        detail::reject(s, link.first, out[j].second, a,
                       trident::detail::concat("messages from rank ", link.first, " to rank ", link.second, " match in issue order, and "
                                      "this send (message ", j + 1, " on the link) meets rank ", link.second, "'s receive of ",
                                      describe(in[j].first), " (its action ", in[j].second, "): crossed"));
    }
  }
  for (const auto& [link, in] : recvs) {
    const auto& out = sends[link];
    if (in.size() > out.size()) {
      const auto& extra = in[out.size()];
      detail::reject(s, link.second, extra.second, s.actions[static_cast<std::size_t>(link.second)][extra.second],
                     trident::detail::concat("rank ", link.first, " never sends ", describe(extra.first)));
    }
  }
  // No deadlock: run every list. A group of sends and receives is posted at once; a message
  // completes when both its send and its receive are posted; a rank moves past the group when
  // all of its messages completed (one send alone completes only with its receive).
  std::vector<std::size_t> at(static_cast<std::size_t>(s.ranks), 0);
  std::vector<std::vector<bool>> done(static_cast<std::size_t>(s.ranks));
  for (int r = 0; r < s.ranks; ++r) done[static_cast<std::size_t>(r)].assign(s.actions[static_cast<std::size_t>(r)].size(), false);
  auto group_end = [&](int r, std::size_t i) {
    const auto& list = s.actions[static_cast<std::size_t>(r)];
    while (i < list.size() && detail::is_p2p(list[i].kind) && list[i].with_next) ++i;
    return std::min(i + 1, list.size());
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.ranks; ++r) {
      auto& i = at[static_cast<std::size_t>(r)];
      const auto& list = s.actions[static_cast<std::size_t>(r)];
      while (i < list.size()) {
        if (!detail::is_p2p(list[i].kind)) {
          ++i;
          progress = true;
          continue;
        }
        const std::size_t end = group_end(r, i);
        for (std::size_t k = i; k < end; ++k) {
          if (done[static_cast<std::size_t>(r)][k]) continue;
          const auto m = detail::message_of(s, list[k]);
          const int peer = detail::is_send(list[k].kind) ? m.to : m.from;
          const auto& other = s.actions[static_cast<std::size_t>(peer)];
          const std::size_t j0 = at[static_cast<std::size_t>(peer)];
          if (j0 >= other.size() || !detail::is_p2p(other[j0].kind)) continue;
          for (std::size_t j = j0; j < group_end(peer, j0); ++j)
            if (!done[static_cast<std::size_t>(peer)][j] && detail::is_send(other[j].kind) != detail::is_send(list[k].kind) &&
                detail::message_of(s, other[j]) == m) {
              done[static_cast<std::size_t>(r)][k] = done[static_cast<std::size_t>(peer)][j] = true;
              progress = true;
              break;
            }
        }
        bool all = true;
        for (std::size_t k = i; k < end; ++k) all = all && done[static_cast<std::size_t>(r)][k];
        if (!all) break;
        i = end;
        progress = true;
      }
    }
  }
  for (int r = 0; r < s.ranks; ++r) {
    const auto i = at[static_cast<std::size_t>(r)];
    const auto& list = s.actions[static_cast<std::size_t>(r)];
    if (i < list.size()) {
      std::string others;
      for (int q = 0; q < s.ranks; ++q) {
        const auto j = at[static_cast<std::size_t>(q)];
        if (q != r && j < s.actions[static_cast<std::size_t>(q)].size())
          others += trident::detail::concat("; rank ", q, " waits in ", describe(s.actions[static_cast<std::size_t>(q)][j]));
      }
      detail::reject(s, r, i, list[i],
                     trident::detail::concat("deadlock with blocking point-to-point: this waits for a peer that waits too", others));
    }
  }
}

}  // namespace trident::pipeline
