#pragma once
// A parameter server (Li et al., OSDI 2014; stale synchronous parallel: Ho et al., NIPS 2013):
// server ranks own contiguous shards of the model and apply the optimizer; worker ranks compute
// gradients, push them to the servers and pull the parameters back.
//
//   struct ps::options                        synchronous, or bounded staleness s
//   class  ps::parameter_server<Comm, Opt>    serve(steps) on servers; pull() and push() on workers
//
// Ranks [0, servers) of the world serve, the others work. Each worker pushes its gradient for
// step t (the whole model; each server takes its shard); a server applies step t when every
// worker's gradient for t has come: their sum in worker order, divided by the workers (as an
// average all-reduce that adds in rank order does), then the optimizer. A worker pulls the
// parameters it computes its next step on:
//   synchronous         after every step before it: the servers answer every worker in turn,
//                       one round per step (data parallelism, bit for bit, with an all-reduce
//                       that adds in rank order, e.g. slow_link_comm's direct algorithm);
//   bounded staleness   any version that misses at most s steps: step t may be computed on the
//                       parameters after step t - s - 1, so a worker runs at most s steps ahead
//                       of the slowest. Each server answers each worker from a thread of its
//                       own (over a communicator of the servers and that worker), so a fast
//                       worker is served while a slow one computes. s = 0 equals synchronous.
// Communicators are used from one thread each; MPI needs MPI_THREAD_MULTIPLE (mpi_environment
// asks for it). A failure in a server's thread is rethrown by serve() once its other threads have
// stopped: those waiting for the model to advance stop at once, but one blocked in a send or
// receive with its worker waits for the backend to end it (a worker that failed too, the thread
// backend's timeout, MPI's watchdog). Bounded staleness is not for slow_link_comm, whose clock
// is one thread's.
//
//   trident::ps::parameter_server<trident::local_comm, trident::optim::adamw> ps(world, 1, initial, adamw, {.staleness = 2});
//   if (ps.serving()) {
//     ps.serve(steps);
//   } else {
//     for (int t = 0; t < steps; ++t) {
//       ps.pull(params);
//       compute_gradient(params, grad);
//       ps.push(grad);
//     }
//   }
#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/core/error.hpp"
#include "trident/optim/optimizers.hpp"

namespace trident::ps {

struct options {
  //! Steps a worker's parameters may miss; nullopt: synchronous (rounds, no threads).
  std::optional<int> staleness;
};

template <communicator Comm, class Opt>
  requires Comm::space::host_accessible
class parameter_server {
 public:
  //! Collective over `world` (it splits one communicator per worker). `initial`: the model's
  //! starting values, the same on every rank.
  parameter_server(Comm& world, int servers, std::span<const float> initial, Opt opt, options o = {})
      : servers_(servers), workers_(world.size() - servers), rank_(world.rank()), n_(initial.size()), opt_(std::move(opt)),
        o_(o) {
    TRIDENT_EXPECT(servers >= 1 && servers < world.size(), "ps::parameter_server: ", servers, " servers in a world of ",
                   world.size(), " ranks; expected 1..", world.size() - 1, " (at least one worker)");
    TRIDENT_EXPECT(!o_.staleness || *o_.staleness >= 0, "ps::parameter_server: staleness ", o_.staleness.value_or(0),
                   "; expected >= 0 (or none: synchronous)");
    TRIDENT_EXPECT(n_ >= static_cast<std::size_t>(servers), "ps::parameter_server: ", n_, " parameters do not shard over ",
                   servers, " servers");
    // One communicator per worker: the servers (ranks 0..servers-1 in it) and the worker (rank
    // `servers`). Collective over the world, once per worker.
    for (int w = 0; w < workers_; ++w) {
      const bool member = rank_ < servers_ || rank_ == servers_ + w;
      Comm c = world.split(member ? 0 : 1, rank_);
      if (member && serving()) pairs_.push_back(std::move(c));
      if (member && !serving()) mine_.emplace(std::move(c));
    }
    if (serving()) {
      const auto [b, e] = shard(rank_);
      params_.assign(initial.begin() + static_cast<std::ptrdiff_t>(b), initial.begin() + static_cast<std::ptrdiff_t>(e));
      for (auto& s : states_) s.assign(params_.size(), 0.0f);
    }
  }

