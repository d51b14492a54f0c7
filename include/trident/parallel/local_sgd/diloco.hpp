#pragma once
// Training across slow links by communicating rarely: local SGD and DiLoCo (Douillard et al.,
// "DiLoCo: Distributed Low-Communication Training of Language Models", 2023), and its streaming
// form (Douillard et al., "Streaming DiLoCo with overlapping communication", 2025).
//
//   struct local_sgd::diloco_options    H, the outer optimizer, fragments, overlap, mixing
//   class  local_sgd::diloco<Comm>      call step() after each inner optimizer step
//
// Each worker (a rank, or a group of data-parallel ranks with their own optimizer) trains its
// copy of the model with its inner optimizer on its own data. Every H inner steps the outer step
// runs across workers: the pseudo-gradient delta = theta_global - theta_local is averaged over
// the workers (one all-reduce over `across`), the outer optimizer (Nesterov SGD, lr 0.7,
// momentum 0.9, the paper's) updates theta_global with it, and every worker continues from the
// new theta_global. H = 1 with an outer SGD of lr 1 and no momentum is data parallelism (the
// average of the workers' steps); outer SGD of lr 1 without momentum is local SGD (periodic
// model averaging). One all-reduce of the model per H steps: H times fewer bytes than a
// gradient all-reduce per step.
//
// Streaming (fragments = F > 1): the model is cut into F contiguous fragments, fragment p synced
// at the steps t = p H / F (mod H), so each sync sends 1/F of the model and the peak bandwidth
// drops F times. With overlap = tau > 0 a fragment's all-reduce starts at its step and its
// outer step is applied tau inner steps later, while training goes on (the all-reduce is the
// communicator's asynchronous one); the fragment then becomes mixing * theta_local +
// (1 - mixing) * theta_global, so the tau steps of local progress are not thrown away when
// mixing > 0.
//
// A worker of k data-parallel ranks (the constructor with `inside`) sends each fragment across
// once, not k times: each rank all-reduces its 1/k across workers and the k share the results by
// an all-gather inside the worker (fast links).
//
// The parameters are spans of this rank's fp32 values that the inner optimizer updates in
// place: with zero_optimizer, the working weights of a full_precision optimizer (state field
// "parameters", every range it holds); ranks that hold the same part of the model in
// different workers make up `across`. The workers start from rank 0's values (broadcast at
// construction, unless options say they already agree).
//
// In any memory space: on a device (nccl_comm) the copies, the pseudo-gradient, the outer step
// (cuda::step, the host's arithmetic) and the mixing run on the communicator's stream through
// local_sgd::engine<cuda_space>: include <trident/parallel/local_sgd/cuda/diloco.cuh> (nvcc).
// The constructor makes every buffer (theta_global, the momentum, one pseudo-gradient per
// fragment, the worker's gather, the mixing's copy): step() allocates nothing, so on a device no
// cudaFree waits for the device behind an overlapped all-reduce.
//
//   trident::local_sgd::diloco<trident::local_comm> outer(across, {params}, {.inner_steps = 100});
//   for (int t = 0; t < steps; ++t) {
//     train_step(inner);         // forward, backward, the inner optimizer's step
//     outer.step();              // every 100 steps: the outer step across workers
//   }
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/core/space_span.hpp"
#include "trident/optim/optimizers.hpp"

