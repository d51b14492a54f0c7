#pragma once
// A pre-LayerNorm transformer block (GPT-2's) with Megatron-LM's tensor parallelism, on the host:
//
//   x -> LayerNorm -> f -> QKV (column-parallel, heads split) -> causal attention on this rank's
//     heads -> output projection (row-parallel) -> g -> + x = m
//   m -> LayerNorm -> f -> fc1 (column-parallel) -> GELU -> fc2 (row-parallel) -> g -> + m = y
//
// Per block and step: two all-reduces forward (the g's) and two backward (the f's, each
// overlapped with its weight-gradient GEMM), of [seq x batch, hidden] each. The norms and
// residuals run on every rank on the whole sequence, so their parameters' gradients come out
// the same on every rank and need no reduction.
//
// With block_config::sequence_parallel (Korthikanti et al. 2022) the norms and residuals run
// on this rank's seq / t positions instead: x, y, dx, dy are shards; f is an all-gather and g a
// reduce-scatter (the same bytes as the all-reduces); forward keeps only its shard of each
// norm's output and backward gathers it again for the weight gradients (their §4.2.2: two
// all-gathers more, for memory divided by t); the norms' weight gradients are partial sums
// over this rank's rows, all-reduced over the group (one call of 4 x hidden floats).
//
//   struct block_config       seq, batch, hidden, heads, ffn (0: 4 x hidden), eps,
//                             sequence_parallel, selective_recompute, flash_attention, flash_bf16,
//                             bf16_gemm
//   template <class T, class Space = host_space> struct block_tensors
//                             one span per parameter, in parameters() order (device_span on CUDA)
//   class transformer_block   forward(tp, w, x, y, saved), backward(tp, w, saved, dy, dx, grads),
//                             share_attention_workspace(other), share_backward_workspace(other);
//                             nn::checkpointed<> wraps it
//
// Recomputation (issue 14): block_config::selective_recompute keeps everything but the
// attention probabilities, which backward recomputes (Korthikanti et al.'s selective
// recomputation); nn::checkpointed<transformer_block> keeps only the block's input (full
// recomputation). Both train bitwise as keeping everything (tests/tensor: recompute_equals_plain).
//
// Layouts: activations are sequence-major rows ([seq, batch, hidden]: row i * batch + b). The
// fused QKV weight [3 x hidden, hidden] orders its rows by (head, q/k/v, head_dim), so that a
// split of its rows into t parts gives each rank whole heads (nn/attention.hpp). Parameters
// are shapes and shardings (parameters()): generate them whole and take each rank's part with
// take_part, so one seed gives one model whatever t is; a zero_optimizer over the data axis
// can hold the local parts (their local shapes). Heads or ffn that t does not divide are a
// usage_error naming the sizes.
//
//   trident::tensor::transformer_block blk(tp, {.seq = 8, .batch = 2, .hidden = 64, .heads = 4});
//   auto saved = blk.make_activations();
//   blk.forward(tp, weights, x, y, saved);
//   blk.backward(tp, weights, saved, dy, dx, grads);     // grads accumulate (+=)
//
// On the GPU: tensor::cuda::transformer_block (parallel/tensor/cuda/block.cuh, nvcc) keeps its
// shapes in this class and runs the same steps with nn::cuda's kernels over nccl_comm.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/core/memory_space.hpp"
#include "trident/model/flat_layout.hpp"
#include "trident/model/init.hpp"
#include "trident/model/sharding.hpp"
#include "trident/nn/activation.hpp"
#include "trident/nn/attention.hpp"
#include "trident/nn/flash_attention.hpp"
#include "trident/nn/flash_bf16.hpp"
#include "trident/nn/norm.hpp"
#include "trident/parallel/tensor/linear.hpp"