  bool serving() const noexcept { return rank_ < servers_; }
  int servers() const noexcept { return servers_; }
  int workers() const noexcept { return workers_; }
  //! This worker's index, 0..workers()-1 (-1 on a server).
  int worker() const noexcept { return serving() ? -1 : rank_ - servers_; }
  //! Elements [first, second) of the model are server k's.
  std::pair<std::size_t, std::size_t> shard(int k) const noexcept {
    const std::size_t s = static_cast<std::size_t>(servers_);
    return {n_ * static_cast<std::size_t>(k) / s, n_ * (static_cast<std::size_t>(k) + 1) / s};
  }
  //! Server: the steps applied so far, and its shard of the parameters.
  std::int64_t version() const noexcept { return version_; }
  std::span<const float> shard_values() const noexcept { return params_; }

  //! Server: answers every worker for `steps` pulls and pushes each, then returns.
  void serve(std::int64_t steps) {
    TRIDENT_EXPECT(serving(), "ps::parameter_server::serve on rank ", rank_, ", a worker; call pull() and push() there");
    TRIDENT_EXPECT(steps >= 0, "ps::parameter_server::serve: ", steps, " steps");
    if (!o_.staleness) return serve_rounds(steps);
    std::vector<std::thread> threads;
    for (int w = 0; w < workers_; ++w) threads.emplace_back([this, w, steps] { serve_worker(w, steps); });
    for (auto& t : threads) t.join();
    if (failure_) std::rethrow_exception(failure_);
  }

  //! Worker: the parameters for its next step, whole, into `params`; returns the version (the
  //! steps applied) of the oldest shard received.
  std::int64_t pull(std::span<float> params) {
    check_worker("pull", params.size());
    // The servers answer pulls and pushes in turn: a second pull would wait for ever for an
    // answer that comes only after a push (until the backend's timeout, naming no cause).
    TRIDENT_EXPECT(!pulled_, "ps::parameter_server::pull on rank ", rank_, ": pulled again without a push; each step is "
                   "pull(), then push()");
    std::vector<std::int64_t> versions(static_cast<std::size_t>(servers_));
    std::vector<p2p_op<typename Comm::space>> ops;
    for (int k = 0; k < servers_; ++k) {
      const auto [b, e] = shard(k);
      ops.push_back(p2p_op<typename Comm::space>::recv(std::span<float>(params.data() + b, e - b), k));
      ops.push_back(p2p_op<typename Comm::space>::recv(std::span<std::int64_t>(&versions[static_cast<std::size_t>(k)], 1), k));
    }
    mine_->exchange(std::span<const p2p_op<typename Comm::space>>(ops));
    pulled_ = true;
    std::int64_t oldest = versions[0];
    for (auto v : versions) oldest = std::min(oldest, v);
    return oldest;
  }

  //! Worker: its gradient for the step it pulled for, whole, to the servers.
  void push(std::span<const float> grad) {
    check_worker("push", grad.size());
    TRIDENT_EXPECT(pulled_, "ps::parameter_server::push on rank ", rank_, ": no pull() before it; each step is pull(), then "
                   "push() (the servers send the parameters first)");
    std::vector<p2p_op<typename Comm::space>> ops;
    for (int k = 0; k < servers_; ++k) {
      const auto [b, e] = shard(k);
      ops.push_back(p2p_op<typename Comm::space>::send(std::span<const float>(grad.data() + b, e - b), k));
    }
    mine_->exchange(std::span<const p2p_op<typename Comm::space>>(ops));
    pulled_ = false;
  }