namespace trident::local_sgd {

//! The element-wise work of diloco in a memory space, ordered with the communicator's work:
//!   copy(comm, dst, src, n), fill_zero(comm, dst, n)
//!   pseudo_gradient(comm, delta, global, n)     delta[i] = global[i] - delta[i] (delta held local)
//!   outer_step(comm, sgd, params, grads, momentum, n, t)   the outer optimizer's step t
//!   mix(comm, local, global, alpha, n)          local = alpha local + (1 - alpha) global
//!   marker, mark(comm, m), wait_for(m)          a point in the communicator's work the host waits for
//! The host's is below, the CUDA one in parallel/local_sgd/cuda/diloco.cuh (nvcc).
template <memory_space Space>
struct engine;

template <>
struct engine<host_space> {
  template <class Comm>
  static void copy(Comm&, float* dst, const float* src, std::size_t n) {
    std::copy(src, src + n, dst);
  }
  template <class Comm>
  static void fill_zero(Comm&, float* dst, std::size_t n) {
    std::fill(dst, dst + n, 0.0f);
  }
  template <class Comm>
  static void pseudo_gradient(Comm&, float* delta, const float* global, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) delta[i] = global[i] - delta[i];
  }
  template <class Comm>
  static void outer_step(Comm&, const optim::sgd& o, float* params, const float* grads, float* momentum, std::size_t n,
                         std::int64_t t) {
    o.step(std::span<float>(params, n), std::span<const float>(grads, n), {std::span<float>(momentum, n)}, t);
  }
  template <class Comm>
  static void mix(Comm&, float* local, const float* global, float alpha, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) local[i] = alpha * local[i] + (1.0f - alpha) * global[i];
  }
  //! A point in the communicator's work the host can wait for (here everything is done at once).
  struct marker {};
  template <class Comm>
  static void mark(Comm&, marker&) {}
  static void wait_for(const marker&) {}
};

struct diloco_options {
  int inner_steps = 100;  // H
  //! The outer optimizer (the paper's: Nesterov momentum 0.9, lr 0.7).
  optim::sgd outer{{.lr = 0.7f, .momentum = 0.9f, .nesterov = true}};
  int fragments = 1;      // F: streaming DiLoCo when > 1
  int overlap = 0;        // tau: inner steps between starting a fragment's all-reduce and applying it
  float mixing = 0.0f;    // alpha: fragment = alpha local + (1 - alpha) global, when it lands
  bool broadcast_initial = true;  // start every worker from rank 0's values
};

template <communicator Comm>
class diloco {
  using space = typename Comm::space;
  static_assert(requires { sizeof(engine<space>); },
                "local_sgd::diloco on device memory: include <trident/parallel/local_sgd/cuda/diloco.cuh> (compiled by nvcc)");

 public:
  using span_type = space_span<float, space>;

  //! The parameters: std::span<float>s for a host communicator, space_spans of its space for
  //! a device one (what parameters_of() gives either way).
  using params_type = std::vector<std::conditional_t<space::host_accessible, std::span<float>, span_type>>;

  diloco(Comm& across, params_type params, diloco_options o = {}) : diloco(across, nullptr, spans_of(params), o) {}
  //! A worker of several ranks that hold the same parameters (a data-parallel group: `inside`):
  //! each sends only its 1/k of every fragment across and the k share the outer results by an
  //! all-gather inside the worker, so the slow link carries the model once per worker, not k
  //! times. `across`: the ranks of the same `inside` rank in the other workers.
  diloco(Comm& across, Comm& inside, params_type params, diloco_options o = {})
      : diloco(across, &inside, spans_of(params), o) {}

 private:
  static std::vector<span_type> spans_of(const params_type& params) {
    std::vector<span_type> out;
    for (auto s : params) out.emplace_back(s.data(), s.size());
    return out;
  }

