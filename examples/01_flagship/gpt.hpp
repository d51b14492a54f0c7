#pragma once
// flagship::gpt: a GPT-2-style language model assembled from trident's parts (issue 13), on the
// host: every thread rank or MPI rank runs its share.
//
//   token + position embedding   vocabulary-parallel (tensor::vocab_parallel_embedding)
//   N pre-LayerNorm blocks       tensor-parallel attention and MLP (tensor::transformer_block),
//                                sequence parallelism optional
//   final LayerNorm, head        the head is the token embedding's transpose (tied), column-
//                                parallel, into tensor::vocab_parallel_cross_entropy
//
// The layers are cut into `chunks` pipeline stages of layers / chunks blocks each (chunk 0 also
// holds the embeddings, the last chunk the final norm and the head); chunk k runs on pipeline
// rank k % p, so p < chunks gives each rank several (interleaved schedules). A rank keeps all
// the parameters of its chunks in ONE zero_optimizer over the data axis, whose model-parallel
// group is process_grid::model(): the clipped global norm spans every stage and every tensor
// shard, each replica counted once (tensor rank 0's).
//
// The tied head across stages (Megatron-LM's "embedding group"): when chunk 0 and the last chunk
// are different stages, the last one holds a copy of its rank's part of the token embedding,
// outside the optimizer (so the norm counts it once). Its gradient is sent to chunk 0's rank
// after the pipeline has run and added to the embedding's before that layer is reduced; after
// the step chunk 0's rank sends the new values back. Both go over the pipeline communicator
// (pipeline ranks 0 and p - 1 at the same data and tensor coordinates), when no stage message
// is in flight. The embedding layer therefore gets its gradients from every micro-batch before
// it is marked ready once per step, so it sits in a bucket of its own (model_spec::
// bucket_boundary), and so does each chunk, whose last micro-batch comes at its own time.
//
// Messages between stages are activations [rows, hidden] (rows = seq x batch, or seq / t x batch
// under sequence parallelism), sequence-major as the blocks lay them out. Chunk 0 reads its
// micro-batch's tokens from the step's batches instead of its input message (one unused
// element), and the last chunk returns the micro-batch's mean cross-entropy as a one-element
// message, whose gradient is the loss's weight in the step (1 / micro-batches): the pipeline's
// loss callback is then two lines, and the classifier runs its backward in the forward, as
// llm.c's does (the softmax's gradient replaces the logits, scaled by that weight later).
//
//   flagship::gpt_rank<2, trident::local_comm, opt_t> rank(grid, cfg, chunks, m, batch, opt, zo, seed);
//   trident::pipeline::uniform_pipeline<flagship::gpt_stage, 4> pipe(
//       grid.pipeline(), [&](auto k) { return flagship::gpt_stage(rank, static_cast<int>(k)); });
//   rank.set_batches(&batches);   pipe.run(...);   rank.finish_backward();   rank.step();
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "trident/checkpoint/zero.hpp"
#include "trident/comm/communicator.hpp"
#include "trident/comm/process_grid.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/data/token_shards.hpp"
#include "trident/model/flat_layout.hpp"
#include "trident/model/init.hpp"
#include "trident/model/sharding.hpp"
#include "trident/nn/norm.hpp"
#include "trident/nn/recompute.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"
#include "trident/parallel/tensor/block.hpp"
#include "trident/parallel/tensor/linear.hpp"
#include "trident/parallel/tensor/regions.hpp"
#include "trident/parallel/tensor/vocab.hpp"
#include "trident/precision/mixed_precision.hpp"

namespace flagship {

namespace tensor = trident::tensor;
namespace zero = trident::zero;

//! The model's dimensions.
//! What the blocks keep from forward for backward (issue 14): everything; everything but the
//! attention probabilities, recomputed in backward (selective: Korthikanti et al.); or only
//! each block's input, its forward run again in backward (full: nn::checkpointed). Training is
//! bitwise the same in all three.
enum class recompute_mode { none, selective, full };
inline const char* name_of(recompute_mode r) {
  return r == recompute_mode::none ? "none" : r == recompute_mode::selective ? "selective" : "full";
}
inline recompute_mode parse_recompute(const std::string& s) {
  if (s == "none") return recompute_mode::none;
  if (s == "selective") return recompute_mode::selective;
  if (s == "full") return recompute_mode::full;
  throw trident::usage_error("recompute '" + s + "': expected none, selective or full");
}

struct gpt_config {
  std::size_t vocab = 256;
  std::size_t seq = 64;
  std::size_t hidden = 64;
  std::size_t heads = 4;
  std::size_t layers = 4;
  std::size_t ffn = 0;  // 0: 4 x hidden
  bool sequence_parallel = false;
  float eps = 1e-5f;
  recompute_mode recompute = recompute_mode::none;
  //! Attention in tiles (tensor::block_config::flash_attention): on the GPU path for memory
  //! (and, with flash_bf16, speed); the host path runs the same tiles' emulation, the GPU's
  //! numerics for its serial reference (slow: the flagship's command line offers it on nccl only).
  bool flash_attention = false;
  //! With flash_attention: the bf16 tiles with the scores in registers
  //! (tensor::block_config::flash_bf16, `--attention flash_bf16`).
  bool flash_bf16 = false;
  //! Every GEMM (the blocks' linear layers and the head) on operands rounded to bf16, float
  //! sums and results (`--gemm bf16`: gemm_math::bf16 on the GPU path; the host path emulates
  //! it, the serial reference of such a GPU run, exact with flash_attention, whose tiles the host
  //! emulates too, while the GPU's unfused attention keeps its own products in TF32).
  bool bf16_gemm = false;