namespace trident::tensor {

struct block_config {
  std::size_t seq = 0;
  std::size_t batch = 0;
  std::size_t hidden = 0;
  std::size_t heads = 0;
  std::size_t ffn = 0;  // 0: 4 x hidden
  float eps = 1e-5f;
  //! Korthikanti et al.'s sequence parallelism: the norms and residuals run on this rank's
  //! seq / t positions (x, y, dx, dy are [seq / t x batch, hidden] shards), f becomes an
  //! all-gather and g a reduce-scatter; the norms' gradients are summed over the group.
  bool sequence_parallel = false;
  //! Korthikanti et al.'s selective recomputation: forward keeps no attention probabilities
  //! ([batch, heads / t, seq, seq], the activation that grows with seq squared); backward
  //! recomputes them from the kept q, k, v into a workspace that the blocks sharing it
  //! (share_attention_workspace) hold once. Bitwise the same training.
  bool selective_recompute = false;
  //! The GPU block's attention in tiles (nn::cuda::flash_attention): forward keeps each row's
  //! log-sum-exp ([batch, heads / t, seq]) instead of the probabilities, backward recomputes them
  //! tile by tile (so selective_recompute changes nothing), and the products run on TF32 tensor
  //! cores. head_dim 32 or 64, compute capability 8.0+. The host block runs the same tiles in
  //! their host emulation (nn::flash::emulate_*, nn::flash_bf16::emulate_*: the GPU's roundings,
  //! each lane in turn, so many times slower than nn::causal_attention): a GPU run's serial
  //! reference with the GPU's numerics, for checking, not for speed.
  bool flash_attention = false;
  //! With flash_attention: the tiles of nn::cuda::flash_attention_bf16 instead (scores in
  //! registers, bf16 tensor-core products: q, k, v, dout, P and dS rounded to bf16).
  bool flash_bf16 = false;
  //! The four linear layers' GEMMs on operands rounded to bf16, float sums and results
  //! (gemm_math::bf16, PyTorch autocast's arithmetic): the GPU block runs them so whatever its
  //! blas_ref's math; the host block emulates them (the layers' bf16_operands: rounded copies),
  //! the serial reference of such a GPU run. The attention's own products are not covered (the
  //! GPU's unfused attention runs TF32 there): a reference for them takes flash_attention, whose
  //! tiles the host emulates.
  bool bf16_gemm = false;
};

//! The block's parameters (or their gradients), one span each, this rank's parts: std::span in
//! host memory, device_span for tensor::cuda's block (Space = cuda_space).
template <class T, class Space = host_space>
struct block_tensors {
  using span_type = std::conditional_t<Space::host_accessible, std::span<T>, device_span<T>>;
  span_type ln1_weight, ln1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias;
  span_type ln2_weight, ln2_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias;
  static constexpr std::size_t count = 12;
  //! In parameters() order.
  std::array<span_type, count> all() const {
    return {ln1_weight, ln1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias,
            ln2_weight, ln2_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias};
  }
  //! From spans in parameters() order.
  static block_tensors from(const std::array<span_type, count>& s) {
    return {s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11]};
  }
  //! Over `count` contiguous ranges in parameters() order: vectors (e.g. init_parameters()') or
  //! host buffers, or device buffers (their device_handle()) for Space = cuda_space.
  template <class Ranges>
  static block_tensors over(Ranges& ranges) {
    TRIDENT_EXPECT(std::size(ranges) == count, "block_tensors::over: ", std::size(ranges), " tensors; expected ", count);
    std::array<span_type, count> s;
    std::size_t i = 0;
    for (auto& r : ranges) {
      if constexpr (Space::host_accessible) s[i++] = std::span<T>(r);
      else s[i++] = r.device_handle();
    }
    return from(s);
  }
};

//! What forward keeps for backward, allocated once by make_activations and reused every step:
//! buffers charged to the memory ledger as mem_category::activations (the scratch of sequence
//! parallelism as communication), so what a rank keeps per block is measured, not estimated.
//! In host memory here (block_activations), in device memory for tensor::cuda's block.
template <class Space>
struct basic_block_activations {
  using storage = buffer<float, Space>;
  storage x;                           // the block's input
  storage ln1_mean, ln1_rstd, ln1_out;
  storage qkv, probs, attn;            // this rank's heads (probs empty under selective recomputation)
  storage mid;                         // x + attention's output
  storage ln2_mean, ln2_rstd, ln2_out;
  storage fc1_out, gelu_out;           // this rank's ffn features
  // Sequence parallelism: where the norms' outputs are gathered and the partial products
  // wait to be reduce-scattered ([seq x batch, hidden] each). Scratch: nothing in them is
  // kept from forward to backward (the norms' outputs are gathered again there).
  storage gathered, partial;
  //! Set by forward: backward refuses activations that no forward wrote (it ran on them and
  //! returned gradients of nothing).
  bool filled = false;
};
using block_activations = basic_block_activations<host_space>;

