#pragma once
// Pipeline, tensor and data parallelism together (3-D): transformer blocks split into pipeline
// stages, each block tensor-parallel over the grid's tensor axis, each stage's parameters held
// by a zero_optimizer over the data axis, against the same blocks trained on one rank with
// gradient accumulation over every data-parallel rank's micro-batches, with global-norm clipping
// active on every step (the norm spans all stages).
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tensor/tensor_suite.hpp"
#include "trident/comm/process_grid.hpp"
#include "trident/model/flat_layout.hpp"
#include "trident/optim/optimizers.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"
#include "trident/parallel/pipeline/pipeline.hpp"
#include "trident/parallel/pipeline/schedule.hpp"
#include "trident/parallel/tensor/block.hpp"

namespace grid_suite {

namespace tensor = trident::tensor;
namespace zero = trident::zero;
namespace pp = trident::pipeline;

inline constexpr tensor::block_config config{.seq = 4, .batch = 2, .hidden = 8, .heads = 2, .ffn = 16};
inline constexpr float clip = 0.05f;  // below every step's norm: clipping is active throughout

//! Blocks [first, last) of a GPT-2-style stack as one pipeline stage: tensor-parallel over `tp`,
//! parameters in a zero_optimizer<Stage> over `dp` whose model-parallel group is `model` (the
//! grid's tensor x pipeline ranks, so that the clipped global norm spans every stage; each
//! replica counted on tensor rank 0 only). forward/backward run every block of the stage for
//! one micro-batch; the gradients of the last of `micro_batches` are reduced over the data axis
//! as the backward goes.
template <auto Stage, class Comm>
class block_stage {
 public:
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  using zero_type = zero::zero_optimizer<Stage, trident::optim::sgd, Comm>;

  block_stage(Comm& dp, Comm& tp, Comm& model, int first, int last, int micro_batches) : tp_(&tp), micro_batches_(micro_batches) {
    for (int l = first; l < last; ++l) blocks_.emplace_back(tp, config, "h" + std::to_string(l));
    trident::model_spec spec;
    for (std::size_t i = 0; i < blocks_.size(); ++i) blocks_[i].add_parameters(spec, static_cast<int>(i));
    trident::optim::sgd sgd;
    sgd.opt.lr = 0.05f;
    sgd.opt.momentum = 0.9f;
    zero::zero_options options;
    options.bucket_bytes = options.first_bucket_bytes = 64 * sizeof(float);  // several buckets per block
    options.persistence_threshold = 0;
    options.max_grad_norm = clip;
    options.count_replicas = tp.rank() == 0;
    z_ = std::make_unique<zero_type>(dp, model, spec, sgd, options);
    // Each parameter generated whole from its block's index, whatever the split; each rank sets its part.
    for (int l = first; l < last; ++l) {
      std::uint64_t seed = 1000 + 100 * static_cast<std::uint64_t>(l);
      for (const auto& p : blocks_[static_cast<std::size_t>(l - first)].parameters()) {
        auto full = tensor_suite::random(p.split.numel(), ++seed, 0.3f);
        if (p.name.find(".ln") != std::string::npos && p.name.find("weight") != std::string::npos)
          for (auto& e : full) e += 1.0f;
        z_->set_parameter(p.name, tensor_suite::part_of(p.split, tp.rank(), full));
        names_.push_back(p.name);
        handles_.push_back(z_->handle(p.name));
      }
    }
  }

  std::size_t input_numel() const { return blocks_.front().rows() * config.hidden; }
  std::size_t output_numel() const { return input_numel(); }

  std::vector<float> forward(const std::vector<float>& x, int mb) {
    auto& saved = saved_[mb];
    std::vector<float> in = x, out(x.size());
    for (std::size_t l = 0; l < blocks_.size(); ++l) {
      saved.push_back(blocks_[l].make_activations());
      blocks_[l].forward(*tp_, weights(l), in, out, saved.back());
      z_->release(static_cast<int>(l));
      std::swap(in, out);
    }
    return in;
  }
  std::vector<float> backward(const std::vector<float>& dy, int mb) {
    auto node = saved_.extract(mb);
    REQUIRE(!node.empty());
    if constexpr (!zero::stage_policy_t<Stage>::shards_gradients) z_->set_gradient_sync(++backwards_ == micro_batches_);
    std::vector<float> g = dy, dx(dy.size());
    for (std::size_t l = blocks_.size(); l-- > 0;) {
      blocks_[l].backward(*tp_, weights(l), node.mapped()[l], g, dx, gradients(l));
      z_->release(static_cast<int>(l));
      z_->grad_ready(static_cast<int>(l));
      std::swap(g, dx);
    }
    return g;
  }

  //! The step's global gradient norm (before clipping).
  double step() {
    const auto result = z_->step();
    REQUIRE(result.applied);
    backwards_ = 0;
    return result.grad_norm;
  }
  //! This rank's parts of the stage's parameters, in the blocks' parameters() order.
  std::vector<std::vector<float>> parameters() const {
    std::vector<std::vector<float>> out;
    for (const auto& n : names_) out.push_back(z_->parameter(n));
    return out;
  }
  std::vector<tensor::transformer_block::parameter> shapes() const {
    std::vector<tensor::transformer_block::parameter> out;
    for (const auto& b : blocks_)
      for (const auto& p : b.parameters()) out.push_back(p);
    return out;
  }

