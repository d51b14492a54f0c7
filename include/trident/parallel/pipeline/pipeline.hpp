#pragma once
// pipeline<Stages...>: a compile-time list of user stages spread over the ranks of a pipeline
// communicator, and the executor that runs any validated schedule over it (issue 12).
//
//   concept stage_message<M, Space>  what goes between stages: a contiguous buffer of one element
//                                    type in the communicator's space, made from an element count
//                                    (std::vector<float>, trident::buffer<T, Space>)
//   concept stage<S>                 input_type, output_type, input_numel(), output_numel(),
//                                    forward(x, micro_batch) -> output, backward(dy, micro_batch)
//                                    -> input gradient (accumulating its weight gradients)
//   concept split_stage<S>           also backward_input(dy, mb) -> input gradient and
//                                    backward_weight(mb): what zero-bubble schedules run
//   class pipeline<Stages...>        stage k lives on rank k % ranks (several per rank =
//                                    virtual stages); run(comm, schedule, input, loss, on_ready)
//   uniform_pipeline<Stage, N>       pipeline<Stage, ..., Stage> (N times)
//
// A type opts in as a stage by having the members stage<S> lists; nothing to derive from. The
// stage keeps what its backward needs, keyed by the micro-batch id it is given, and frees it in
// backward (or backward_weight): the executor holds only messages in flight.
//
// Checked at compile time: stage k's output_type is stage k + 1's input_type (the error names
// both and k). Checked when a pipeline is made (collective over the pipeline communicator, so
// every rank throws the same usage_error and none hangs): every rank has the same list of
// stages (count and types), the count is a multiple of the ranks, and stage k's output_numel()
// equals stage k + 1's input_numel() across ranks. Checked when a schedule first runs: it
// passes validate(), it has this pipeline's stages and ranks, every rank runs the same one,
// and a schedule that splits backward has split stages.
//
// Execution: a rank runs its list in order. A group of sends and receives (with_next) is
// posted at once with exchange_async; the rank goes on computing and waits for the group only
// when a compute needs what it receives or before the next group, so transfers overlap compute
// where the schedule leaves room and the deadlock analysis of validate() still holds (a rank
// never blocks on a peer between groups). On the last stage loss(y, mb, dy) gives the micro-
// batch's loss and the gradient of the stage's output; losses come back per micro-batch on
// the rank that holds the last stage. on_ready(k) is called as soon as stage k's last weight
// gradient is done, which is where a trainer starts stage k's data-parallel reduction so that
// it overlaps the pipeline's drain.
//
//   namespace pp = trident::pipeline;
//   pp::uniform_pipeline<my_stage, 4> pipe(comm, [&](auto k) { return my_stage(layers_of(k)); });
//   const auto s = pp::one_f_one_b(comm.size(), 8);
//   auto out = pipe.run(comm, s, [&](int mb) -> const auto& { return batches[mb]; },
//                       [&](const auto& y, int mb, auto& dy) { return my_loss(y, targets[mb], dy); },
//                       [&](int k) { /* stage k's gradients are complete */ });
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/core/space_span.hpp"
#include "trident/exec/trace.hpp"
#include "trident/parallel/pipeline/schedule.hpp"