//! Where selective recomputation puts the attention probabilities it recomputes: one per stack
//! of blocks that share it.
struct attention_workspace {
  buffer<float, host_space> probs;
};

//! backward's scratch: the gradients between its layers. Made at the first backward (charged
//! to the ledger as mem_category::other: nothing in it outlives one backward) and reused, so a
//! step allocates and page-faults nothing (fresh megabytes per backward were 15% of the
//! flagship's CPU step); blocks that run one at a time share one (share_backward_workspace).
struct backward_workspace {
  buffer<float, host_space> d_gelu, d_fc1, d_attn, d_qkv;  // this rank's features
  buffer<float, host_space> d_ln2, d_norm, d_ln1, d_mid;    // [rows this rank holds, hidden]
  buffer<float, host_space> full, gathered, partial;        // sequence parallelism: [seq x batch, hidden]
  buffer<float, host_space> delta;                          // flash attention: rowsum(dout * out), lse's size
};

class transformer_block {
 public:
  //! One parameter: its name, global shape and how it is split over the tensor group.
  struct parameter {
    std::string name;
    sharding split;
  };

  template <communicator Comm>
  transformer_block(const Comm& tp, block_config c, std::string name = "block")
      : name_(std::move(name)), c_(validated(c, tp.size(), name_)), parts_(tp.size()), rank_(tp.rank()),
        qkv_(tp, c_.hidden, 3 * c_.hidden, name_ + ".attn.qkv"), proj_(tp, c_.hidden, c_.hidden, name_ + ".attn.proj"),
        fc1_(tp, c_.hidden, c_.ffn, name_ + ".mlp.fc1"), fc2_(tp, c_.ffn, c_.hidden, name_ + ".mlp.fc2") {
    // Any communicator: forward and backward need a host one, while tensor::cuda's block keeps
    // its shapes and parameters here.
    local_heads_ = c_.heads / static_cast<std::size_t>(parts_);
    qkv_.bf16_operands = proj_.bf16_operands = fc1_.bf16_operands = fc2_.bf16_operands = c_.bf16_gemm;
  }

  //! Under selective recomputation: uses `other`'s attention workspace (a block of the same
  //! attention sizes), so that a stack of blocks holds one. Blocks run one at a time.
  void share_attention_workspace(const transformer_block& other) {
    TRIDENT_EXPECT(c_.selective_recompute && other.c_.selective_recompute, name_, ": share_attention_workspace with ", other.name_,
                   ": both blocks must have block_config::selective_recompute");
    TRIDENT_EXPECT(other.attention().probs_size() == attention().probs_size() && other.rows() == rows() &&
                       other.local_heads_ * other.head_dim() == local_heads_ * head_dim(),
                   name_, ": share_attention_workspace with ", other.name_, ", whose attention has other sizes");
    other.workspace();  // made once, by the first block that needs it
    attention_ws_ = other.attention_ws_;
  }

  //! Uses `other`'s backward workspace (a block of the same sizes), so that a stack of blocks
  //! that run backward one at a time holds one.
  void share_backward_workspace(const transformer_block& other) {
    TRIDENT_EXPECT(other.c_.seq == c_.seq && other.c_.batch == c_.batch && other.c_.hidden == c_.hidden &&
                       other.c_.ffn == c_.ffn && other.c_.heads == c_.heads && other.parts_ == parts_ &&
                       other.c_.sequence_parallel == c_.sequence_parallel && other.c_.flash_attention == c_.flash_attention,
                   name_, ": share_backward_workspace with ", other.name_, ", a block of other sizes (or attention: flash "
                   "attention's row sums live there)");
    other.scratch();
    backward_ws_ = other.backward_ws_;
  }

  const block_config& config() const noexcept { return c_; }
  //! Whether backward overlaps each input-gradient all-reduce with its weight-gradient GEMM
  //! (on by default; the results are the same either way).
  void set_overlap(bool on) noexcept {
    qkv_.overlap = on;
    fc1_.overlap = on;
  }
  std::size_t rows() const noexcept { return c_.seq * c_.batch; }
  //! The rows of x, y, dx and dy on this rank: rows(), or rows() / t with sequence parallelism.
  std::size_t local_rows() const noexcept { return c_.sequence_parallel ? rows() / static_cast<std::size_t>(parts_) : rows(); }
  std::size_t local_heads() const noexcept { return local_heads_; }
  //! The elements of x and dx (and of y and dy): local_rows() x hidden.
  std::size_t input_numel() const noexcept { return local_rows() * c_.hidden; }
  std::size_t output_numel() const noexcept { return local_rows() * c_.hidden; }

