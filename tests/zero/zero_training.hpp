#pragma once
// What the ZeRO tests share: the bucket sizes that give the MLP several buckets, a relative
// difference, host access to the optimizer's spans in any memory space (to_host, on_host), and
// "train the MLP (or the toy model) `steps` steps on this communicator, return its parameters by
// name" for any backend (device communicators: the MLP through mlp::host_staged, the toy model
// through to_host and on_host).
#include <algorithm>
#include <cmath>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "mlp.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"

namespace zero_training {

//! Runs f(std::integral_constant<int, Stage>) for the four ZeRO stages.
template <class F>
void for_each_stage(F&& f) {
  f(std::integral_constant<int, 0>{});
  f(std::integral_constant<int, 1>{});
  f(std::integral_constant<int, 2>{});
  f(std::integral_constant<int, 3>{});
}

inline constexpr std::size_t global_batch = 24;  // divisible by 1, 2, 3, 4 and 8

inline trident::zero::zero_options small_buckets() {
  trident::zero::zero_options o;
  o.bucket_bytes = 700 * sizeof(float);  // several buckets for this model: l2 | l1 | l0
  o.first_bucket_bytes = 150 * sizeof(float);
  o.persistence_threshold = 0;  // stage 3 really gathers and releases
  return o;
}

//! The elements of a span that zero_optimizer handed out (parameters(), gradients()), in any
//! memory space, as a host vector. A host-accessible span is read directly. A device span
//! (nccl_comm's cuda_space) is copied with trident::copy after comm.synchronize(): work queued on
//! the communicator's stream may still be writing it (a stage-3 gather or prefetch, the NaN of a
//! release, a bucket zeroed for a new micro-batch), and synchronize() waits for it with the
//! communicator's timeout, where a bare cudaMemcpy behind a collective that never completes would
//! wait forever.
template <class Comm, class T, trident::memory_space Space>
std::vector<std::remove_const_t<T>> to_host(Comm& comm, trident::space_span<T, Space> s) {
  using V = std::remove_const_t<T>;
  std::vector<V> out(s.size());
  if constexpr (Space::host_accessible) {
    std::copy(s.data(), s.data() + s.size(), out.begin());
  } else {
    comm.synchronize();
    trident::copy(trident::space_span<const V, Space>(s), trident::space_span<V, trident::host_space>(out));
  }
  return out;
}

//! Calls f(std::span<T>) on the elements of a span of any memory space and keeps what f writes.
//! A host-accessible span is modified in place, element by element, as backward writes it. A
//! device span is staged: to_host (which synchronises first), f, and trident::copy back, which
//! has landed when on_host returns, so the collective or kernel that next reads these elements
//! on the communicator's stream (grad_ready's reduction, step()'s checks) sees them, whether or
//! not that stream is ordered with the legacy default stream: a host-to-device cudaMemcpy from
//! pageable memory may return before its DMA lands, so one element is copied back, which the
//! same (legacy) stream runs after it and which returns only when done.
template <class Comm, class T, trident::memory_space Space, class F>
  requires(!std::is_const_v<T>)
void on_host(Comm& comm, trident::space_span<T, Space> s, F&& f) {
  if constexpr (Space::host_accessible) {
    f(std::span<T>(s.data(), s.size()));
  } else {
    auto host = to_host(comm, s);
    f(std::span<T>(host));
    trident::copy(trident::space_span<const T, trident::host_space>(host), s);
    if (!s.empty()) trident::copy(s.subspan(0, 1), trident::space_span<T, trident::host_space>(host.data(), 1));
  }
}

inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

//! The parameters after `steps` steps on the global batch split over comm's ranks, tensor by
//! tensor in model order (so runs with different padding compare directly).
template <int Stage, class Opt, class Precision = trident::full_precision, class Comm>
std::vector<float> by_name(Comm& comm, Opt opt, int steps, trident::zero::zero_options options = small_buckets()) {
  const mlp::dims d;
  const auto spec = mlp::spec(d);
  trident::zero::zero_optimizer<Stage, Opt, Comm, Precision> z(comm, spec, opt, options);
  mlp::initialise(z, d);
  const std::size_t rows = global_batch / static_cast<std::size_t>(comm.size());
  for (int s = 0; s < steps; ++s) {
    const std::size_t first = static_cast<std::size_t>(s) * global_batch + static_cast<std::size_t>(comm.rank()) * rows;
    if constexpr (std::is_same_v<typename Comm::space, trident::host_space>) {
      mlp::train_step(z, d, first, rows, rows, z.loss_scale());
    } else {
      mlp::host_staged<decltype(z)> staged{z, {}, {}};
      mlp::train_step(staged, d, first, rows, rows, z.loss_scale());
    }
    z.step();
  }
  const auto full = z.full_master();
  std::vector<float> out;
  for (const auto& t : spec.tensors()) {
    const auto& p = z.layout().find(t.name);
    out.insert(out.end(), full.begin() + static_cast<std::ptrdiff_t>(p.offset),
               full.begin() + static_cast<std::ptrdiff_t>(p.offset + p.numel));
  }
  return out;
}

//! A model of independent tensors on any layers, for the misuse tests: each sample s pulls every
//! element towards a target t(s, tensor, i), loss = mean over samples of (p - t)^2 / 2, so the
//! gradient of an element is the mean of (p - t). Any layer structure can be built (layers
//! without tensors, equal-sized buckets) and compared with one rank on the global batch.
namespace toy {

inline float hash01(const std::string& name, std::size_t a, std::size_t b) {
  std::size_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  h = (h ^ a) * 1099511628211ull;
  h = (h ^ b) * 1099511628211ull;
  return static_cast<float>(h % 100003) / 100003.0f - 0.5f;
}

template <class Zero>
void initialise(Zero& z, const trident::model_spec& spec) {
  for (const auto& t : spec.tensors()) {
    std::vector<float> v(t.numel);
    for (std::size_t i = 0; i < t.numel; ++i) v[i] = hash01(t.name, 0, i);
    z.set_parameter(t.name, v);
  }
}

//! How one micro-batch walks the model: the layers in the order forward touches them (default
//! 0, 1, ...) and the order backward marks them ready (default the reverse); empty layers too,
//! unless `skip_empty`. `before_ready(layer)` and `after_ready(layer)`, if set, run around each
//! grad_ready: where a test makes its mistake.
struct walk {
  std::vector<int> forward, backward;
  bool skip_empty = false;
  std::function<void(int)> before_ready, after_ready;
};

inline walk default_walk(const trident::model_spec& spec, walk w = {}) {
  if (w.forward.empty())
    for (int l = 0; l < spec.layers(); ++l) w.forward.push_back(l);
  if (w.backward.empty()) w.backward.assign(w.forward.rbegin(), w.forward.rend());
  return w;
}

//! Forward and backward over samples [first, first + rows) of a batch of rows_per_rank rows on
//! each rank; gradients accumulate (+=), so micro-batches add up. comm is the optimizer's
//! communicator: parameters and gradients are read and written through to_host and on_host, so
//! the model trains in any memory space.
template <class Comm, class Zero>
void micro_batch(Comm& comm, Zero& z, const trident::model_spec& spec, std::size_t first, std::size_t rows,
                 std::size_t rows_per_rank, const walk& how = {}) {
  const walk w = default_walk(spec, how);
  using H = typename Zero::half_type;
  auto has_tensors = [&](int l) {
    return std::any_of(spec.tensors().begin(), spec.tensors().end(), [&](const auto& t) { return t.layer == l; });
  };
  std::vector<std::vector<float>> seen(spec.tensors().size());  // parameters as forward read them
  for (int l : w.forward) {
    if (w.skip_empty && !has_tensors(l)) continue;
    for (std::size_t k = 0; k < spec.tensors().size(); ++k) {
      const auto& t = spec.tensors()[k];
      if (t.layer != l) continue;
      const auto p = to_host(comm, z.parameters(t.name));
      seen[k].resize(t.numel);
      for (std::size_t i = 0; i < t.numel; ++i) seen[k][i] = static_cast<float>(p[i]);
    }
    z.release(l);
  }
  for (int l : w.backward) {
    if (w.skip_empty && !has_tensors(l)) continue;
    for (std::size_t k = 0; k < spec.tensors().size(); ++k) {
      const auto& t = spec.tensors()[k];
      if (t.layer != l) continue;
      on_host(comm, z.gradients(t.name), [&](std::span<H> g) {
        for (std::size_t i = 0; i < t.numel; ++i) {
          float sum = 0;
          for (std::size_t s = first; s < first + rows; ++s) sum += seen[k][i] - hash01(t.name, s + 1, i);
          g[i] = static_cast<H>(static_cast<float>(g[i]) + sum / static_cast<float>(rows_per_rank));
        }
      });
    }
    if (w.before_ready) w.before_ready(l);
    z.grad_ready(l);
    if (w.after_ready) w.after_ready(l);
  }
}

inline constexpr std::size_t batch = 12;  // divisible by 1, 2, 3 and 4

//! Parameters by name, in spec order (layouts that differ in padding compare directly).
template <class Zero>
std::vector<float> parameters(Zero& z, const trident::model_spec& spec) {
  const auto full = z.full_master();
  std::vector<float> out;
  for (const auto& t : spec.tensors()) {
    const auto& p = z.layout().find(t.name);
    out.insert(out.end(), full.begin() + static_cast<std::ptrdiff_t>(p.offset),
               full.begin() + static_cast<std::ptrdiff_t>(p.offset + p.numel));
  }
  return out;
}

//! The samples of step s on comm's rank, in one micro-batch.
template <class Comm, class Zero>
void step_samples(Comm& comm, Zero& z, const trident::model_spec& spec, int s, const walk& how = {}) {
  const std::size_t rows = batch / static_cast<std::size_t>(comm.size());
  micro_batch(comm, z, spec, static_cast<std::size_t>(s) * batch + static_cast<std::size_t>(comm.rank()) * rows, rows, rows, how);
}

//! Parameters by name (spec order) after `steps` steps of the toy model on comm's ranks.
template <int Stage, class Opt, class Comm>
std::vector<float> train(Comm& comm, const trident::model_spec& spec, Opt opt, trident::zero::zero_options options, int steps,
                         const walk& how = {}, int micro_batches = 1) {
  trident::zero::zero_optimizer<Stage, Opt, Comm> z(comm, spec, opt, options);
  initialise(z, spec);
  const std::size_t rows = batch / static_cast<std::size_t>(comm.size());
  const std::size_t micro = rows / static_cast<std::size_t>(micro_batches);
  for (int s = 0; s < steps; ++s) {
    for (int m = 0; m < micro_batches; ++m) {
      if constexpr (Stage < 2) z.set_gradient_sync(m + 1 == micro_batches);
      const std::size_t first = static_cast<std::size_t>(s) * batch + static_cast<std::size_t>(comm.rank()) * rows +
                                static_cast<std::size_t>(m) * micro;
      micro_batch(comm, z, spec, first, micro, rows, how);
    }
    z.step();
  }
  return parameters(z, spec);
}

}  // namespace toy

}  // namespace zero_training