  diloco(Comm& across, Comm* inside, std::vector<span_type> params, diloco_options o)
      : across_(&across), inside_(inside), params_(std::move(params)), o_(o) {
    TRIDENT_EXPECT(o_.inner_steps >= 1, "local_sgd::diloco: inner_steps (H) is ", o_.inner_steps, "; expected >= 1");
    TRIDENT_EXPECT(o_.fragments >= 1 && o_.fragments <= o_.inner_steps, "local_sgd::diloco: ", o_.fragments,
                   " fragments; expected 1..inner_steps (", o_.inner_steps, "), one sync step each");
    TRIDENT_EXPECT(o_.overlap >= 0 && o_.overlap < o_.inner_steps, "local_sgd::diloco: overlap ", o_.overlap,
                   "; expected 0..inner_steps - 1 (", o_.inner_steps - 1, ")");
    TRIDENT_EXPECT(o_.mixing >= 0.0f && o_.mixing <= 1.0f, "local_sgd::diloco: mixing ", o_.mixing, "; expected in [0, 1]");
    std::size_t n = 0;
    for (auto s : params_) n += s.size();
    TRIDENT_EXPECT(n >= static_cast<std::size_t>(o_.fragments), "local_sgd::diloco: ", n, " parameters do not split into ",
                   o_.fragments, " fragments");
    check_agreement(*across_, "across", n);
    if (inside_) check_agreement(*inside_, "inside", n);
    global_ = buffer<float, space>(n, mem_category::optimizer_state);
    gather(0, n, global_.data());
    if (o_.broadcast_initial) {
      across_->broadcast(global_, 0);
      scatter(0, n, global_.data());
    }
    momentum_ = buffer<float, space>(n, mem_category::optimizer_state);
    engine<space>::fill_zero(*across_, momentum_.data(), n);
    outer_steps_.assign(static_cast<std::size_t>(o_.fragments), 0);
    // Every buffer a step needs, made now: a fragment is in flight at most once at a time
    // (overlap < H), so one delta per fragment; the worker's gather and the mixing reuse theirs.
    // On a device an allocation in step() would cost more than its bytes: cudaFree waits for
    // the whole device, the communication that overlap hides included.
    std::size_t widest = 0, widest_chunk = 0;
    for (int p = 0; p < o_.fragments; ++p) {
      const auto [begin, end] = fragment(p);
      const auto [lo, hi] = mine(p);
      deltas_.emplace_back(hi - lo, mem_category::communication);
      widest = std::max(widest, end - begin);
      widest_chunk = std::max(widest_chunk, chunk_of(p));
    }
    if (inside_) {
      part_ = buffer<float, space>(widest_chunk, mem_category::communication);
      all_ = buffer<float, space>(widest_chunk * static_cast<std::size_t>(inside_->size()), mem_category::communication);
    }
    if (o_.overlap > 0 && o_.mixing != 0.0f) local_ = buffer<float, space>(widest, mem_category::communication);
    // On a device the broadcast's values land in the parameters on this communicator's stream:
    // done before the inner optimizer (on its own stream) may touch them.
    if constexpr (!space::host_accessible) across_->synchronize();
  }

 public:
  diloco(const diloco&) = delete;
  diloco& operator=(const diloco&) = delete;
  ~diloco() {
    for (auto& f : flights_) {
      try {
        f.request.wait();
      } catch (...) {
      }
    }
  }

  //! After each inner step (on every rank of every worker): starts the all-reduce of the
  //! fragments due now and applies those due `overlap` steps after theirs. Returns how many
  //! fragments' outer steps were applied. On a device, call it once the inner step's work is
  //! done (its communicator synchronised): the fragments are read on this one's stream.
  //! The parameters it writes are written when it returns.
  int step() {
    ++t_;
    std::optional<typename engine<space>::marker> read;  // the parameters read for the fragments started
    for (int p = 0; p < o_.fragments; ++p) {
      const std::int64_t offset = static_cast<std::int64_t>(p) * o_.inner_steps / o_.fragments;
      if (t_ < std::max<std::int64_t>(offset, 1) || (t_ - offset) % o_.inner_steps != 0) continue;
      const auto [begin, end] = mine(p);
      space_span<float, space> delta(deltas_[static_cast<std::size_t>(p)].data(), end - begin);
      gather(begin, end, delta.data());
      engine<space>::pseudo_gradient(*across_, delta.data(), global_.data() + begin, end - begin);
      engine<space>::mark(*across_, read.emplace());  // before the all-reduce: waiting for it leaves that in flight
      // A flight exists only with its request (no empty state to test, and none for GCC's
      // -Wmaybe-uninitialized to see through a moved std::optional at -O3).
      flights_.push_back(flight{p, t_ + o_.overlap, delta, across_->all_reduce_async(delta, reduce_op::avg)});
    }
    // The next inner step may write the parameters as soon as this returns: their reading must
    // be done (on a device it is queued on this communicator's stream).
    if (read) engine<space>::wait_for(*read);
    int applied = 0;
    while (!flights_.empty() && flights_.front().apply_at <= t_) {
      // Out of the queue first: a failed all-reduce must not be applied later, unreduced.
      flight f = std::move(flights_.front());
      flights_.pop_front();
      apply(f);
      ++applied;
    }
    // On a device the new parameters are written on this communicator's stream; the inner
    // optimizer's work on its own stream must not start before.
    if constexpr (!space::host_accessible)
      if (applied > 0) across_->synchronize();
    return applied;
  }