  //! Every parameter in a fixed order (block_tensors' order), with its sharding.
  std::vector<parameter> parameters() const {
    const auto h = c_.hidden;
    return {{name_ + ".ln1.weight", sharding::replicated({h})},  {name_ + ".ln1.bias", sharding::replicated({h})},
            {name_ + ".attn.qkv.weight", qkv_.weight_sharding()}, {name_ + ".attn.qkv.bias", qkv_.bias_sharding()},
            {name_ + ".attn.proj.weight", proj_.weight_sharding()}, {name_ + ".attn.proj.bias", proj_.bias_sharding()},
            {name_ + ".ln2.weight", sharding::replicated({h})},  {name_ + ".ln2.bias", sharding::replicated({h})},
            {name_ + ".mlp.fc1.weight", fc1_.weight_sharding()},  {name_ + ".mlp.fc1.bias", fc1_.bias_sharding()},
            {name_ + ".mlp.fc2.weight", fc2_.weight_sharding()},  {name_ + ".mlp.fc2.bias", fc2_.bias_sharding()}};
  }

  //! This rank's parts of GPT-2's initialisation (Radford et al. 2019): weights N(0, 0.02), the
  //! two projections into the residual stream N(0, 0.02 / sqrt(2 x layers)), biases 0, norm
  //! weights 1; drawn by global index from (seed, parameter) (model/init.hpp), so every t gives
  //! the same model. In parameters() order.
  std::vector<std::vector<float>> init_parameters(std::uint64_t seed, int layers = 1) const {
    TRIDENT_EXPECT(layers >= 1, name_, ".init_parameters: layers = ", layers, "; expected at least 1");
    std::vector<std::vector<float>> out;
    const auto ps = parameters();
    for (std::size_t i = 0; i < ps.size(); ++i) {
      const auto& p = ps[i];
      std::vector<float> local(p.split.local_numel());
      const std::uint64_t stream = trident::detail::splitmix64(seed + i);
      const bool bias = p.name.ends_with(".bias"), norm = p.name.find(".ln") != std::string::npos;
      const bool residual = p.name.ends_with("proj.weight") || p.name.ends_with("fc2.weight");
      if (bias) init_part(p.split, rank_, stream, init_constant{0.0f}, local);
      else if (norm) init_part(p.split, rank_, stream, init_constant{1.0f}, local);
      else
        init_part(p.split, rank_, stream,
                  init_normal{0.0f, residual ? static_cast<float>(0.02 / std::sqrt(2.0 * layers)) : 0.02f}, local);
      out.push_back(std::move(local));
    }
    return out;
  }

  //! Adds this rank's parameters (local shapes) to a model_spec, all on `layer`, the shards
  //! marked as such and the replicas (norms, row-parallel biases) as replicas, which is what a
  //! zero_optimizer over the data axis needs to count each parameter once in the global norm.
  void add_parameters(model_spec& spec, int layer) const {
    for (const auto& p : parameters())
      spec.add(p.name, p.split.local_shape(), layer, p.split.is_split() ? model_copy::shard : model_copy::replica);
  }

  block_activations make_activations() const {
    const std::size_t n = rows(), m = local_rows(), h = c_.hidden, lh = local_heads_ * head_dim();
    const auto kept = [](std::size_t count) { return block_activations::storage(count, mem_category::activations); };
    block_activations a{kept(m * h),     kept(m),         kept(m),        kept(m * h),
                        kept(n * 3 * lh), kept(saved_probs_size()), kept(n * lh),
                        kept(m * h),     kept(m),         kept(m),        kept(m * h),
                        kept(n * fc1_.local_out_features()), kept(n * fc1_.local_out_features()), {}, {}};
    if (c_.sequence_parallel) {
      a.gathered = block_activations::storage(n * h, mem_category::communication);
      a.partial = block_activations::storage(n * h, mem_category::communication);
    }
    return a;
  }