  std::size_t ffn_size() const noexcept { return ffn == 0 ? 4 * hidden : ffn; }
  //! Parameters of one block.
  std::size_t block_parameters() const noexcept {
    const std::size_t h = hidden, f = ffn_size();
    return 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (f * h + f) + (h * f + h);
  }
  //! Parameters of the whole model (the head is the token embedding).
  std::size_t parameters() const noexcept { return vocab * hidden + seq * hidden + layers * block_parameters() + 2 * hidden; }
  //! Training FLOPs per token, as nanoGPT and PaLM count them: 6 per parameter that multiplies
  //! (all but the position embedding) and 12 x layers x seq x hidden for attention's two
  //! products, forward and backward (the causal mask is not subtracted).
  double flops_per_token() const noexcept {
    const double n = static_cast<double>(parameters() - seq * hidden);
    return 6.0 * n + 12.0 * static_cast<double>(layers) * static_cast<double>(seq) * static_cast<double>(hidden);
  }
};

//! A step's micro-batches on this rank: tokens and their next tokens, sequence-major
//! (position i of row b at i x batch + b), as the layers lay out their rows.
struct step_batches {
  std::vector<std::vector<std::int32_t>> inputs, targets;
};

//! Appends the loader's next batch (B x T, row-major) to `out`, sequence-major.
inline void append_batch(trident::data::shard_loader& loader, trident::data::token_batch& scratch, step_batches& out) {
  loader.next_into(scratch);
  const std::size_t b = loader.rows(), t = loader.sequence();
  std::vector<std::int32_t> in(b * t), tg(b * t);
  for (std::size_t r = 0; r < b; ++r)
    for (std::size_t i = 0; i < t; ++i) {
      in[i * b + r] = scratch.inputs[r * t + i];
      tg[i * b + r] = scratch.targets[r * t + i];
    }
  out.inputs.push_back(std::move(in));
  out.targets.push_back(std::move(tg));
}

//! One parameter of the model: its name, how it is split over the tensor group, and how it is
//! initialised (GPT-2's: weights N(0, 0.02), the projections into the residual stream
//! N(0, 0.02 / sqrt(2 layers)), biases 0, norm weights 1), drawn by global index from the seed,
//! so every tensor-parallel size gives the same model.
struct gpt_parameter {
  std::string name;
  trident::sharding split;
  std::uint64_t stream;
  enum class kind { normal, zeros, ones } init = kind::normal;
  float std = 0.02f;