  std::int64_t inner_steps_taken() const noexcept { return t_; }
  //! theta_global: the parameters as of the last outer steps (in the communicator's space).
  space_span<const float, space> global() const noexcept { return {global_.data(), global_.size()}; }
  //! Elements [begin, end) of the flat parameters (the spans one after another) form fragment p.
  std::pair<std::size_t, std::size_t> fragment(int p) const noexcept {
    const std::size_t n = global_.size(), f = static_cast<std::size_t>(o_.fragments);
    return {n * static_cast<std::size_t>(p) / f, n * (static_cast<std::size_t>(p) + 1) / f};
  }

 private:
  using request_type =
      decltype(std::declval<Comm&>().all_reduce_async(std::declval<space_span<float, space>>(), reduce_op::avg));
  struct flight {
    int fragment;
    std::int64_t apply_at;
    space_span<float, space> delta;  // this rank's part of the fragment, in deltas_ (one outer step per H inner ones)
    request_type request;
  };

  // Every rank of a group runs the same schedule on as many parameters: with another H the
  // all-reduces of different steps were paired, with another outer lr the workers' global
  // parameters drifted apart, and both ended without an error. One all-gather at construction.
  void check_agreement(Comm& comm, const char* group, std::size_t n) {
    const auto& outer = o_.outer.opt;
    constexpr std::size_t k = 11;
    static constexpr const char* names[k] = {"inner_steps", "fragments", "overlap", "mixing", "broadcast_initial", "outer lr",
                                             "outer momentum", "outer dampening", "outer weight_decay", "outer nesterov",
                                             "parameters"};
    const std::array<double, k> mine = {double(o_.inner_steps), double(o_.fragments), double(o_.overlap), double(o_.mixing),
                                        double(o_.broadcast_initial), double(outer.lr), double(outer.momentum),
                                        double(outer.dampening), double(outer.weight_decay), double(outer.nesterov), double(n)};
    const auto ranks = static_cast<std::size_t>(comm.size());
    const std::vector<double> back = trident::detail::all_gather_small(comm, std::span<const double>(mine));
    for (std::size_t r = 1; r < ranks; ++r)
      for (std::size_t f = 0; f < k; ++f) {
        const double a = back[f], b = back[r * k + f];
        const bool same = a == b || (std::isnan(a) && std::isnan(b));
        TRIDENT_EXPECT(same, "local_sgd::diloco: the ranks of the ", group, " group disagree: ", names[f], " is ", b, " on rank ",
                       r, " and ", a, " on rank 0 (every rank must run the same schedule on the same parameters)");
      }
  }

  // This rank's part of fragment p: all of it, or its 1/k (padded to k equal chunks) inside a
  // worker of k ranks.
  std::size_t chunk_of(int p) const noexcept {
    const auto [begin, end] = fragment(p);
    const std::size_t k = inside_ ? static_cast<std::size_t>(inside_->size()) : 1;
    return (end - begin + k - 1) / k;
  }
  std::pair<std::size_t, std::size_t> mine(int p) const noexcept {
    const auto [begin, end] = fragment(p);
    if (!inside_) return {begin, end};
    const std::size_t chunk = chunk_of(p), r = static_cast<std::size_t>(inside_->rank());
    return {std::min(end, begin + r * chunk), std::min(end, begin + (r + 1) * chunk)};
  }