  //! y [seq x batch, hidden] from x; the same on every rank of the group.
  template <communicator Comm>
  void forward(Comm& tp, const block_tensors<const float>& w, std::span<const float> x, std::span<float> y,
               block_activations& s) const {
    detail::require_host_comm<Comm>();
    detail::check_group(name_, "forward", tp, parts_);
    const std::size_t n = rows(), m = local_rows(), h = c_.hidden;
    TRIDENT_EXPECT(x.size() == m * h && y.size() == m * h, name_, ".forward: x and y must be [", rows_name(), "=", m,
                   ", hidden=", h, "] = ", m * h, " elements; got ", x.size(), " and ", y.size());
    check_activations(s);
    const nn::layer_norm ln{h, c_.eps};
    std::copy(x.begin(), x.end(), s.x.span().begin());
    const bool sp = c_.sequence_parallel;
    // The column layers take every row: the norm's output itself, or its gathered shards.
    auto whole = [&](block_activations::storage& normed) {
      if (!sp) return std::span<const float>(normed.span());
      gather_from_sequence::forward(tp, normed.span(), s.gathered.span());
      return std::span<const float>(s.gathered.span());
    };
    // The row layers sum over the group: all-reduced (g), or reduce-scattered to this rank's rows.
    auto row = [&](const row_parallel_linear& layer, std::span<const float> in, std::span<const float> weight,
                   std::span<const float> bias, std::span<float> out) {
      if (sp) layer.forward_to_sequence(tp, n, in, weight, bias, s.partial.span(), out);
      else layer.forward(tp, n, in, weight, bias, out);
    };
    ln.forward(m, x, w.ln1_weight, w.ln1_bias, s.ln1_out.span(), s.ln1_mean.span(), s.ln1_rstd.span());
    qkv_.forward(tp, n, whole(s.ln1_out), w.qkv_weight, w.qkv_bias, s.qkv.span());
    attention_forward(s);
    row(proj_, s.attn.span(), w.proj_weight, w.proj_bias, s.mid.span());
    for (std::size_t i = 0; i < m * h; ++i) s.mid[i] += x[i];
    ln.forward(m, s.mid.span(), w.ln2_weight, w.ln2_bias, s.ln2_out.span(), s.ln2_mean.span(), s.ln2_rstd.span());
    fc1_.forward(tp, n, whole(s.ln2_out), w.fc1_weight, w.fc1_bias, s.fc1_out.span());
    nn::gelu::forward(s.fc1_out.span(), s.gelu_out.span());
    row(fc2_, s.gelu_out.span(), w.fc2_weight, w.fc2_bias, y);
    for (std::size_t i = 0; i < m * h; ++i) y[i] += s.mid[i];
    s.filled = true;
  }

