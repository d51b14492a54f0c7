#pragma once
// The parameter server's tests, one body for any host backend (thread ranks, MPI): the MLP as
// the model, its gradients computed by workers on flat vectors and applied by the servers.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "mlp.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/slow_link.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"
#include "trident/parallel/ps/parameter_server.hpp"

namespace ps_suite {

//! What mlp::train_step needs from a model, over flat vectors: the tensors one after another in
//! the spec's order.
struct flat_model {
  using half_type = float;
  std::map<std::string, std::pair<std::size_t, std::size_t>> at;  // offset, numel
  std::vector<float> params, grads;
  explicit flat_model(const trident::model_spec& spec) {
    std::size_t n = 0;
    for (const auto& t : spec.tensors()) {
      at[t.name] = {n, t.numel};
      n += t.numel;
    }
    params.assign(n, 0.0f);
    grads.assign(n, 0.0f);
  }
  std::span<const float> parameters(const std::string& name) const {
    const auto [o, n] = at.at(name);
    return {params.data() + o, n};
  }
  std::span<float> gradients(const std::string& name) {
    const auto [o, n] = at.at(name);
    return {grads.data() + o, n};
  }
  void set_parameter(const std::string& name, const std::vector<float>& v) {
    const auto [o, n] = at.at(name);
    std::copy(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n), params.begin() + static_cast<std::ptrdiff_t>(o));
  }
  void release(int) {}
  void grad_ready(int) {}
};

inline std::vector<float> initial() {
  flat_model m(mlp::spec({}));
  mlp::initialise(m, {});
  return m.params;
}

constexpr std::size_t rows = 8;  // per worker and step

//! Data parallelism on `workers` thread ranks with an average all-reduce that adds in rank order
//! (slow_link_comm's direct algorithm): the parameters after `steps`, in spec order.
template <class Opt>
std::vector<float> data_parallel(int workers, Opt opt, int steps) {
  return trident::local_world::run(workers, [&](trident::local_comm& c) {
    trident::slow_link_comm<trident::local_comm> net(c.split(0, c.rank()), trident::cluster_map::blocks(workers, 1, {}, {}),
                                                     {.algorithm = trident::wire_algorithm::direct});
    const mlp::dims d;
    const auto spec = mlp::spec(d);
    trident::zero::zero_optimizer<0, Opt, decltype(net)> z(net, spec, opt);
    mlp::initialise(z, d);
    for (int t = 0; t < steps; ++t) {
      const std::size_t first = static_cast<std::size_t>(t) * rows * static_cast<std::size_t>(workers) +
                                static_cast<std::size_t>(c.rank()) * rows;
      mlp::train_step(z, d, first, rows, rows);
      z.step();
    }
    const auto full = z.full_master();
    std::vector<float> out;
    for (const auto& t : spec.tensors()) {
      const auto& p = z.layout().find(t.name);
      out.insert(out.end(), full.begin() + static_cast<std::ptrdiff_t>(p.offset), full.begin() + static_cast<std::ptrdiff_t>(p.offset + p.numel));
    }
    return out;
  })[0];
}

struct outcome {
  std::vector<float> shard;              // a server's parameters at the end
  std::vector<std::int64_t> versions;    // a worker's: the version of each pull
  double seconds = 0;
  double first_loss = 0, last_loss = 0;  // a worker's
};

//! Trains on `world` with `servers` servers; worker w sleeps delay(w, t) seconds after step t.
template <class Comm, class Opt, class Delay>
outcome train(Comm& world, int servers, Opt opt, trident::ps::options o, int steps, Delay delay) {
  trident::ps::parameter_server<Comm, Opt> ps(world, servers, initial(), opt, o);
  outcome out;
  const auto start = std::chrono::steady_clock::now();
  if (ps.serving()) {
    ps.serve(steps);
    out.shard.assign(ps.shard_values().begin(), ps.shard_values().end());
  } else {
    const mlp::dims d;
    flat_model m(mlp::spec(d));
    const std::size_t w = static_cast<std::size_t>(ps.worker()), workers = static_cast<std::size_t>(ps.workers());
    for (int t = 0; t < steps; ++t) {
      out.versions.push_back(ps.pull(m.params));
      std::fill(m.grads.begin(), m.grads.end(), 0.0f);
      const double loss = mlp::train_step(m, d, static_cast<std::size_t>(t) * rows * workers + w * rows, rows, rows);
      if (t == 0) out.first_loss = loss;
      out.last_loss = loss;
      ps.push(m.grads);
      const double pause = delay(ps.worker(), t);
      if (pause > 0) std::this_thread::sleep_for(std::chrono::duration<double>(pause));
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

inline double no_delay(int, int) { return 0.0; }

//! A straggler now and then: each (worker, step) is 8 ms slow with probability 1/4.
inline double stragglers(int w, int t) {
  const std::uint64_t h = (static_cast<std::uint64_t>(w) * 0x9e3779b97f4a7c15ull) ^ (static_cast<std::uint64_t>(t) * 0xbf58476d1ce4e5b9ull);
  return ((h >> 29) ^ (h >> 7)) % 4 == 0 ? 0.008 : 0.0;
}

}  // namespace ps_suite