namespace trident::pipeline {

//! A message between stages: contiguous elements of one element type in `Space`, made empty
//! from an element count (the receiver sizes it from the stage's input_numel()/output_numel()).
template <class M, class Space>
concept stage_message = std::movable<M> && span_source<M&, Space> && span_source<const M&, Space> &&
                        std::constructible_from<M, std::size_t>;

//! A pipeline stage. forward(x, mb) returns the output of micro-batch mb and keeps what the
//! backward of mb needs; backward(dy, mb) returns the gradient of the input and adds the
//! weight gradients of mb to the stage's accumulators.
template <class S>
concept stage = requires { typename S::input_type; typename S::output_type; } &&
                requires(S& s, const S& cs, const typename S::input_type& x, const typename S::output_type& dy, int mb) {
                  { cs.input_numel() } -> std::convertible_to<std::size_t>;
                  { cs.output_numel() } -> std::convertible_to<std::size_t>;
                  { s.forward(x, mb) } -> std::convertible_to<typename S::output_type>;
                  { s.backward(dy, mb) } -> std::convertible_to<typename S::input_type>;
                };

//! A stage whose backward splits into the input gradient (B) and, later, the weight gradient
//! (W), as zero-bubble schedules need.
template <class S>
concept split_stage = stage<S> && requires(S& s, const typename S::output_type& dy, int mb) {
  { s.backward_input(dy, mb) } -> std::convertible_to<typename S::input_type>;
  s.backward_weight(mb);
};

namespace detail {

// The error names K and both types (they appear in the instantiation of this template).
template <std::size_t K, class OutputOfK, class InputOfNext>
constexpr bool chain_link() {
  static_assert(std::same_as<OutputOfK, InputOfNext>,
                "trident::pipeline: the output_type of stage K must be the input_type of stage K + 1 (see the "
                "template arguments of chain_link<K, OutputOfK, InputOfNext>)");
  return true;
}

template <class... S, std::size_t... K>
constexpr bool chained(std::index_sequence<K...>) {
  using list = std::tuple<S...>;
  return (chain_link<K, typename std::tuple_element_t<K, list>::output_type,
                     typename std::tuple_element_t<K + 1, list>::input_type>() && ... && true);
}

// FNV-1a: a fingerprint of type names that every process of one binary computes alike.
constexpr std::uint64_t fnv(std::string_view text, std::uint64_t h = 0xcbf29ce484222325ull) noexcept {
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}
template <class T>
std::uint64_t type_hash() {
  return fnv(typeid(T).name());
}
// 0 is "not mine" in the tables the ranks combine with max.
inline std::uint64_t nonzero(std::uint64_t h) noexcept { return h == 0 ? 1 : h; }

inline std::uint64_t schedule_hash(const schedule& s) {
  std::uint64_t h = fnv(s.name);
  auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 0x100000001b3ull; };
  mix(static_cast<std::uint64_t>(s.stages));
  mix(static_cast<std::uint64_t>(s.ranks));
  mix(static_cast<std::uint64_t>(s.micro_batches));
  for (const auto& list : s.actions) {
    mix(list.size());
    for (const action& a : list)
      mix((static_cast<std::uint64_t>(a.kind) << 56) ^ (static_cast<std::uint64_t>(a.micro_batch) << 24) ^
          (static_cast<std::uint64_t>(a.stage) << 1) ^ static_cast<std::uint64_t>(a.with_next));
  }
  return h;
}

// An all-reduce of a few host integers over any communicator: staged through the
// communicator's space when that is not the host (NCCL takes device memory only).
template <class Comm>
std::vector<std::uint64_t> all_reduce_small(Comm& comm, const std::vector<std::uint64_t>& mine, reduce_op op) {
  using Space = typename Comm::space;
  if constexpr (Space::host_accessible) {
    std::vector<std::uint64_t> out(mine.size());
    comm.all_reduce(mine, out, op);
    return out;
  } else {
    buffer<std::uint64_t, Space> in(mine.size()), out(mine.size());
    trident::detail::stage_in(mine.data(), mine.size(), in);  // the collective reads the values, not a DMA in flight
    comm.all_reduce(in, out, op);
    comm.synchronize();
    return to_vector(out);
  }
}

template <class M>
std::size_t numel_of(const M& m) {
  return static_cast<std::size_t>(m.size());
}

}  // namespace detail

template <stage... Stages>
  requires(sizeof...(Stages) >= 1)
class pipeline {
  static_assert(detail::chained<Stages...>(std::make_index_sequence<sizeof...(Stages) - 1>{}));
  using list = std::tuple<Stages...>;

 public:
  static constexpr int stage_count = static_cast<int>(sizeof...(Stages));
  template <std::size_t K>
  using stage_type = std::tuple_element_t<K, list>;
  using input_type = typename stage_type<0>::input_type;
  using output_type = typename stage_type<sizeof...(Stages) - 1>::output_type;

  struct run_result {
    std::vector<double> losses;  // per micro-batch, on the rank of the last stage; empty elsewhere
  };

  //! Collective over `comm` (the pipeline axis): makes the stages this rank owns with
  //! make(std::integral_constant<std::size_t, K>{}) and checks that the ranks agree (see the
  //! header comment).
  template <communicator Comm, class Make>
  pipeline(Comm& comm, Make&& make) : rank_(comm.rank()), ranks_(comm.size()) {
    agree_on_stages(comm);
    TRIDENT_EXPECT(stage_count % ranks_ == 0, "pipeline: ", stage_count, " stages on ", ranks_,
                   " pipeline ranks; expected a multiple of the ranks (stage k runs on rank k % ranks)");
    construct(make, std::make_index_sequence<sizeof...(Stages)>{});
    agree_on_sizes(comm);
  }