  //! dx (overwritten) from dy, both [seq x batch, hidden] and the same on every rank; the
  //! parameters' gradients (this rank's parts) accumulate (+=).
  template <communicator Comm>
  void backward(Comm& tp, const block_tensors<const float>& w, const block_activations& s, std::span<const float> dy,
                std::span<float> dx, const block_tensors<float>& g) const {
    detail::require_host_comm<Comm>();
    detail::check_group(name_, "backward", tp, parts_);
    const std::size_t n = rows(), m = local_rows(), h = c_.hidden;
    TRIDENT_EXPECT(dy.size() == m * h && dx.size() == m * h, name_, ".backward: dy and dx must be [", rows_name(), "=", m,
                   ", hidden=", h, "] = ", m * h, " elements; got ", dy.size(), " and ", dx.size());
    check_activations(s);
    TRIDENT_EXPECT(s.filled, name_, ".backward: these activations were never filled by a forward (make_activations() "
                   "gives them empty)");
    const nn::layer_norm ln{h, c_.eps};
    if (c_.sequence_parallel) {
      backward_sequence_parallel(tp, w, s, dy, dx, g);
      return;
    }
    // MLP: y = mid + fc2(gelu(fc1(ln2(mid)))).
    auto& ws = scratch();
    const auto d_gelu = sized(ws.d_gelu, s.gelu_out.size()), d_fc1 = sized(ws.d_fc1, s.fc1_out.size());
    const auto d_ln2 = sized(ws.d_ln2, n * h), d_mid = ws.d_mid.span().first(dy.size());
    std::copy(dy.begin(), dy.end(), d_mid.begin());
    fc2_.backward(tp, n, s.gelu_out.span(), w.fc2_weight, dy, d_gelu, g.fc2_weight, g.fc2_bias);
    nn::gelu::backward(s.fc1_out.span(), d_gelu, d_fc1);
    fc1_.backward(tp, n, s.ln2_out.span(), w.fc1_weight, d_fc1, d_ln2, g.fc1_weight, g.fc1_bias);  // summed (f)
    const auto d_norm = sized(ws.d_norm, n * h);
    ln.backward(n, s.mid.span(), w.ln2_weight, s.ln2_mean.span(), s.ln2_rstd.span(), d_ln2, d_norm, g.ln2_weight, g.ln2_bias);
    for (std::size_t i = 0; i < n * h; ++i) d_mid[i] += d_norm[i];
    // Attention: mid = x + proj(attn(qkv(ln1(x)))).
    const auto d_attn = sized(ws.d_attn, s.attn.size()), d_qkv = sized(ws.d_qkv, s.qkv.size()), d_ln1 = sized(ws.d_ln1, n * h);
    proj_.backward(tp, n, s.attn.span(), w.proj_weight, d_mid, d_attn, g.proj_weight, g.proj_bias);
    attention_backward(s, d_attn, d_qkv);
    qkv_.backward(tp, n, s.ln1_out.span(), w.qkv_weight, d_qkv, d_ln1, g.qkv_weight, g.qkv_bias);  // summed (f)
    ln.backward(n, s.x.span(), w.ln1_weight, s.ln1_mean.span(), s.ln1_rstd.span(), d_ln1, dx, g.ln1_weight, g.ln1_bias);
    for (std::size_t i = 0; i < n * h; ++i) dx[i] += d_mid[i];
  }

 private:
  // Before the layers are built, so that a bad size is named as what it is (heads, not the
  // rows of a fused weight).
  static block_config validated(block_config c, int parts, const std::string& name) {
    if (c.ffn == 0) c.ffn = 4 * c.hidden;
    const auto t = static_cast<std::size_t>(parts);
    TRIDENT_EXPECT(c.seq > 0 && c.batch > 0 && c.hidden > 0, name, ": expected non-zero seq, batch and hidden, got ", c.seq, ", ",
                   c.batch, ", ", c.hidden);
    TRIDENT_EXPECT(c.heads > 0 && c.hidden % c.heads == 0, name, ": hidden size ", c.hidden, " does not divide into ", c.heads,
                   " heads");
    TRIDENT_EXPECT(c.heads % t == 0, name, ": ", c.heads, " attention heads do not divide over a tensor-parallel group of ",
                   parts, "; expected the heads to be a multiple of t");
    TRIDENT_EXPECT(c.ffn % t == 0, name, ": the MLP's ", c.ffn, " features do not divide over a tensor-parallel group of ",
                   parts, "; expected a multiple of t");
    TRIDENT_EXPECT(!c.sequence_parallel || c.seq % t == 0, name, ": sequence parallelism splits the ", c.seq, " positions "
                   "over a tensor-parallel group of ", parts, "; expected a multiple of t");
    TRIDENT_EXPECT(!c.flash_attention || nn::flash::supported_head_dim(c.hidden / c.heads), name, ": flash attention takes "
                   "head_dim 32 or 64; hidden ", c.hidden, " over ", c.heads, " heads is ", c.hidden / c.heads);
    TRIDENT_EXPECT(!c.flash_bf16 || c.flash_attention, name, ": block_config::flash_bf16 chooses flash attention's tiles; "
                   "expected flash_attention = true with it");
    return c;
  }
  std::size_t head_dim() const noexcept { return c_.hidden / c_.heads; }
  const char* rows_name() const noexcept { return c_.sequence_parallel ? "seq / t x batch" : "seq x batch"; }

