#pragma once
// What the compression tests share (thread ranks and MPI): the MLP trained with a gradient
// reducer on a network that counts bytes (comm/slow_link.hpp), and a reducer wrapper that
// measures what the gradient reductions alone put on the wire.
#include <cstdint>
#include <memory>
#include <vector>

#include "mlp.hpp"
#include "trident/comm/slow_link.hpp"
#include "trident/compress/reducer.hpp"
#include "trident/optim/optimizers.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"

namespace compress_training {

//! Passes each bucket to R, adding to `bytes` what this rank sent meanwhile (a slow_link_comm's
//! wire counters).
template <class R>
struct metered {
  std::shared_ptr<R> inner;
  std::uint64_t bytes = 0;
  template <class Comm, class T>
  void all_reduce(Comm& comm, const trident::compress::bucket_view<T, typename Comm::space>& b) {
    const std::uint64_t before = comm.wire().total().bytes;
    inner->all_reduce(comm, b);
    bytes += comm.wire().total().bytes - before;
  }
};

struct run {
  std::vector<float> parameters;  // every tensor, by name order of the spec
  std::vector<double> losses;     // the global loss per step
  std::uint64_t gradient_bytes = 0;  // what this rank's gradient reductions sent
};

inline trident::zero::zero_options options() {
  trident::zero::zero_options o;
  o.bucket_bytes = 700 * sizeof(float);  // l2 | l1 | l0
  o.first_bucket_bytes = 150 * sizeof(float);
  o.persistence_threshold = 0;
  return o;
}

//! The MLP, `steps` steps of global batch `batch` on `comm`'s ranks (a slow_link_comm), each
//! bucket reduced through `reducer` (nullptr: the plain reduction).
template <int Stage, class Opt, class Net, class R, class Precision = trident::full_precision>
run train(Net& comm, Opt opt, int steps, std::shared_ptr<R> reducer, std::size_t batch = 32, mlp::dims d = {},
          trident::zero::zero_options zo = options()) {
  trident::zero::zero_optimizer<Stage, Opt, Net, Precision> z(comm, mlp::spec(d), opt, zo);
  mlp::initialise(z, d);
  std::shared_ptr<metered<R>> meter;
  if (reducer) {
    meter = std::make_shared<metered<R>>(metered<R>{reducer});
    z.reduce_gradients_with(meter);
  }
  run out;
  const std::size_t rows = batch / static_cast<std::size_t>(comm.size());
  for (int s = 0; s < steps; ++s) {
    const std::size_t first = static_cast<std::size_t>(s) * batch + static_cast<std::size_t>(comm.rank()) * rows;
    std::vector<double> loss{mlp::train_step(z, d, first, rows, rows, z.loss_scale())};
    comm.all_reduce(loss, trident::reduce_op::avg);
    out.losses.push_back(loss[0]);
    z.step();
  }
  const auto full = z.full_master();
  const auto spec = mlp::spec(d);
  for (const auto& t : spec.tensors()) {
    const auto& p = z.layout().find(t.name);
    out.parameters.insert(out.parameters.end(), full.begin() + static_cast<std::ptrdiff_t>(p.offset),
                          full.begin() + static_cast<std::ptrdiff_t>(p.offset + p.numel));
  }
  if (meter) out.gradient_bytes = meter->bytes;
  return out;
}

inline double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (float x : b) scale = std::max(scale, static_cast<double>(std::abs(x)));
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / scale);
  return worst;
}

}  // namespace compress_training