 private:
  void check_worker(const char* call, std::size_t size) const {
    TRIDENT_EXPECT(!serving(), "ps::parameter_server::", call, " on rank ", rank_, ", a server; call serve() there");
    TRIDENT_EXPECT(size == n_, "ps::parameter_server::", call, ": ", size, " elements; expected the model's ", n_);
  }

  // Synchronous: per step, every worker's pull answered in turn, then every push taken in turn.
  void serve_rounds(std::int64_t steps) {
    const int me = servers_;  // the worker's rank in each pair communicator
    for (std::int64_t t = 0; t < steps; ++t) {
      for (auto& c : pairs_) send_params(c, me, params_, version_);
      std::vector<std::vector<float>> grads(static_cast<std::size_t>(workers_), std::vector<float>(params_.size()));
      for (int w = 0; w < workers_; ++w) pairs_[static_cast<std::size_t>(w)].recv(grads[static_cast<std::size_t>(w)], me);
      apply(grads);
    }
  }

  static void send_params(Comm& c, int worker, std::span<const float> values, std::int64_t version) {
    const std::int64_t v = version;
    using op = p2p_op<typename Comm::space>;
    const op ops[] = {op::send(values, worker), op::send(std::span<const std::int64_t>(&v, 1), worker)};
    c.exchange(std::span<const op>(ops));
  }

  // Bounded staleness: worker w's thread. Step t's pull waits for version >= t - s; its push
  // is stored, and every step whose pushes are all in is applied, in order.
  void serve_worker(int w, std::int64_t steps) {
    Comm& c = pairs_[static_cast<std::size_t>(w)];
    const int me = servers_;
    const std::int64_t s = *o_.staleness;
    std::vector<float> values(params_.size());
    try {
      for (std::int64_t t = 0; t < steps; ++t) {
        std::int64_t v = 0;
        {
          std::unique_lock lock(mutex_);
          changed_.wait(lock, [&] { return failure_ || version_ >= t - s; });
          if (failure_) return;
          std::copy(params_.begin(), params_.end(), values.begin());
          v = version_;
        }
        send_params(c, me, values, v);
        std::vector<float> grad(params_.size());
        c.recv(grad, me);
        std::lock_guard lock(mutex_);
        auto& round = pending_[t];
        if (round.empty()) round.resize(static_cast<std::size_t>(workers_));
        round[static_cast<std::size_t>(w)] = std::move(grad);
        if (++arrived_[t] == workers_) {
          while (arrived_.count(version_) != 0 && arrived_[version_] == workers_) {
            apply(pending_[version_]);  // increments version_
            pending_.erase(version_ - 1);
            arrived_.erase(version_ - 1);
          }
          changed_.notify_all();
        }
      }
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!failure_) failure_ = std::current_exception();
      changed_.notify_all();
    }
  }

  // One step: the workers' gradients summed in worker order and averaged, then the optimizer.
  void apply(const std::vector<std::vector<float>>& grads) {
    const std::size_t n = params_.size();
    std::vector<float> g(grads[0]);
    for (std::size_t w = 1; w < grads.size(); ++w)
      for (std::size_t i = 0; i < n; ++i) g[i] = grads[w][i] + g[i];
    const float d = static_cast<float>(workers_);
    for (float& x : g) x = x / d;
    std::array<std::span<float>, Opt::state_count> state;
    for (std::size_t k = 0; k < Opt::state_count; ++k) state[k] = states_[k];
    opt_.step(std::span<float>(params_), std::span<const float>(g), state, ++version_);
  }

  int servers_, workers_, rank_;
  std::size_t n_;
  Opt opt_;
  options o_;
  std::vector<Comm> pairs_;   // server: one per worker
  std::optional<Comm> mine_;  // worker: the servers and this worker
  bool pulled_ = false;        // worker: pulled, its push not made yet (the protocol alternates)
  std::vector<float> params_;
  std::array<std::vector<float>, Opt::state_count> states_;
  std::int64_t version_ = 0;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::int64_t, std::vector<std::vector<float>>> pending_;
  std::map<std::int64_t, int> arrived_;
  std::exception_ptr failure_;
};

}  // namespace trident::ps
