#pragma once
// What the ZeRO tests share: the bucket sizes that give the MLP several buckets, a relative
// difference, and "train the MLP `steps` steps on this communicator, return its parameters by
// name" for any backend (device communicators go through mlp::host_staged).
#include <cmath>
#include <type_traits>
#include <vector>

#include "mlp.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"

namespace zero_training {

inline constexpr std::size_t global_batch = 24;  // divisible by 1, 2, 3, 4 and 8

inline trident::zero::zero_options small_buckets() {
  trident::zero::zero_options o;
  o.bucket_bytes = 700 * sizeof(float);  // several buckets for this model: l2 | l1 | l0
  o.first_bucket_bytes = 150 * sizeof(float);
  o.persistence_threshold = 0;  // stage 3 really gathers and releases
  return o;
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
std::vector<float> by_name(Comm& comm, Opt opt, int steps) {
  const mlp::dims d;
  const auto spec = mlp::spec(d);
  trident::zero::zero_optimizer<Stage, Opt, Comm, Precision> z(comm, spec, opt, small_buckets());
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

}  // namespace zero_training