 private:
  tensor::block_tensors<const float> weights(std::size_t l) {
    std::array<std::span<const float>, 12> s;
    for (std::size_t i = 0; i < 12; ++i) s[i] = z_->parameters(handles_[l * 12 + i]);
    return tensor::block_tensors<const float>::from(s);
  }
  tensor::block_tensors<float> gradients(std::size_t l) {
    std::array<std::span<float>, 12> s;
    for (std::size_t i = 0; i < 12; ++i) s[i] = z_->gradients(handles_[l * 12 + i]);
    return tensor::block_tensors<float>::from(s);
  }

  Comm* tp_;
  int micro_batches_, backwards_ = 0;
  std::vector<tensor::transformer_block> blocks_;
  std::unique_ptr<zero_type> z_;
  std::vector<std::string> names_;
  std::vector<trident::tensor_handle> handles_;
  std::map<int, std::vector<tensor::block_activations>> saved_;
};

// Micro-batch g of step s: input and target, the same on every rank.
inline std::vector<float> input_of(int step, int g, std::size_t n) { return tensor_suite::random(n, 5000 + static_cast<std::uint64_t>(step * 64 + g)); }
inline std::vector<float> target_of(int step, int g, std::size_t n) {
  return tensor_suite::random(n, 9000 + static_cast<std::uint64_t>(step * 64 + g));
}
// Mean squared error's gradient, scaled (the serial run averages over the data-parallel ranks).
inline double mse(const std::vector<float>& y, const std::vector<float>& t, float scale, std::vector<float>& dy) {
  double l = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const float d = y[i] - t[i];
    dy[i] = scale * 2.0f * d / static_cast<float>(y.size());
    l += static_cast<double>(d) * d / static_cast<double>(y.size());
  }
  return l;
}

//! `blocks` blocks on a (t, p) grid of `world` (d inferred), ZeRO stage `Stage` on the data
//! axis, schedule `make_schedule(p, m)`, `steps` steps of m micro-batches per data-parallel
//! rank, against one rank over all d x m micro-batches: within 1e-5 relative per tensor.
template <auto Stage, class Comm, class MakeSchedule>
void equals_serial(Comm& world, int tensor_size, int pipeline_size, int blocks, int m, int steps, MakeSchedule make_schedule) {
  trident::process_grid grid(world, tensor_size, pipeline_size);
  auto& dp = grid.data();
  auto& tp = grid.tensor();
  auto& pipe_comm = grid.pipeline();
  const int d = dp.size(), p = pipe_comm.size();
  REQUIRE(blocks % p == 0);
  const int per_stage = blocks / p;
  const std::size_t n = config.seq * config.batch * config.hidden;

  // Serial: every block on this rank alone, gradient accumulation over the d x m micro-batches.
  auto alone = world.split(world.rank(), 0);
  block_stage<0, Comm> serial(alone, alone, alone, 0, blocks, d * m);
  std::vector<double> serial_norms;
  for (int step = 0; step < steps; ++step) {
    for (int g = 0; g < d * m; ++g) {
      auto y = serial.forward(input_of(step, g, n), g);
      std::vector<float> dy(n);
      mse(y, target_of(step, g, n), 1.0f / static_cast<float>(d), dy);
      serial.backward(dy, g);
    }
    serial_norms.push_back(serial.step());
  }
  const auto want_all = serial.parameters();

  // 3-D: stage k holds blocks [k per_stage, (k + 1) per_stage).
  const int data_rank = dp.rank();
  const auto s = make_schedule(p, m);
  REQUIRE(p == 2);  // the pipeline type below has two stages
  pp::uniform_pipeline<block_stage<Stage, Comm>, 2> pipe(pipe_comm, [&](auto k) {
    const int first = static_cast<int>(k) * per_stage;
    return block_stage<Stage, Comm>(dp, tp, grid.model(), first, first + per_stage, m);
  });
  std::vector<double> norms;
  for (int step = 0; step < steps; ++step) {
    pipe.run(
        pipe_comm, s, [&](int mb) { return input_of(step, data_rank * m + mb, n); },
        [&](const std::vector<float>& y, int mb, std::vector<float>& dy) { return mse(y, target_of(step, data_rank * m + mb, n), 1.0f, dy); });
    for (int k = 0; k < p; ++k)
      if (pipe.owns(k)) pipe.visit(k, [&](auto& st) { norms.push_back(st.step()); });
  }
  // The global norm counts every parameter of every stage once: the serial run's, each step,
  // and clipping was active on every step.
  REQUIRE(norms.size() == serial_norms.size());
  for (std::size_t i = 0; i < norms.size(); ++i) {
    CHECK(serial_norms[i] > clip);
    CHECK(norms[i] == doctest::Approx(serial_norms[i]).epsilon(1e-5));
  }
  for (int k = 0; k < p; ++k) {
    if (!pipe.owns(k)) continue;
    pipe.visit(k, [&](auto& st) {
      const auto got = st.parameters();
      const auto shapes = st.shapes();
      REQUIRE(got.size() == shapes.size());
      // The serial run lists every block's parameters in order; stage k's start at its first block's.
      const std::size_t offset = static_cast<std::size_t>(k * per_stage) * 12;
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("ZeRO-", zero::stage_policy_t<Stage>::number, " (d, t, p) = (", d, ", ", tp.size(), ", ", p, "), schedule ", s.name,
             ", world rank ", world.rank(), ", ", shapes[i].name);
        const auto want = tensor_suite::part_of(shapes[i].split, tp.rank(), want_all[offset + i]);
        CHECK(tensor_suite::relative_error(got[i], want) <= 1e-5);
      }
    });
  }
}

}  // namespace grid_suite
