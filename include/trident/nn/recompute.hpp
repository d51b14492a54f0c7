// trident/nn/recompute.hpp — activation checkpointing: checkpointed<Layer> keeps only a layer's
// input and runs its forward again in backward (Chen et al. 2016; Megatron-LM's "full"
// recomputation). Host memory.
//
// Synopsis
//   concept recomputable_layer<L>    make_activations(), input_numel(), output_numel()
//   class checkpointed<Layer>        forward(comm, w, x, y, kept), backward(comm, w, kept, dy, dx, g)
//     struct activations             what forward keeps: the input, [input_numel()] floats
//     struct workspace               one layer's whole activations and an output, shared by every
//                                    checkpointed layer given the same one
//
// A layer opts in by having, besides the forward and backward that checkpointed forwards to,
//   Activations make_activations() const;          what its forward keeps for its backward
//   std::size_t input_numel() const;               the elements of x (and dx)
//   std::size_t output_numel() const;              the elements of y (and dy)
//   void forward(Comm&, const W&, std::span<const float> x, std::span<float> y, Activations&) const;
//   void backward(Comm&, const W&, const Activations&, std::span<const float> dy, std::span<float> dx, const G&) const;
// (tensor::transformer_block does, with its tensor-parallel group as Comm).
//
// Memory. A stack of L checkpointed layers sharing one workspace keeps L inputs plus one
// layer's activations, instead of L layers' activations; all of it is charged to the ledger as
// mem_category::activations, so the saving is measured (tests/nn/test_recompute.cpp). The
// price is one more forward per layer in backward, including its communication (a
// tensor-parallel layer's all-reduces run again, in the same order on every rank of its group).
//
// Exactness. The recomputed forward is the same arithmetic on the same input and weights, so
// backward sees the very activations forward made: training is bitwise the same as without
// checkpointing. The workspace holds nothing from one call to the next, so forwards and
// backwards of several micro-batches may interleave (a pipeline schedule's order).
//
//   auto ws = trident::nn::checkpointed<trident::tensor::transformer_block>::make_workspace(blocks[0]);
//   std::vector<trident::nn::checkpointed<trident::tensor::transformer_block>> stack;
//   for (auto& b : blocks) stack.emplace_back(b, ws);
//   auto kept = stack[0].make_activations();          // one input per layer and micro-batch
//   stack[0].forward(tp, w, x, y, kept);  ...  stack[0].backward(tp, w, kept, dy, dx, g);
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"

namespace trident::nn {

//! A layer checkpointed<> can wrap: it makes the activations its forward keeps, and says the
//! sizes of its input and output (see the top of this header for the forward and backward).
template <class L>
concept recomputable_layer = std::copy_constructible<L> && requires(const L& l) {
  l.make_activations();
  { l.input_numel() } -> std::convertible_to<std::size_t>;
  { l.output_numel() } -> std::convertible_to<std::size_t>;
};

//! `Layer` with full activation recomputation: forward keeps its input only; backward runs the
//! forward again into a workspace, then the layer's backward from it.
template <recomputable_layer Layer>
class checkpointed {
 public:
  using layer_type = Layer;
  using inner_activations = std::remove_cvref_t<decltype(std::declval<const Layer&>().make_activations())>;

  //! What forward keeps for backward: the layer's input.
  struct activations {
    buffer<float, host_space> x;
  };

  //! Where forwards run and backwards recompute: one layer's activations and output. Shared by
  //! the layers of a stack (they run one at a time), so a stack holds one.
  struct workspace {
    inner_activations inner;
    buffer<float, host_space> y;
    std::size_t input_numel = 0;
  };

  //! A workspace for `layer` and layers of its sizes, charged to the ledger as activations.
  static std::shared_ptr<workspace> make_workspace(const Layer& layer) {
    return std::make_shared<workspace>(
        workspace{layer.make_activations(), buffer<float, host_space>(layer.output_numel(), mem_category::activations), layer.input_numel()});
  }

  //! With a workspace of its own.
  explicit checkpointed(Layer layer) : layer_(std::move(layer)), ws_(make_workspace(layer_)) {}
  //! Sharing `ws` (made by make_workspace for a layer of the same sizes) with other layers.
  checkpointed(Layer layer, std::shared_ptr<workspace> ws) : layer_(std::move(layer)), ws_(std::move(ws)) {
    TRIDENT_EXPECT(ws_ != nullptr, "checkpointed: no workspace; expected one from make_workspace()");
    TRIDENT_EXPECT(ws_->y.size() == layer_.output_numel() && ws_->input_numel == layer_.input_numel(),
                   "checkpointed: the workspace is for a layer of input ", ws_->input_numel, " and output ", ws_->y.size(),
                   " elements; this layer's are ", layer_.input_numel(), " and ", layer_.output_numel(),
                   " (share a workspace only between layers of the same sizes)");
  }

  const Layer& layer() const noexcept { return layer_; }
  const std::shared_ptr<workspace>& shared_workspace() const noexcept { return ws_; }
  std::size_t input_numel() const { return layer_.input_numel(); }
  std::size_t output_numel() const { return layer_.output_numel(); }

  //! Storage for one forward's input (per micro-batch in flight), charged as activations.
  activations make_activations() const { return {buffer<float, host_space>(layer_.input_numel(), mem_category::activations)}; }

  //! y from x, as the layer's forward; keeps x.
  template <class Comm, class Weights>
  void forward(Comm& comm, const Weights& w, std::span<const float> x, std::span<float> y, activations& kept) const {
    TRIDENT_EXPECT(kept.x.size() == x.size() && x.size() == layer_.input_numel(), "checkpointed: forward of an input of ", x.size(),
                   " elements into kept activations of ", kept.x.size(), "; the layer takes ", layer_.input_numel());
    std::copy(x.begin(), x.end(), kept.x.span().begin());
    layer_.forward(comm, w, x, y, ws_->inner);
  }

  //! dx from dy, as the layer's backward (gradients accumulate as it makes them), after its
  //! forward on the kept input has run again.
  template <class Comm, class Weights, class Gradients>
  void backward(Comm& comm, const Weights& w, const activations& kept, std::span<const float> dy, std::span<float> dx,
                const Gradients& g) const {
    TRIDENT_EXPECT(kept.x.size() == layer_.input_numel(), "checkpointed: backward from kept activations of ", kept.x.size(),
                   " elements; the layer takes ", layer_.input_numel(), " (expected this layer's make_activations())");
    layer_.forward(comm, w, std::span<const float>(kept.x.span()), ws_->y.span(), ws_->inner);
    layer_.backward(comm, w, ws_->inner, dy, dx, g);
  }

 private:
  Layer layer_;
  std::shared_ptr<workspace> ws_;
};

}  // namespace trident::nn