  std::vector<float> part(int rank) const {
    std::vector<float> local(split.local_numel());
    if (init == kind::normal) trident::init_part(split, rank, stream, trident::init_normal{0.0f, std}, local);
    else trident::init_part(split, rank, stream, trident::init_constant{init == kind::ones ? 1.0f : 0.0f}, local);
    return local;
  }
};

namespace detail {

inline std::uint64_t stream_of(std::uint64_t seed, std::uint64_t what) noexcept {
  return trident::detail::splitmix64(trident::detail::splitmix64(seed) ^ (what * 0x9E3779B97F4A7C15ull));
}

// Block l's parameters with their initialisation, from transformer_block's own list.
inline std::vector<gpt_parameter> block_parameters(const tensor::transformer_block& b, std::uint64_t seed, int layer, int layers) {
  std::vector<gpt_parameter> out;
  const auto ps = b.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const auto& name = ps[i].name;
    gpt_parameter p{name, ps[i].split, stream_of(seed, 1000 + 100 * static_cast<std::uint64_t>(layer) + i)};
    if (name.ends_with(".bias")) p.init = gpt_parameter::kind::zeros;
    else if (name.find(".ln") != std::string::npos) p.init = gpt_parameter::kind::ones;
    else if (name.ends_with("proj.weight") || name.ends_with("fc2.weight")) p.std = static_cast<float>(0.02 / std::sqrt(2.0 * layers));
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace detail

//! Every parameter of the model in forward order, split for a tensor group of `t` (t = 1: the
//! whole tensors, e.g. to write the initial weights for a reference implementation).
template <trident::communicator Comm>
std::vector<gpt_parameter> gpt_parameters(const Comm& tp, const gpt_config& c, std::uint64_t seed) {
  std::vector<gpt_parameter> out;
  const tensor::vocab_parallel_embedding wte(tp, c.vocab, c.hidden, "wte");
  out.push_back({"wte", wte.weight_sharding(), detail::stream_of(seed, 1)});
  out.push_back({"wpe", trident::sharding::replicated({c.seq, c.hidden}), detail::stream_of(seed, 2)});
  for (std::size_t l = 0; l < c.layers; ++l) {
    std::string name = "h";  // not "h" + to_string(l): g++ 12 -O3 warns falsely on that (-Wrestrict)
    name += std::to_string(l);
    const tensor::transformer_block b(tp, {.seq = c.seq, .batch = 1, .hidden = c.hidden, .heads = c.heads, .ffn = c.ffn, .eps = c.eps},
                                      name);
    for (auto& p : detail::block_parameters(b, seed, static_cast<int>(l), static_cast<int>(c.layers))) out.push_back(std::move(p));
  }
  out.push_back({"ln_f.weight", trident::sharding::replicated({c.hidden}), detail::stream_of(seed, 3), gpt_parameter::kind::ones});
  out.push_back({"ln_f.bias", trident::sharding::replicated({c.hidden}), detail::stream_of(seed, 4), gpt_parameter::kind::zeros});
  return out;
}

//! What a pipeline stage asks of the rank that holds it. Virtual, so that the pipeline's
//! types (one per stage count) do not multiply with the ZeRO stages and optimizers: the run-time
//! choices compile into a handful of instantiations instead of their product.
//! And what the training loop asks of it (trainer.hpp), for the same reason: the loop compiles
//! once per stage count, not once per ZeRO stage and precision as well.
class chunk_runner {
 public:
  using message = std::vector<float>;
  struct step_outcome {
    double grad_norm = 0;
    bool applied = true;
  };
  virtual ~chunk_runner() = default;
  virtual std::size_t input_numel(int k) const = 0;
  virtual std::size_t output_numel(int k) const = 0;
  virtual message forward(int k, const message& x, int mb) = 0;
  virtual message backward(int k, const message& dy, int mb) = 0;
  virtual message evaluate(int k, const message& x, int mb) = 0;
  virtual void set_batches(const step_batches* b) = 0;
  virtual void finish_backward() = 0;
  virtual step_outcome step() = 0;
  virtual float loss_scale() const = 0;
  //! Checkpoints of the whole grid's optimizer state (trident/checkpoint/zero.hpp), collective
  //! over the world: save_checkpoint starts an asynchronous save (waiting for the previous
  //! one), finish_saves waits for the last, load_checkpoint loads the newest good one under
  //! `root` (any layout it was saved in), or returns nullopt when there is none (`skipped`, if
  //! given, gets why each newer one did not load, where this rank found the fault).
  virtual void save_checkpoint(const std::filesystem::path& root, std::int64_t step, std::map<std::string, std::string> metadata,
                               int keep) = 0;
  virtual void finish_saves() = 0;
  virtual std::optional<trident::checkpoint::load_result> load_checkpoint(const std::filesystem::path& root,
                                                                          std::vector<std::string>* skipped = nullptr) = 0;
};

//! This rank's chunks of the model and the optimizer that holds their parameters.
//! Stage: the ZeRO stage (0-3 or a policy); Opt: the optimizer (e.g. scheduled<adamw, ...>);
//! Precision: full_precision, or mixed_precision<bf16 / fp16> (fp32 master weights in the
//! optimizer, half working weights and gradients; the host layers compute in float on the
//! working weights, and each layer's gradients, computed in float, are added to the half ones
//! when its backward is done).
template <auto Stage, trident::communicator Comm, class Opt, class Precision = trident::full_precision>
class gpt_rank final : public chunk_runner {
 public:
  using zero_type = zero::zero_optimizer<Stage, Opt, Comm, Precision>;
  using policy = zero::stage_policy_t<Stage>;
  using half_type = typename Precision::half_type;
  static constexpr bool full = std::is_same_v<half_type, float>;
  //! Collective over the grid (the optimizer's construction). `chunks` stages of the model over
  //! the pipeline axis, `micro_batches` per step and data-parallel rank, `batch` rows each.
  gpt_rank(trident::process_grid<Comm>& grid, const gpt_config& c, int chunks, int micro_batches, std::size_t batch, Opt opt,
           zero::zero_options options, std::uint64_t seed, typename Precision::scaler_type scaler = {})
      : world_(&grid.world()), tp_(&grid.tensor()), pipe_(&grid.pipeline()), c_(validated(c, grid, chunks)), chunks_(chunks),
        p_(grid.pipeline().size()), prank_(grid.pipeline().rank()), m_(micro_batches), batch_(batch),
        block_cfg_{.seq = c.seq, .batch = batch, .hidden = c.hidden, .heads = c.heads, .ffn = c.ffn, .eps = c.eps,
                   .sequence_parallel = c.sequence_parallel, .selective_recompute = c.recompute == recompute_mode::selective,
                   .flash_attention = c.flash_attention, .flash_bf16 = c.flash_bf16, .bf16_gemm = c.bf16_gemm},
        wte_(grid.tensor(), c.vocab, c.hidden, "wte"), head_(grid.tensor(), c.hidden, c.vocab, "lm_head"),
        ce_(grid.tensor(), c.vocab, "lm_head") {
    TRIDENT_EXPECT(micro_batches >= 1 && batch >= 1, "gpt_rank: ", micro_batches, " micro-batches of ", batch,
                   " rows; expected at least one of each");
    head_.bf16_operands = c.bf16_gemm;
    const auto all = gpt_parameters(grid.tensor(), c_, seed);
    const int per_chunk = static_cast<int>(c_.layers) / chunks_;
    const int t_rank = grid.tensor().rank();
    trident::model_spec spec;
    std::vector<const gpt_parameter*> mine;
    auto add = [&](const gpt_parameter& p, int layer) {
      spec.add(p.name, p.split, t_rank, layer);  // part t_rank of the global tensor (checkpoints reshard by it)
      mine.push_back(&p);
    };
    auto find = [&](const std::string& name) -> const gpt_parameter& {
      for (const auto& p : all)
        if (p.name == name) return p;
      throw trident::usage_error("gpt_rank: no parameter " + name);
    };
    int layer = 0;
    for (int k = prank_; k < chunks_; k += p_) {
      chunk ch;
      ch.k = k;
      if (layer > 0) spec.bucket_boundary(layer);  // each chunk's buckets are its own
      if (k == 0) {
        ch.emb_layer = layer;
        add(find("wte"), layer);
        add(find("wpe"), layer);
        ++layer;
        spec.bucket_boundary(layer);  // the embedding is reduced once per step, after the others
      }
      ch.first_block_layer = layer;
      for (int l = k * per_chunk; l < (k + 1) * per_chunk; ++l) {
        ch.blocks.emplace_back(grid.tensor(), block_cfg_, "h" + std::to_string(l));
        // One recomputation workspace for all of this rank's blocks: they run one at a time.
        if (c_.recompute == recompute_mode::selective && (!chunks_mine_.empty() || ch.blocks.size() > 1))
          ch.blocks.back().share_attention_workspace(chunks_mine_.empty() ? ch.blocks.front() : chunks_mine_.front().blocks.front());
        // And one backward workspace (the gradients between a block's layers).
        if (!chunks_mine_.empty() || ch.blocks.size() > 1)
          ch.blocks.back().share_backward_workspace(chunks_mine_.empty() ? ch.blocks.front() : chunks_mine_.front().blocks.front());
        if (c_.recompute == recompute_mode::full) {
          if (!checkpoint_ws_) checkpoint_ws_ = checkpointed_block::make_workspace(ch.blocks.back());
          ch.checkpointed.emplace_back(ch.blocks.back(), checkpoint_ws_);
        }
        for (const auto& p : ch.blocks.back().parameters()) add(find(p.name), layer);
        ++layer;
      }
      if (k == chunks_ - 1) {
        ch.final_layer = layer;
        ch.final_rows = local_rows();
        ch.final_hidden = c_.hidden;
        ch.final_logits = c_.seq * batch_ * ce_.vocab_range().size();
        add(find("ln_f.weight"), layer);
        add(find("ln_f.bias"), layer);
        ++layer;
      }
      chunks_mine_.push_back(std::move(ch));
    }
    if (options.count_replicas == std::nullopt) options.count_replicas = t_rank == 0;
    z_ = std::make_unique<zero_type>(grid.data(), grid.model(), spec, std::move(opt), options, std::move(scaler));
    for (const auto* p : mine) z_->set_parameter(p->name, p->part(t_rank));
    for (auto& ch : chunks_mine_) {
      if (ch.emb_layer >= 0) {
        wte_h_ = z_->handle("wte");
        wpe_h_ = z_->handle("wpe");
      }
      for (const auto& b : ch.blocks) {
        std::size_t n = 0;
        for (const auto& p : b.parameters()) {
          ch.handles.push_back(z_->handle(p.name));
          n += p.split.local_numel();
        }
        block_arena_ = std::max(block_arena_, n);
      }
      if (ch.final_layer >= 0) {
        lnf_w_ = z_->handle("ln_f.weight");
        lnf_b_ = z_->handle("ln_f.bias");
      }
    }
    // Float scratch for the layers' views of half weights and gradients (unused in fp32).
    if constexpr (!full) {
      const std::size_t wte = wte_.weight_sharding().local_numel(), h = c_.hidden;
      weights_.resize(block_arena_);
      grads_.resize(block_arena_);
      emb_w_.resize(wte + c_.seq * h);
      emb_g_.resize(wte + c_.seq * h);
      head_w_.resize(wte);
      head_g_.resize(wte);
      lnf_w_scratch_.resize(2 * h);
      lnf_g_.resize(2 * h);
    }
    // The last chunk's copy of the tied embedding, when chunk 0 is another stage.
    if (owns(chunks_ - 1) && chunks_ > 1) {
      const auto w = find("wte").part(t_rank);
      wte_copy_ = trident::buffer<float, trident::host_space>(w.size(), trident::mem_category::parameters);
      head_grad_ = trident::buffer<float, trident::host_space>(w.size(), trident::mem_category::gradients);
      // The working weights' values: rounded to the half type, as chunk 0's are.
      std::transform(w.begin(), w.end(), wte_copy_.span().begin(), [](float v) { return static_cast<float>(static_cast<half_type>(v)); });
      std::fill(head_grad_.span().begin(), head_grad_.span().end(), 0.0f);
    }
  }

  gpt_rank(const gpt_rank&) = delete;
  gpt_rank& operator=(const gpt_rank&) = delete;

  const gpt_config& config() const noexcept { return c_; }
  int chunks() const noexcept { return chunks_; }
  bool owns(int k) const noexcept { return k % p_ == prank_; }
  zero_type& optimizer() noexcept { return *z_; }
  //! The factor the loss's gradient is multiplied by (fp16's loss scale; 1 otherwise).
  float loss_scale() const override { return z_->loss_scale(); }
  //! Rows of the activations on this rank: seq x batch, or seq / t x batch with sequence parallelism.
  std::size_t local_rows() const noexcept {
    const std::size_t n = c_.seq * batch_;
    return c_.sequence_parallel ? n / static_cast<std::size_t>(tp_->size()) : n;
  }
  std::size_t input_numel(int k) const override { return k == 0 ? 1 : local_rows() * c_.hidden; }
  std::size_t output_numel(int k) const override { return k == chunks_ - 1 ? 1 : local_rows() * c_.hidden; }

  //! The micro-batches the next forwards read (chunk 0: inputs; the last chunk: targets).
  void set_batches(const step_batches* b) override { batches_ = b; }

  message forward(int k, const message& x, int mb) override {
    auto& ch = chunk_of(k);
    auto& saved = ch.saved[mb];
    if (saved.blocks.empty() && saved.inputs.empty()) saved = ch.take();
    message cur(local_rows() * c_.hidden), next(cur.size());
    if (ch.emb_layer >= 0) embed(ch, mb, cur);
    else {
      TRIDENT_EXPECT(x.size() == cur.size(), "gpt chunk ", k, ": input of ", x.size(), " elements; expected ", cur.size());
      std::copy(x.begin(), x.end(), cur.begin());
    }
    for (std::size_t l = 0; l < ch.blocks.size(); ++l) {
      if (ch.checkpointed.empty()) ch.blocks[l].forward(*tp_, weights(ch, l), cur, next, saved.blocks[l]);
      else ch.checkpointed[l].forward(*tp_, weights(ch, l), cur, next, saved.inputs[l]);
      z_->release(ch.first_block_layer + static_cast<int>(l));
      std::swap(cur, next);
    }
    if (ch.final_layer >= 0) return {head_forward(ch, mb, cur, saved)};
    return cur;
  }

  message backward(int k, const message& dy, int mb) override {
    auto& ch = chunk_of(k);
    auto node = ch.saved.extract(mb);
    TRIDENT_EXPECT(!node.empty(), "gpt chunk ", k, ": backward of micro-batch ", mb, " without its forward");
    auto& saved = node.mapped();
    // Stages 0-1 reduce a bucket once per step: on the chunk's last micro-batch.
    if constexpr (!policy::shards_gradients) z_->set_gradient_sync(++ch.backwards == m_);
    message g(local_rows() * c_.hidden), dx(g.size());
    if (ch.final_layer >= 0) {
      TRIDENT_EXPECT(dy.size() == 1, "gpt chunk ", k, ": the loss's gradient has ", dy.size(), " elements; expected 1");
      head_backward(ch, mb, dy[0], saved, g);
    } else {
      TRIDENT_EXPECT(dy.size() == g.size(), "gpt chunk ", k, ": output gradient of ", dy.size(), " elements; expected ", g.size());
      std::copy(dy.begin(), dy.end(), g.begin());
    }
    for (std::size_t l = ch.blocks.size(); l-- > 0;) {
      const int layer = ch.first_block_layer + static_cast<int>(l);
      if (ch.checkpointed.empty()) ch.blocks[l].backward(*tp_, weights(ch, l), saved.blocks[l], g, dx, gradients(ch, l));
      else ch.checkpointed[l].backward(*tp_, weights(ch, l), saved.inputs[l], g, dx, gradients(ch, l));
      commit();
      z_->release(layer);
      z_->grad_ready(layer);
      std::swap(g, dx);
    }
    ch.give_back(std::move(saved));
    if (ch.emb_layer >= 0) {
      embed_backward(mb, g);
      return message(1, 0.0f);
    }
    return g;
  }

  //! After the pipeline has run a step's micro-batches: the tied head's gradient joins the
  //! embedding's, which is then reduced (once per step).
  void finish_backward() override {
    if (chunks_ > 1 && owns(chunks_ - 1) && !owns(0)) {
      pipe_->send(std::span<const float>(head_grad_.span()), 0);
      std::fill(head_grad_.span().begin(), head_grad_.span().end(), 0.0f);
    }
    if (!owns(0)) return;
    if constexpr (!policy::shards_gradients) z_->set_gradient_sync(true);
    if (chunks_ > 1) {
      std::span<half_type> g = z_->gradients(wte_h_);
      if (owns(chunks_ - 1)) {
        add_into(g, head_grad_.span());
        std::fill(head_grad_.span().begin(), head_grad_.span().end(), 0.0f);
      } else {
        tie_scratch_.resize(g.size());
        pipe_->recv(std::span<float>(tie_scratch_), (chunks_ - 1) % p_);
        add_into(g, tie_scratch_);
      }
    }
    z_->grad_ready(emb_layer());
  }

  //! The optimizer's step, then the new token embedding to the last chunk's copy.
  step_outcome step() override {
    const auto r = z_->step();
    for (auto& ch : chunks_mine_) ch.backwards = 0;
    send_tied_embedding();
    return {r.grad_norm, r.applied};
  }

  void save_checkpoint(const std::filesystem::path& root, std::int64_t step, std::map<std::string, std::string> metadata,
                       int keep) override {
    pending_save_ = trident::checkpoint::save_async(*world_, *z_, root, step, {.metadata = std::move(metadata), .keep = keep},
                                                    std::move(pending_save_));
  }
  void finish_saves() override {
    trident::checkpoint::detail::agreed(*world_, "gpt_rank::finish_saves", [&] { pending_save_.wait(); });
  }
  std::optional<trident::checkpoint::load_result> load_checkpoint(const std::filesystem::path& root,
                                                                  std::vector<std::string>* skipped = nullptr) override {
    auto r = trident::checkpoint::load_latest(*world_, *z_, root, skipped, /*echoes=*/false);
    if (r) send_tied_embedding();  // the last chunk's copy of the token embedding, as loaded
    return r;
  }

 private:
  // The token embedding's working weights from chunk 0's rank to the last chunk's copy.
  void send_tied_embedding() {
    if (chunks_ > 1) {
      if (owns(0)) {
        std::span<const half_type> w = z_->parameters(wte_h_);
        if (owns(chunks_ - 1)) {
          std::transform(w.begin(), w.end(), wte_copy_.span().begin(), [](half_type v) { return static_cast<float>(v); });
        } else if constexpr (full) {
          pipe_->send(w, (chunks_ - 1) % p_);
        } else {
          tie_scratch_.resize(w.size());
          std::transform(w.begin(), w.end(), tie_scratch_.begin(), [](half_type v) { return static_cast<float>(v); });
          pipe_->send(std::span<const float>(tie_scratch_), (chunks_ - 1) % p_);
        }
        z_->release(emb_layer());
      } else if (owns(chunks_ - 1)) {
        pipe_->recv(wte_copy_.span(), 0);
      }
    }
  }

 public:

  //! Forward only (validation): micro-batch `mb` of the batches set, nothing kept.
  message evaluate(int k, const message& x, int mb) override {
    const int key = -1 - mb;
    auto y = forward(k, x, key);
    auto& ch = chunk_of(k);
    auto node = ch.saved.extract(key);
    ch.give_back(std::move(node.mapped()));
    return y;
  }

  //! This rank's part of every parameter it holds, by name (for tests and checkpoints).
  std::map<std::string, std::vector<float>> parameters() {
    std::map<std::string, std::vector<float>> out;
    for (const auto& name : names()) {
      const auto v = z_->parameter(name);
      std::vector<float> f(v.size());
      std::transform(v.begin(), v.end(), f.begin(), [](auto x) { return static_cast<float>(x); });
      out.emplace(name, std::move(f));
    }
    return out;
  }

 private:
  // What forward keeps for backward, per micro-batch; recycled through a pool so that a warm
  // step allocates no activations.
  struct final_saved {
    trident::buffer<float, trident::host_space> x, out, mean, rstd, logits;
  };
  using checkpointed_block = trident::nn::checkpointed<tensor::transformer_block>;
  struct saved_set {
    std::vector<tensor::block_activations> blocks;  // or, under full recomputation:
    std::vector<checkpointed_block::activations> inputs;
    std::optional<final_saved> final;
  };
  struct chunk {
    int k = 0;
    int emb_layer = -1, first_block_layer = 0, final_layer = -1;
    int backwards = 0;
    std::vector<tensor::transformer_block> blocks;
    std::vector<checkpointed_block> checkpointed;  // the blocks again, under full recomputation
    std::vector<trident::tensor_handle> handles;  // 12 per block
    std::map<int, saved_set> saved;
    std::vector<saved_set> pool;
    std::size_t final_rows = 0, final_hidden = 0, final_logits = 0;

    saved_set take() {
      if (!pool.empty()) {
        auto s = std::move(pool.back());
        pool.pop_back();
        return s;
      }
      saved_set s;
      if (checkpointed.empty())
        for (const auto& b : blocks) s.blocks.push_back(b.make_activations());
      for (const auto& b : checkpointed) s.inputs.push_back(b.make_activations());
      if (final_layer >= 0) {
        auto kept = [](std::size_t n) { return trident::buffer<float, trident::host_space>(n, trident::mem_category::activations); };
        s.final = final_saved{kept(final_rows * final_hidden), kept(final_rows * final_hidden), kept(final_rows),
                              kept(final_rows), kept(final_logits)};
      }
      return s;
    }
    void give_back(saved_set&& s) { pool.push_back(std::move(s)); }
  };

  static gpt_config validated(const gpt_config& c, trident::process_grid<Comm>& grid, int chunks) {
    const int t = grid.tensor().size(), p = grid.pipeline().size();
    TRIDENT_EXPECT(c.vocab >= 1 && c.seq >= 1 && c.hidden >= 1 && c.heads >= 1 && c.layers >= 1, "gpt: vocab ", c.vocab, ", seq ",
                   c.seq, ", hidden ", c.hidden, ", heads ", c.heads, ", layers ", c.layers, "; expected all at least 1");
    TRIDENT_EXPECT(chunks >= 1 && chunks % p == 0, "gpt: ", chunks, " pipeline stages over ", p,
                   " pipeline ranks; expected a multiple of the ranks");
    TRIDENT_EXPECT(c.layers % static_cast<std::size_t>(chunks) == 0, "gpt: ", c.layers, " layers do not divide into ", chunks,
                   " pipeline stages (p x virtual stages); expected layers to be a multiple of it");
    TRIDENT_EXPECT(c.vocab % static_cast<std::size_t>(t) == 0, "gpt: the vocabulary of ", c.vocab,
                   " tokens does not divide over a tensor-parallel group of ", t, "; pad it to a multiple of t (e.g. ",
                   (c.vocab + static_cast<std::size_t>(t) - 1) / static_cast<std::size_t>(t) * static_cast<std::size_t>(t), ")");
    TRIDENT_EXPECT(c.vocab <= (std::size_t{1} << 31), "gpt: a vocabulary of ", c.vocab, " tokens exceeds int32 token ids");
    return c;
  }

  chunk& chunk_of(int k) {
    for (auto& ch : chunks_mine_)
      if (ch.k == k) return ch;
    throw trident::usage_error(trident::detail::concat("gpt: stage ", k, " is not on pipeline rank ", prank_));
  }
  int emb_layer() const {
    for (const auto& ch : chunks_mine_)
      if (ch.emb_layer >= 0) return ch.emb_layer;
    return -1;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& ch : chunks_mine_) {
      if (ch.emb_layer >= 0) out.insert(out.end(), {"wte", "wpe"});
      for (const auto& b : ch.blocks)
        for (const auto& p : b.parameters()) out.push_back(p.name);
      if (ch.final_layer >= 0) out.insert(out.end(), {"ln_f.weight", "ln_f.bias"});
    }
    return out;
  }

  // Float views of the optimizer's tensors. In fp32 they are its own spans. Otherwise a
  // parameter is converted into `arena` at `at` (valid until the arena is used again), and a
  // gradient view is zeroed float scratch that commit() adds into the half gradients.
  std::span<const float> param_view(trident::tensor_handle h, std::vector<float>& arena, std::size_t& at) {
    std::span<const half_type> p = z_->parameters(h);
    if constexpr (full) {
      return p;
    } else {
      TRIDENT_EXPECT(at + p.size() <= arena.size(), "gpt: internal: a scratch arena of ", arena.size(), " floats is too small");
      float* out = arena.data() + at;
      for (std::size_t i = 0; i < p.size(); ++i) out[i] = static_cast<float>(p[i]);
      at += p.size();
      return {out, p.size()};
    }
  }
  std::span<float> grad_view(trident::tensor_handle h, std::vector<float>& arena, std::size_t& at) {
    std::span<half_type> g = z_->gradients(h);
    if constexpr (full) {
      return g;
    } else {
      TRIDENT_EXPECT(at + g.size() <= arena.size(), "gpt: internal: a scratch arena of ", arena.size(), " floats is too small");
      std::span<float> out(arena.data() + at, g.size());
      std::fill(out.begin(), out.end(), 0.0f);
      at += g.size();
      pending_.push_back({g, out});
      return out;
    }
  }
  // Adds the float gradients of the views handed out since the last commit to the half ones.
  void commit() {
    for (auto& [half, f] : pending_) add_into(half, f);
    pending_.clear();
  }
  static void add_into(std::span<half_type> g, std::span<const float> add) {
    if constexpr (full) {
      for (std::size_t i = 0; i < g.size(); ++i) g[i] += add[i];
    } else {
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<half_type>(static_cast<float>(g[i]) + add[i]);
    }
  }

  tensor::block_tensors<const float> weights(chunk& ch, std::size_t l) {
    std::array<std::span<const float>, 12> s;
    std::size_t at = 0;
    for (std::size_t i = 0; i < 12; ++i) s[i] = param_view(ch.handles[l * 12 + i], weights_, at);
    return tensor::block_tensors<const float>::from(s);
  }
  tensor::block_tensors<float> gradients(chunk& ch, std::size_t l) {
    std::array<std::span<float>, 12> s;
    std::size_t at = 0;
    for (std::size_t i = 0; i < 12; ++i) s[i] = grad_view(ch.handles[l * 12 + i], grads_, at);
    return tensor::block_tensors<float>::from(s);
  }

  const step_batches& batches() const {
    TRIDENT_EXPECT(batches_ != nullptr, "gpt: no batches set for this step (set_batches)");
    return *batches_;
  }
  std::span<const std::int32_t> tokens_of(const std::vector<std::vector<std::int32_t>>& list, int mb, const char* what) const {
    const auto i = static_cast<std::size_t>(mb < 0 ? -1 - mb : mb);
    TRIDENT_EXPECT(i < list.size(), "gpt: micro-batch ", mb, " has no ", what, " (", list.size(), " set)");
    TRIDENT_EXPECT(list[i].size() == c_.seq * batch_, "gpt: micro-batch ", mb, " has ", list[i].size(), " ", what,
                   "; expected seq x batch = ", c_.seq * batch_);
    return list[i];
  }

  // x [rows, hidden] = wte[tokens] + wpe[position]; under sequence parallelism this rank's rows.
  void embed(chunk& ch, int mb, std::span<float> x) {
    const auto tokens = tokens_of(batches().inputs, mb, "input tokens");
    std::size_t at = 0;
    std::span<const float> w = param_view(wte_h_, emb_w_, at), pos = param_view(wpe_h_, emb_w_, at);
    const std::size_t h = c_.hidden, rows = local_rows();
    std::size_t first_row = 0;
    if (c_.sequence_parallel) {
      whole_.resize(c_.seq * batch_ * h);
      wte_.forward_to_sequence(*tp_, tokens, w, whole_, x);
      first_row = rows * static_cast<std::size_t>(tp_->rank());
    } else {
      wte_.forward(*tp_, tokens, w, x);
    }
    for (std::size_t r = 0; r < rows; ++r) {
      const float* p = pos.data() + (first_row + r) / batch_ * h;
      float* row = x.data() + r * h;
      for (std::size_t j = 0; j < h; ++j) row[j] += p[j];
    }
    z_->release(ch.emb_layer);
  }
  void embed_backward(int mb, std::span<const float> dx) {
    const auto tokens = tokens_of(batches().inputs, mb, "input tokens");
    const std::size_t h = c_.hidden, n = c_.seq * batch_;
    std::span<const float> whole = dx;
    if (c_.sequence_parallel) {
      whole_.resize(n * h);
      tensor::reduce_scatter_to_sequence::backward(*tp_, dx, std::span<float>(whole_));  // all-gather
      whole = whole_;
    }
    std::size_t at = 0;
    std::span<float> gw = grad_view(wte_h_, emb_g_, at), gp = grad_view(wpe_h_, emb_g_, at);
    wte_.backward(*tp_, tokens, whole, gw);
    for (std::size_t r = 0; r < n; ++r) {
      float* p = gp.data() + r / batch_ * h;
      const float* row = whole.data() + r * h;
      for (std::size_t j = 0; j < h; ++j) p[j] += row[j];
    }
    commit();
  }

  std::span<const float> head_weight() {
    std::size_t at = 0;
    if (chunks_ == 1) return param_view(wte_h_, head_w_, at);
    return wte_copy_.span();
  }
  std::span<float> head_gradient() {
    std::size_t at = 0;
    if (chunks_ == 1) return grad_view(wte_h_, head_g_, at);
    return head_grad_.span();
  }

  // Final norm, head and loss; the loss's gradient (for a loss weight of 1) replaces the logits.
  float head_forward(chunk& ch, int mb, std::span<const float> y, saved_set& saved) {
    const auto targets = tokens_of(batches().targets, mb, "targets");
    auto& f = *saved.final;
    const std::size_t rows = local_rows(), n = c_.seq * batch_, h = c_.hidden;
    const trident::nn::layer_norm ln{h, c_.eps};
    std::copy(y.begin(), y.end(), f.x.span().begin());
    std::size_t at = 0;
    const auto lnw = param_view(lnf_w_, lnf_w_scratch_, at), lnb = param_view(lnf_b_, lnf_w_scratch_, at);
    ln.forward(rows, y, lnw, lnb, f.out.span(), f.mean.span(), f.rstd.span());
    std::span<const float> in = f.out.span();
    if (c_.sequence_parallel) {
      whole_.resize(n * h);
      tensor::gather_from_sequence::forward(*tp_, f.out.span(), std::span<float>(whole_));
      in = whole_;
    }
    head_.forward(*tp_, n, in, head_weight(), {}, f.logits.span());
    const float loss = ce_.forward(*tp_, n, f.logits.span(), targets);
    ce_.backward(n, f.logits.span(), targets, f.logits.span());
    z_->release(ch.final_layer);
    if (chunks_ == 1) z_->release(emb_layer());
    return loss;
  }
  void head_backward(chunk& ch, int, float weight, saved_set& saved, std::span<float> dy) {
    auto& f = *saved.final;
    const std::size_t rows = local_rows(), n = c_.seq * batch_, h = c_.hidden;
    const trident::nn::layer_norm ln{h, c_.eps};
    for (float& v : f.logits.span()) v *= weight;
    d_out_.resize(rows * h);
    if (c_.sequence_parallel) {
      whole_.resize(n * h);
      partial_.resize(n * h);
      tensor::gather_from_sequence::forward(*tp_, f.out.span(), std::span<float>(whole_));
      head_.backward_to_sequence(*tp_, n, whole_, head_weight(), f.logits.span(), partial_, d_out_, head_gradient(), {});
    } else {
      head_.backward(*tp_, n, f.out.span(), head_weight(), f.logits.span(), d_out_, head_gradient(), {});
    }
    std::size_t at = 0, gat = 0;
    const auto lnw = param_view(lnf_w_, lnf_w_scratch_, at);
    std::span<float> gw = grad_view(lnf_w_, lnf_g_, gat), gb = grad_view(lnf_b_, lnf_g_, gat);
    if (c_.sequence_parallel) {
      // This rank's rows only: the norm's gradients are summed over the group.
      norms_.assign(2 * h, 0.0f);
      ln.backward(rows, f.x.span(), lnw, f.mean.span(), f.rstd.span(), d_out_, dy, std::span<float>(norms_).first(h),
                  std::span<float>(norms_).last(h));
      tp_->all_reduce(norms_, trident::reduce_op::sum);
      for (std::size_t j = 0; j < h; ++j) {
        gw[j] += norms_[j];
        gb[j] += norms_[h + j];
      }
    } else {
      ln.backward(rows, f.x.span(), lnw, f.mean.span(), f.rstd.span(), d_out_, dy, gw, gb);
    }
    commit();  // the head's gradient (one chunk) and the final norm's
    z_->release(ch.final_layer);
    if (chunks_ == 1) z_->release(emb_layer());
    z_->grad_ready(ch.final_layer);
  }

  Comm* world_;
  Comm* tp_;
  Comm* pipe_;
  trident::checkpoint::pending_save pending_save_;  // the last asynchronous save
  gpt_config c_;
  int chunks_, p_, prank_, m_;
  std::size_t batch_;
  tensor::block_config block_cfg_;
  std::shared_ptr<checkpointed_block::workspace> checkpoint_ws_;  // full recomputation
  tensor::vocab_parallel_embedding wte_;
  tensor::column_parallel_linear head_;
  tensor::vocab_parallel_cross_entropy ce_;
  std::vector<chunk> chunks_mine_;
  std::unique_ptr<zero_type> z_;
  trident::tensor_handle wte_h_, wpe_h_, lnf_w_, lnf_b_;
  // The last chunk's copy of the tied embedding and its gradient (chunk 0 on another stage).
  trident::buffer<float, trident::host_space> wte_copy_, head_grad_;
  std::vector<float> tie_scratch_;
  std::vector<float> whole_, partial_, d_out_, norms_;  // scratch
  // Mixed precision: float views of half weights and gradients (param_view, grad_view).
  std::size_t block_arena_ = 0;
  std::vector<float> weights_, grads_, emb_w_, emb_g_, head_w_, head_g_, lnf_w_scratch_, lnf_g_;
  std::vector<std::pair<std::span<half_type>, std::span<float>>> pending_;
  const step_batches* batches_ = nullptr;
};

//! Chunk k of a gpt_rank as a pipeline stage (trident::pipeline::stage).
class gpt_stage {
 public:
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;

  gpt_stage(chunk_runner& rank, int k) : rank_(&rank), k_(k) {}
  std::size_t input_numel() const { return rank_->input_numel(k_); }
  std::size_t output_numel() const { return rank_->output_numel(k_); }
  output_type forward(const input_type& x, int mb) { return rank_->forward(k_, x, mb); }
  input_type backward(const output_type& dy, int mb) { return rank_->backward(k_, dy, mb); }
  output_type evaluate(const input_type& x, int mb) { return rank_->evaluate(k_, x, mb); }

 private:
  chunk_runner* rank_;
  int k_;
};

}  // namespace flagship