  int rank() const noexcept { return rank_; }
  int ranks() const noexcept { return ranks_; }
  bool owns(int k) const noexcept { return k >= 0 && k < stage_count && k % ranks_ == rank_; }

  //! Stage K, when this rank owns it (usage_error otherwise).
  template <std::size_t K>
  stage_type<K>& get() {
    auto& slot = std::get<K>(slots_);
    TRIDENT_EXPECT(slot.stage.has_value(), "pipeline::get<", K, ">: stage ", K, " lives on rank ", K % static_cast<std::size_t>(ranks_),
                   ", not on rank ", rank_);
    return *slot.stage;
  }
  //! Calls f(stage) with stage k (a run-time index) of this rank.
  template <class F>
  void visit(int k, F&& f) {
    TRIDENT_EXPECT(owns(k), "pipeline::visit: stage ", k, " is not on rank ", rank_, " of ", ranks_, " (", stage_count, " stages)");
    dispatch(k, [&](auto& slot) { f(*slot.stage); });
  }

  //! Runs schedule `s` once: input(mb) gives stage 0's input of micro-batch mb (on the rank of
  //! stage 0); loss(y, mb, dy) returns the loss of mb and writes dy, the gradient of the last
  //! stage's output (on its rank); on_ready(k) runs when stage k's weight gradients are complete.
  template <communicator Comm, class Input, class Loss, class Ready = void (*)(int)>
  run_result run(Comm& comm, const schedule& s, Input&& input, Loss&& loss, Ready&& on_ready = [](int) {}) {
    static_assert(stage_message<input_type, typename Comm::space> && stage_message<output_type, typename Comm::space>,
                  "pipeline::run: the messages between stages must be contiguous buffers in the communicator's space "
                  "(std::vector<T> for host communicators, trident::buffer<T, Space>), constructible from a count");
    TRIDENT_EXPECT(comm.rank() == rank_ && comm.size() == ranks_, "pipeline::run: the communicator is rank ", comm.rank(), " of ",
                   comm.size(), "; the pipeline was made on rank ", rank_, " of ", ranks_);
    admit(comm, s);
    run_result out;
    if (owns(stage_count - 1)) out.losses.assign(static_cast<std::size_t>(s.micro_batches), 0.0);
    // Weight gradients still to come per stage, for on_ready.
    std::vector<int> remaining(static_cast<std::size_t>(stage_count), 0);
    for (const action& a : s.actions[static_cast<std::size_t>(rank_)])
      if (a.kind == action_kind::backward || a.kind == action_kind::backward_weight) ++remaining[static_cast<std::size_t>(a.stage)];

    using Space = typename Comm::space;
    using request_type = decltype(comm.exchange_async(std::span<const p2p_op<Space>>{}));
    std::optional<request_type> pending;
    std::vector<std::pair<int, int>> pending_recv_act, pending_recv_grad;  // (stage, mb) in flight
    std::vector<std::pair<int, int>> pending_sends_act, pending_sends_grad;
    auto finish = [&] {
      if (!pending) return;
      auto r = std::move(*pending);
      pending.reset();
      const trace_span span("comm", "wait for stage messages");
      r.wait();
      for (auto [k, mb] : pending_sends_act) dispatch(k, [&](auto& slot) { slot.outputs.erase(mb); });
      for (auto [k, mb] : pending_sends_grad) dispatch(k, [&](auto& slot) { slot.input_grads.erase(mb); });
      pending_recv_act.clear();
      pending_recv_grad.clear();
      pending_sends_act.clear();
      pending_sends_grad.clear();
    };
    auto in_flight = [](const std::vector<std::pair<int, int>>& v, int k, int mb) {
      for (const auto& e : v)
        if (e.first == k && e.second == mb) return true;
      return false;
    };

    const auto& list = s.actions[static_cast<std::size_t>(rank_)];
    std::vector<p2p_op<Space>> ops;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const action& a = list[i];
      if (detail::is_p2p(a.kind)) {
        finish();
        ops.clear();
        for (;; ++i) {
          const action& p = list[i];
          post(p, ops, pending_recv_act, pending_recv_grad, pending_sends_act, pending_sends_grad);
          if (!p.with_next) break;
        }
        pending.emplace(comm.exchange_async(std::span<const p2p_op<Space>>(ops)));
        continue;
      }
      const int k = a.stage, mb = a.micro_batch;
      // A compute waits for the group that brings its input, and only for that one.
      const bool backward_kind = a.kind == action_kind::backward || a.kind == action_kind::backward_input;
      if ((a.kind == action_kind::forward && in_flight(pending_recv_act, k, mb)) ||
          (backward_kind && in_flight(pending_recv_grad, k, mb)))
        finish();
      const trace_span span(a.kind == action_kind::forward ? "forward" : "backward", [&] {
        const char* what = a.kind == action_kind::forward ? "F" : a.kind == action_kind::backward_weight ? "W" : "B";
        return std::string(what) + std::to_string(k) + " mb " + std::to_string(mb);
      });
      switch (a.kind) {
        case action_kind::forward:
          forward(k, mb, input, loss, out);
          break;
        case action_kind::backward:
        case action_kind::backward_input:
          backward(k, mb, a.kind == action_kind::backward_input);
          break;
        case action_kind::backward_weight:
          dispatch(k, [&](auto& slot) {
            if constexpr (split_stage<std::remove_reference_t<decltype(*slot.stage)>>) slot.stage->backward_weight(mb);
          });
          break;
        default: break;
      }
      if ((a.kind == action_kind::backward || a.kind == action_kind::backward_weight) &&
          --remaining[static_cast<std::size_t>(k)] == 0)
        on_ready(k);
    }
    finish();
    return out;
  }

 private:
  template <class S>
  struct slot_of {
    using stage_t = S;
    std::optional<S> stage;
    std::map<int, typename S::input_type> inputs;         // received activations (or handed over here)
    std::map<int, typename S::output_type> outputs;       // to send
    std::map<int, typename S::output_type> output_grads;  // received (or from the loss, or handed over)
    std::map<int, typename S::input_type> input_grads;    // to send
  };

  template <class Make, std::size_t... K>
  void construct(Make& make, std::index_sequence<K...>) {
    (
        [&] {
          if (owns(static_cast<int>(K))) std::get<K>(slots_).stage.emplace(make(std::integral_constant<std::size_t, K>{}));
        }(),
        ...);
  }

  // f(std::integral_constant<std::size_t, K>{}) for the compile-time K equal to run-time k.
  template <class F>
  void with_index(int k, F&& f) {
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (void)((static_cast<int>(K) == k ? (f(std::integral_constant<std::size_t, K>{}), true) : false) || ...);
    }(std::make_index_sequence<sizeof...(Stages)>{});
  }
  // f(slot) with the slot of run-time stage k.
  template <class F>
  void dispatch(int k, F&& f) {
    with_index(k, [&](auto K) { f(std::get<K>(slots_)); });
  }

  // Every rank has the same list of stages: compared as a fingerprint, by max and min over the ranks.
  template <class Comm>
  void agree_on_stages(Comm& comm) {
    std::uint64_t h = detail::fnv("trident::pipeline");
    ((h = detail::fnv(typeid(Stages).name(), h)), ...);
    const std::vector<std::uint64_t> mine{static_cast<std::uint64_t>(stage_count), h};
    const auto hi = detail::all_reduce_small(comm, mine, reduce_op::max), lo = detail::all_reduce_small(comm, mine, reduce_op::min);
    TRIDENT_EXPECT(hi == lo, "pipeline: the ranks of the pipeline communicator hold different lists of stages (this rank, ",
                   rank_, ", has ", stage_count, " stages; the ranks have between ", lo[0], " and ", hi[0],
                   (hi[0] == lo[0] ? ", and their types differ" : ""), "); every rank must build the same pipeline<Stages...>");
  }

  // Stage k's output and stage k + 1's input agree in element type and count, across ranks:
  // each rank fills the rows of its stages, the ranks combine them (max), every rank checks all.
  template <class Comm>
  void agree_on_sizes(Comm& comm) {
    std::vector<std::uint64_t> mine(4 * static_cast<std::size_t>(stage_count), 0);
    fill_sizes(mine, std::make_index_sequence<sizeof...(Stages)>{});
    const auto all = detail::all_reduce_small(comm, mine, reduce_op::max);
    for (int k = 0; k + 1 < stage_count; ++k) {
      const auto out_hash = all[4 * static_cast<std::size_t>(k) + 2], out_numel = all[4 * static_cast<std::size_t>(k) + 3];
      const auto in_hash = all[4 * static_cast<std::size_t>(k + 1)], in_numel = all[4 * static_cast<std::size_t>(k + 1) + 1];
      TRIDENT_EXPECT(out_hash == in_hash, "pipeline: stage ", k, " (rank ", k % ranks_, ") sends a different message type than stage ",
                     k + 1, " (rank ", (k + 1) % ranks_, ") receives; the ranks were built with different stage types");
      TRIDENT_EXPECT(out_numel == in_numel, "pipeline: stage ", k, " (rank ", k % ranks_, ") sends ", out_numel,
                     " elements per micro-batch, but stage ", k + 1, " (rank ", (k + 1) % ranks_, ") expects ", in_numel,
                     " (its input_numel())");
    }
  }
  template <std::size_t... K>
  void fill_sizes(std::vector<std::uint64_t>& rows, std::index_sequence<K...>) {
    (
        [&] {
          const auto& slot = std::get<K>(slots_);
          if (!slot.stage) return;
          using S = stage_type<K>;
          rows[4 * K] = detail::nonzero(detail::type_hash<typename S::input_type>());
          rows[4 * K + 1] = slot.stage->input_numel();
          rows[4 * K + 2] = detail::nonzero(detail::type_hash<typename S::output_type>());
          rows[4 * K + 3] = slot.stage->output_numel();
        }(),
        ...);
  }

  // A schedule is validated, checked against this pipeline and agreed across the ranks once.
  template <class Comm>
  void admit(Comm& comm, const schedule& s) {
    const std::uint64_t h = detail::schedule_hash(s);
    if (h == admitted_) return;
    TRIDENT_EXPECT(s.stages == stage_count && s.ranks == ranks_, "pipeline::run: schedule '", s.name, "' is for ", s.stages,
                   " stages on ", s.ranks, " ranks; this pipeline has ", stage_count, " stages on ", ranks_, " ranks");
    validate(s);
    const std::vector<std::uint64_t> mine{h};
    const auto hi = detail::all_reduce_small(comm, mine, reduce_op::max), lo = detail::all_reduce_small(comm, mine, reduce_op::min);
    TRIDENT_EXPECT(hi == lo, "pipeline::run: the ranks run different schedules (rank ", rank_, " runs '", s.name, "' with ",
                   s.micro_batches, " micro-batches); every rank must pass the same schedule");
    for (const auto& list : s.actions)
      for (const action& a : list)
        if (a.kind == action_kind::backward_input || a.kind == action_kind::backward_weight)
          dispatch(a.stage, [&](auto& slot) {
            using S = typename std::remove_reference_t<decltype(slot)>::stage_t;
            TRIDENT_EXPECT(split_stage<S>, "pipeline::run: schedule '", s.name, "' splits the backward of stage ", a.stage,
                           " into backward_input and backward_weight, but its type has no backward_input(dy, mb) and "
                           "backward_weight(mb) (concept split_stage)");
          });
    admitted_ = h;
  }

  template <class Space>
  void post(const action& a, std::vector<p2p_op<Space>>& ops, std::vector<std::pair<int, int>>& recv_act,
            std::vector<std::pair<int, int>>& recv_grad, std::vector<std::pair<int, int>>& sent_act,
            std::vector<std::pair<int, int>>& sent_grad) {
    const int k = a.stage, mb = a.micro_batch;
    dispatch(k, [&](auto& slot) {
      switch (a.kind) {
        case action_kind::send_activation:
          ops.push_back(p2p_op<Space>::send(std::as_const(slot.outputs.at(mb)), (k + 1) % ranks_));
          sent_act.emplace_back(k, mb);
          break;
        case action_kind::recv_activation: {
          auto [it, fresh] = slot.inputs.try_emplace(mb, static_cast<std::size_t>(slot.stage->input_numel()));
          (void)fresh;
          ops.push_back(p2p_op<Space>::recv(it->second, (k - 1 + ranks_) % ranks_));
          recv_act.emplace_back(k, mb);
          break;
        }
        case action_kind::send_gradient:
          ops.push_back(p2p_op<Space>::send(std::as_const(slot.input_grads.at(mb)), (k - 1 + ranks_) % ranks_));
          sent_grad.emplace_back(k, mb);
          break;
        case action_kind::recv_gradient: {
          auto [it, fresh] = slot.output_grads.try_emplace(mb, static_cast<std::size_t>(slot.stage->output_numel()));
          (void)fresh;
          ops.push_back(p2p_op<Space>::recv(it->second, (k + 1) % ranks_));
          recv_grad.emplace_back(k, mb);
          break;
        }
        default: break;
      }
    });
  }

  template <class Input, class Loss>
  void forward(int k, int mb, Input& input, Loss& loss, run_result& out) {
    with_index(k, [&](auto K) { forward_of<K>(mb, input, loss, out); });
  }
  template <std::size_t K, class Input, class Loss>
  void forward_of(int mb, Input& input, Loss& loss, run_result& out) {
    auto& slot = std::get<K>(slots_);
    auto& st = *slot.stage;
    auto y = [&] {
      if constexpr (K == 0) {
        const input_type& x = input(mb);
        TRIDENT_EXPECT(detail::numel_of(x) == st.input_numel(), "pipeline::run: the input of micro-batch ", mb, " has ",
                       detail::numel_of(x), " elements; stage 0 expects ", st.input_numel(), " (its input_numel())");
        return typename stage_type<K>::output_type(st.forward(x, mb));
      } else {
        auto node = slot.inputs.extract(mb);  // received, or handed over by stage K - 1 on this rank
        TRIDENT_EXPECT(!node.empty(), "pipeline::run: the forward of micro-batch ", mb, ", stage ", K, " has no input");
        return typename stage_type<K>::output_type(st.forward(node.mapped(), mb));
      }
    }();
    // Checked here, not only by the communicator: a stage whose next stage is on this rank hands
    // its output over in memory, and a wrong size went on unseen.
    TRIDENT_EXPECT(detail::numel_of(y) == st.output_numel(), "pipeline::run: stage ", K, "'s forward of micro-batch ", mb,
                   " returned ", detail::numel_of(y), " elements; its output_numel() is ", st.output_numel());
    if constexpr (K + 1 == sizeof...(Stages)) {
      output_type dy(static_cast<std::size_t>(st.output_numel()));
      out.losses[static_cast<std::size_t>(mb)] = static_cast<double>(loss(std::as_const(y), mb, dy));
      TRIDENT_EXPECT(detail::numel_of(dy) == st.output_numel(), "pipeline::run: the loss of micro-batch ", mb, " left dy with ",
                     detail::numel_of(dy), " elements; expected the last stage's output_numel(), ", st.output_numel());
      slot.output_grads.insert_or_assign(mb, std::move(dy));
    } else if (owns(static_cast<int>(K) + 1)) {
      std::get<K + 1>(slots_).inputs.insert_or_assign(mb, std::move(y));
    } else {
      slot.outputs.insert_or_assign(mb, std::move(y));
    }
  }

  void backward(int k, int mb, bool input_only) {
    with_index(k, [&](auto K) { backward_of<K>(mb, input_only); });
  }
  template <std::size_t K>
  void backward_of(int mb, bool input_only) {
    using S = stage_type<K>;
    auto& slot = std::get<K>(slots_);
    auto node = slot.output_grads.extract(mb);
    TRIDENT_EXPECT(!node.empty(), "pipeline::run: the backward of micro-batch ", mb, ", stage ", K, " has no output gradient");
    auto dx = [&] {
      if constexpr (split_stage<S>) {
        if (input_only) return typename S::input_type(slot.stage->backward_input(node.mapped(), mb));
      }
      return typename S::input_type(slot.stage->backward(node.mapped(), mb));
    }();
    if constexpr (K > 0) {
      TRIDENT_EXPECT(detail::numel_of(dx) == slot.stage->input_numel(), "pipeline::run: stage ", K, "'s backward of micro-batch ",
                     mb, " returned ", detail::numel_of(dx), " elements; its input_numel() is ", slot.stage->input_numel());
      if (owns(static_cast<int>(K) - 1)) std::get<K - 1>(slots_).output_grads.insert_or_assign(mb, std::move(dx));
      else slot.input_grads.insert_or_assign(mb, std::move(dx));
    }
  }

  int rank_, ranks_;
  std::uint64_t admitted_ = 0;
  std::tuple<slot_of<Stages>...> slots_;
};

namespace detail {
template <class Stage, class Seq>
struct repeat;
template <class Stage, std::size_t... I>
struct repeat<Stage, std::index_sequence<I...>> {
  template <std::size_t>
  using same = Stage;
  using type = pipeline<same<I>...>;
};
}  // namespace detail

//! pipeline<Stage, ..., Stage> with N stages of one type (layers of one kind split into stages).
template <stage Stage, std::size_t N>
using uniform_pipeline = typename detail::repeat<Stage, std::make_index_sequence<N>>::type;

}  // namespace trident::pipeline