  void apply(flight& f) {
    f.request.wait();
    const auto [lo, hi] = mine(f.fragment);
    auto& count = outer_steps_[static_cast<std::size_t>(f.fragment)];
    engine<space>::outer_step(*across_, o_.outer, global_.data() + lo, f.delta.data(), momentum_.data() + lo, hi - lo, ++count);
    const auto [begin, end] = fragment(f.fragment);
    const std::size_t n = end - begin;
    if (inside_) {
      // Every rank of the worker gets every part of the new fragment. The outer step ran on the
      // across communicator's stream, the gather runs on inside's: on a device, wait for it.
      if constexpr (!space::host_accessible) across_->synchronize();
      const std::size_t chunk = chunk_of(f.fragment), k = static_cast<std::size_t>(inside_->size());
      space_span<float, space> part(part_.data(), chunk), all(all_.data(), chunk * k);
      engine<space>::fill_zero(*inside_, part.data(), chunk);
      engine<space>::copy(*inside_, part.data(), global_.data() + lo, hi - lo);
      inside_->all_gather(space_span<const float, space>(part), all);
      engine<space>::copy(*inside_, global_.data() + begin, all.data(), n);
      if constexpr (!space::host_accessible) inside_->synchronize();
    }
    if (o_.overlap == 0 || o_.mixing == 0.0f) {
      scatter(begin, end, global_.data() + begin);
      return;
    }
    gather(begin, end, local_.data());
    engine<space>::mix(*across_, local_.data(), global_.data() + begin, o_.mixing, n);
    scatter(begin, end, local_.data());
  }

  // Flat elements [begin, end) of the parameters out of, or into, the spans.
  template <class F>
  void each(std::size_t begin, std::size_t end, F&& f) {
    std::size_t at = 0;
    for (auto s : params_) {
      const std::size_t lo = std::max(begin, at), hi = std::min(end, at + s.size());
      if (lo < hi) f(s.data() + (lo - at), lo - begin, hi - lo);
      at += s.size();
    }
  }
  void gather(std::size_t begin, std::size_t end, float* out) {
    each(begin, end, [&](float* p, std::size_t o, std::size_t n) { engine<space>::copy(*across_, out + o, p, n); });
  }
  void scatter(std::size_t begin, std::size_t end, const float* in) {
    each(begin, end, [&](float* p, std::size_t o, std::size_t n) { engine<space>::copy(*across_, p, in + o, n); });
  }

  Comm* across_;
  Comm* inside_ = nullptr;
  std::vector<span_type> params_;
  diloco_options o_;
  buffer<float, space> global_, momentum_;
  std::vector<buffer<float, space>> deltas_;  // per fragment: this rank's part of its pseudo-gradient
  buffer<float, space> part_, all_, local_;   // a worker's gather of a new fragment; the mixing's copy
  std::vector<std::int64_t> outer_steps_;
  std::deque<flight> flights_;
  std::int64_t t_ = 0;
};

//! The fp32 values a full_precision zero_optimizer holds and updates in place (its working
//! weights, every range this rank holds: whole tensors in stages 0-2), as diloco takes them.
//! Stage 3 gathers its parameters for forward and backward, so it is not offered here.
//!
//!   zero::zero_optimizer<1, optim::adamw, local_comm> inner(workers, spec, adamw);
//!   local_sgd::diloco<local_comm> outer(across, local_sgd::parameters_of(inner), {.inner_steps = 100});
//! Host spans (std::span) for a host optimizer, space_spans of its space for a device one.
template <class Zero>
  requires std::same_as<typename Zero::half_type, float>
auto parameters_of(Zero& z) {
  static_assert(Zero::stage < 3, "local_sgd::parameters_of: stage 3 keeps only a shard of the parameters, gathered for use");
  using space = typename Zero::space;
  using span = std::conditional_t<space::host_accessible, std::span<float>, space_span<float, space>>;
  std::vector<span> out;
  for (const auto& f : z.state_fields()) {
    if (f.name != "parameters") continue;
    for (const auto& r : f.held) out.emplace_back(static_cast<float*>(f.data) + r.at, r.count);
  }
  return out;
}

}  // namespace trident::local_sgd