  // The same steps as backward() on sequence shards: the output gradients are all-gathered
  // before the row-parallel layers, the norms' outputs gathered again for the column-parallel
  // layers' weight gradients (forward keeps only this rank's rows of them), the input
  // gradients reduce-scattered back to shards, and the norms' weight gradients, partial sums
  // over this rank's rows, summed over the group.
  template <communicator Comm>
  void backward_sequence_parallel(Comm& tp, const block_tensors<const float>& w, const block_activations& s,
                                  std::span<const float> dy, std::span<float> dx, const block_tensors<float>& g) const {
    const std::size_t n = rows(), m = local_rows(), h = c_.hidden;
    const nn::layer_norm ln{h, c_.eps};
    auto& ws = scratch();
    const auto full = sized(ws.full, n * h), gathered = sized(ws.gathered, n * h), partial = sized(ws.partial, n * h);
    const auto d_gelu = sized(ws.d_gelu, s.gelu_out.size()), d_fc1 = sized(ws.d_fc1, s.fc1_out.size());
    const auto d_ln2 = sized(ws.d_ln2, m * h), d_norm = sized(ws.d_norm, m * h);
    const auto d_mid = ws.d_mid.span().first(dy.size());
    std::copy(dy.begin(), dy.end(), d_mid.begin());
    std::vector<float> norms(4 * h, 0.0f);  // ln1 weight, ln1 bias, ln2 weight, ln2 bias: this rank's rows
    const std::span<float> n1w(norms.data(), h), n1b(norms.data() + h, h), n2w(norms.data() + 2 * h, h),
        n2b(norms.data() + 3 * h, h);
    // MLP.
    reduce_scatter_to_sequence::backward(tp, dy, full);  // all-gather
    fc2_.backward(tp, n, s.gelu_out.span(), w.fc2_weight, full, d_gelu, g.fc2_weight, g.fc2_bias);
    nn::gelu::backward(s.fc1_out.span(), d_gelu, d_fc1);
    gather_from_sequence::forward(tp, s.ln2_out.span(), gathered);
    fc1_.backward_to_sequence(tp, n, gathered, w.fc1_weight, d_fc1, partial, d_ln2, g.fc1_weight, g.fc1_bias);
    ln.backward(m, s.mid.span(), w.ln2_weight, s.ln2_mean.span(), s.ln2_rstd.span(), d_ln2, d_norm, n2w, n2b);
    for (std::size_t i = 0; i < m * h; ++i) d_mid[i] += d_norm[i];
    // Attention.
    const auto d_attn = sized(ws.d_attn, s.attn.size()), d_qkv = sized(ws.d_qkv, s.qkv.size()), d_ln1 = sized(ws.d_ln1, m * h);
    reduce_scatter_to_sequence::backward(tp, d_mid, full);
    proj_.backward(tp, n, s.attn.span(), w.proj_weight, full, d_attn, g.proj_weight, g.proj_bias);
    attention_backward(s, d_attn, d_qkv);
    gather_from_sequence::forward(tp, s.ln1_out.span(), gathered);
    qkv_.backward_to_sequence(tp, n, gathered, w.qkv_weight, d_qkv, partial, d_ln1, g.qkv_weight, g.qkv_bias);
    ln.backward(m, s.x.span(), w.ln1_weight, s.ln1_mean.span(), s.ln1_rstd.span(), d_ln1, dx, n1w, n1b);
    for (std::size_t i = 0; i < m * h; ++i) dx[i] += d_mid[i];
    // The norms' gradients over every row: one all-reduce, then added to what the caller holds.
    tp.all_reduce(norms, reduce_op::sum);
    const std::array<std::span<float>, 4> targets{g.ln1_weight, g.ln1_bias, g.ln2_weight, g.ln2_bias};
    for (std::size_t k = 0; k < 4; ++k)
      for (std::size_t j = 0; j < h; ++j) targets[k][j] += norms[k * h + j];
  }
  nn::causal_attention attention() const { return {c_.seq, c_.batch, local_heads_, head_dim()}; }
  // The saved "probs": flash attention's lse ([batch, heads / t, seq]), none under selective
  // recomputation, else the probabilities (as tensor::cuda's block).
  std::size_t saved_probs_size() const {
    const auto a = attention();
    return c_.flash_attention ? a.batch * a.heads * a.seq : c_.selective_recompute ? 0 : a.probs_size();
  }
  // Attention's core, forward: out from qkv, keeping the probabilities or (flash) lse.
  void attention_forward(block_activations& s) const {
    if (c_.flash_bf16) nn::flash_bf16::emulate_forward(attention(), s.qkv.span(), s.attn.span(), s.probs.span());
    else if (c_.flash_attention) nn::flash::emulate_forward(attention(), s.qkv.span(), s.attn.span(), s.probs.span(), true);
    else attention().forward(s.qkv.span(), s.attn.span(), c_.selective_recompute ? workspace().probs.span() : s.probs.span());
  }
  // ... and backward: d_qkv (overwritten) from d_attn (flash: its rows' delta in scratch).
  void attention_backward(const block_activations& s, std::span<const float> d_attn, std::span<float> d_qkv) const {
    if (!c_.flash_attention) {
      attention().backward(s.qkv.span(), probabilities(s), d_attn, d_qkv);
      return;
    }
    const auto delta = sized(scratch().delta, s.probs.size());
    if (c_.flash_bf16) nn::flash_bf16::emulate_backward(attention(), s.qkv.span(), s.attn.span(), s.probs.span(), d_attn, delta, d_qkv);
    else nn::flash::emulate_backward(attention(), s.qkv.span(), s.attn.span(), s.probs.span(), d_attn, delta, d_qkv, true);
  }
  // The attention probabilities backward needs: the kept ones, or (selective recomputation)
  // the forward's again, from the kept q, k, v: the same arithmetic, so the same values.
  std::span<const float> probabilities(const block_activations& s) const {
    if (!c_.selective_recompute) return s.probs.span();
    auto& ws = workspace();
    attention().probabilities(s.qkv.span(), ws.probs.span());
    return ws.probs.span();
  }
  // Selective recomputation's workspace, made at first use (charged to the ledger as
  // activations) unless shared from another block first.
  attention_workspace& workspace() const {
    if (!attention_ws_)
      attention_ws_ = std::make_shared<attention_workspace>(
          attention_workspace{buffer<float, host_space>(attention().probs_size(), mem_category::activations)});
    return *attention_ws_;
  }
  // backward's workspace, made at first use (or shared, share_backward_workspace), sized for
  // this block: the largest each buffer needs with or without sequence parallelism.
  backward_workspace& scratch() const {
    if (!backward_ws_) {
      const std::size_t rows_h = rows() * c_.hidden, features = rows() * fc1_.local_out_features();
      const std::size_t heads = rows() * local_heads_ * head_dim(), sp = c_.sequence_parallel ? rows_h : 0;
      auto make = [](std::size_t n) {
        buffer<float, host_space> b(n, mem_category::other);
        const auto all = b.span();
        std::fill(all.begin(), all.end(), std::numeric_limits<float>::quiet_NaN());  // see sized()
        return b;
      };
      backward_ws_ = std::make_shared<backward_workspace>(backward_workspace{
          make(features), make(features), make(heads), make(3 * heads), make(rows_h), make(rows_h), make(rows_h), make(rows_h),
          make(sp), make(sp), make(sp), make(c_.flash_attention ? saved_probs_size() : 0)});
    }
    return *backward_ws_;
  }
  // The first `size` elements of b, as they are: every one is overwritten before backward reads
  // it (GEMMs with beta 0, which never read C; element-wise layers; collectives' outputs), so
  // nothing is cleared per step (clearing was 5% of the flagship's CPU step). The workspace
  // starts as NaN (scratch()), so a read before a write would show in every result.
  static std::span<float> sized(buffer<float, host_space>& b, std::size_t size) {
    TRIDENT_EXPECT(size <= b.size(), "transformer_block: backward's workspace holds ", b.size(), " elements, needs ", size,
                   " (a workspace shared with a block of other sizes?)");
    return b.span().first(size);
  }
  void check_activations(const block_activations& s) const {
    TRIDENT_EXPECT(s.probs.size() == saved_probs_size() && s.qkv.size() == rows() * 3 * local_heads_ * head_dim() &&
                       s.fc1_out.size() == rows() * fc1_.local_out_features() && s.x.size() == local_rows() * c_.hidden &&
                       s.gathered.size() == (c_.sequence_parallel ? rows() * c_.hidden : 0),
                   name_, ": the saved activations are not this block's; expected make_activations() of the same block");
  }

  std::string name_;
  block_config c_;
  int parts_;
  int rank_;
  column_parallel_linear qkv_;
  row_parallel_linear proj_;
  column_parallel_linear fc1_;
  row_parallel_linear fc2_;
  std::size_t local_heads_ = 0;
  mutable std::shared_ptr<attention_workspace> attention_ws_;  // selective recomputation only; workspace()
  mutable std::shared_ptr<backward_workspace> backward_ws_;    // scratch()
};

}  // namespace trident::tensor
