#pragma once
// Tensor parallelism composed with ZeRO on a process grid: two transformer blocks trained with a
// zero_optimizer over the data axis and the tensor axis as its model-parallel group, against
// the same model trained on one rank (gradient accumulation over the data-parallel ranks'
// micro-batches). Clipping is active, so the global norm must count every parameter once.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tensor/tensor_suite.hpp"
#include "trident/comm/process_grid.hpp"
#include "trident/model/flat_layout.hpp"
#include "trident/optim/optimizers.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"
#include "trident/parallel/tensor/block.hpp"

namespace tensor_zero_suite {

namespace tensor = trident::tensor;
namespace zero = trident::zero;

inline constexpr tensor::block_config config{.seq = 4, .batch = 2, .hidden = 8, .heads = 2, .ffn = 16};
inline constexpr float clip = 0.05f;

struct trained {
  std::vector<std::vector<float>> parameters;  // this rank's parts, in the blocks' parameters() order
  int clipped_steps = 0;
};

//! `steps` steps of two blocks; each step takes `micro_batches` micro-batches numbered from
//! `first_micro_batch` (the serial run takes every data-parallel rank's, accumulating), with
//! the loss's gradient scaled by `scale`.
template <auto Stage, class Comm>
trained train(Comm& dp, Comm& tp, int first_micro_batch, int micro_batches, float scale, int steps) {
  const std::array<tensor::transformer_block, 2> blocks{tensor::transformer_block(tp, config, "h0"),
                                                        tensor::transformer_block(tp, config, "h1")};
  trident::model_spec spec;
  for (int l = 0; l < 2; ++l) blocks[static_cast<std::size_t>(l)].add_parameters(spec, l);
  // SGD with momentum, not Adam: the keys' bias has a zero gradient in exact arithmetic
  // (softmax does not change when every score of a row moves by the same amount), and Adam
  // divides that rounding noise by its own magnitude, so two correct runs part by lr per step
  // there (3e-4 after 20 steps, measured) while every other parameter agrees to 1e-6.
  trident::optim::sgd sgd;
  sgd.opt.lr = 0.05f;
  sgd.opt.momentum = 0.9f;
  zero::zero_options options;
  options.bucket_bytes = options.first_bucket_bytes = 64 * sizeof(float);  // several buckets per block
  options.persistence_threshold = 0;
  options.max_grad_norm = clip;
  zero::zero_optimizer<Stage, trident::optim::sgd, Comm> z(dp, tp, spec, sgd, options);

  // Parameters generated whole from one seed; each rank sets its part.
  std::vector<std::string> names;
  std::vector<trident::tensor_handle> handles;
  std::uint64_t seed = 1000;
  for (const auto& b : blocks)
    for (const auto& p : b.parameters()) {
      auto full = tensor_suite::random(p.split.numel(), ++seed, 0.3f);
      if (p.name.find(".ln") != std::string::npos && p.name.find("weight") != std::string::npos)
        for (auto& e : full) e += 1.0f;
      z.set_parameter(p.name, tensor_suite::part_of(p.split, tp.rank(), full));
      names.push_back(p.name);
      handles.push_back(z.handle(p.name));
    }
  auto weights = [&](int l) {
    std::array<std::span<const float>, 12> s;
    for (std::size_t i = 0; i < 12; ++i) s[i] = z.parameters(handles[static_cast<std::size_t>(l) * 12 + i]);
    return tensor::block_tensors<const float>::from(s);
  };
  auto gradients = [&](int l) {
    std::array<std::span<float>, 12> s;
    for (std::size_t i = 0; i < 12; ++i) s[i] = z.gradients(handles[static_cast<std::size_t>(l) * 12 + i]);
    return tensor::block_tensors<float>::from(s);
  };

  const std::size_t n = blocks[0].rows() * config.hidden;
  std::array<trident::tensor::block_activations, 2> saved{blocks[0].make_activations(), blocks[1].make_activations()};
  trained out;
  for (int step = 0; step < steps; ++step) {
    for (int m = 0; m < micro_batches; ++m) {
      const auto k = static_cast<std::uint64_t>(step * 64 + first_micro_batch + m);
      const auto x = tensor_suite::random(n, 5000 + k), target = tensor_suite::random(n, 9000 + k);
      if constexpr (!zero::stage_policy_t<Stage>::shards_gradients) z.set_gradient_sync(m + 1 == micro_batches);
      std::vector<float> mid(n), y(n), dy(n), dmid(n), dx(n);
      blocks[0].forward(tp, weights(0), x, mid, saved[0]);
      z.release(0);
      blocks[1].forward(tp, weights(1), mid, y, saved[1]);
      z.release(1);
      for (std::size_t i = 0; i < n; ++i) dy[i] = scale * 2.0f * (y[i] - target[i]) / static_cast<float>(n);  // mean squared error
      blocks[1].backward(tp, weights(1), saved[1], dy, dmid, gradients(1));
      z.release(1);
      z.grad_ready(1);
      blocks[0].backward(tp, weights(0), saved[0], dmid, dx, gradients(0));
      z.release(0);
      z.grad_ready(0);
    }
    const auto result = z.step();
    REQUIRE(result.applied);
    if (result.grad_norm > clip) ++out.clipped_steps;
  }
  for (const auto& name : names) out.parameters.push_back(z.parameter(name));
  return out;
}

//! On a grid: ZeRO stage `Stage` over the data axis, t = tp.size(), against one rank.
template <auto Stage, class Comm>
void zero_equals_serial(Comm& world, int tensor_size, int steps = 20) {
  trident::process_grid grid(world, tensor_size, 1);
  const int d = grid.data().size();
  const int data_rank = grid.coordinate(trident::grid_axis::data);
  auto alone = world.split(world.rank(), 0);
  const trained serial = train<0>(alone, alone, 0, d, 1.0f / static_cast<float>(d), steps);
  const trained parallel = train<Stage>(grid.data(), grid.tensor(), data_rank, 1, 1.0f, steps);
  INFO("ZeRO stage ", zero::stage_policy_t<Stage>::number, " on a (t = ", tensor_size, ", d = ", d, ") grid, rank ",
       world.rank());
  CHECK(serial.clipped_steps == steps);  // clipping is active on every step
  CHECK(parallel.clipped_steps == serial.clipped_steps);
  const tensor::transformer_block b0(grid.tensor(), config, "h0"), b1(grid.tensor(), config, "h1");
  std::vector<tensor::transformer_block::parameter> params = b0.parameters();
  for (auto& p : b1.parameters()) params.push_back(p);
  REQUIRE(parallel.parameters.size() == params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].name);
    const auto want = tensor_suite::part_of(params[i].split, grid.tensor().rank(), serial.parameters[i]);
    CHECK(tensor_suite::relative_error(parallel.parameters[i], want) <= 1e-5);
  }
}

//! A model-parallel group that is not the grid's tensor axis (the data axis, the world) is a
//! usage_error on every rank at construction, naming what was expected.
template <class Comm>
void wrong_model_group(Comm& world) {
  trident::process_grid grid(world, 2, 1);
  trident::model_spec spec;
  spec.add("w", {8}, 0);
  trident::optim::sgd sgd;
  using opt = zero::zero_optimizer<1, trident::optim::sgd, Comm>;
  CHECK_THROWS_WITH_AS(opt(grid.data(), grid.data(), spec, sgd), doctest::Contains("expected every rank of it at the same position"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(opt(grid.data(), world, spec, sgd), doctest::Contains("the model-parallel group (4 ranks)"),
                       trident::usage_error);
  opt right(grid.data(), grid.tensor(), spec, sgd);  // the tensor axis is accepted
  CHECK(right.layout().full_size() >= 8);
}

}  // namespace tensor_zero_suite
