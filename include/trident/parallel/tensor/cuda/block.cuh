// trident-requires: nvcc
#pragma once
// The pre-LayerNorm transformer block of parallel/tensor/block.hpp on the GPU, over a device
// communicator (nccl_comm), with Megatron-LM's tensor parallelism:
//
//   x -> LayerNorm -> f -> QKV (column-parallel, heads split) -> causal attention on this rank's
//     heads -> output projection (row-parallel) -> g -> + x = m
//   m -> LayerNorm -> f -> fc1 (column-parallel) -> GELU -> fc2 (row-parallel) -> g -> + m = y
//
// The host class describes it and keeps its shapes here (shape(): parameters(), shardings,
// init_parameters(), add_parameters(), rows()); the arithmetic is nn::cuda's (cuBLAS GEMMs,
// LayerNorm, attention and GELU kernels) on a cuda_context's compute stream, the four
// all-reduces per step on the communicator's stream, ordered by events (tensor::cuda's linear
// layers: backward's input-gradient all-reduces overlap their weight-gradient GEMMs).
// With block_config::bf16_gemm its GEMMs run in gemm_math::bf16 whatever the blas_ref's math, and
// (without sequence parallelism) the norms and GELU write their GEMMs' inputs in bf16.
// With block_config::flash_attention the attention core is nn::cuda::flash_attention (with flash_bf16,
// nn::cuda::flash_attention_bf16): the saved
// activation "probs" holds each row's log-sum-exp instead, and backward's "ds" scratch its delta.
// Selective recomputation and sequence parallelism work as on the host: the probabilities
// recomputed in backward into a workspace; the norms and residuals on this rank's seq / t
// positions, f an all-gather and g a reduce-scatter, the norms' outputs gathered again in
// backward and their weight gradients all-reduced (one call of 4 x hidden floats).
//
// Everything is asynchronous: nothing waits on the host; the activations are allocated once
// (make_activations) and backward's scratch at the first backward (mem_category::other), so a
// step allocates nothing.
//
//   trident::cuda_context ctx;
//   trident::nn::cublas_handle blas;
//   trident::tensor::cuda::transformer_block blk(tp, {.seq = 1024, .batch = 8, .hidden = 768, .heads = 12});
//   auto saved = blk.make_activations();
//   using device_tensors = trident::tensor::block_tensors<const float, trident::cuda_space>;
//   blk.forward(ctx, blas, tp, device_tensors::over(weights), x, y, saved);
//   blk.backward(ctx, blas, tp, device_tensors::over(weights), saved, dy, dx, grads);  // grads +=
#if !defined(__CUDACC__)
#error "trident/parallel/tensor/cuda/block.cuh contains CUDA kernels: compile this translation unit with nvcc"
#endif

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "trident/comm/communicator.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/half.hpp"
#include "trident/exec/cuda/stream.hpp"
#include "trident/nn/activation.hpp"
#include "trident/nn/cuda/attention.cuh"
#include "trident/nn/cuda/flash_attention.cuh"
#include "trident/nn/cuda/flash_bf16.cuh"
#include "trident/nn/cuda/layers.cuh"
#include "trident/nn/cuda/norm.cuh"
#include "trident/parallel/tensor/block.hpp"
#include "trident/parallel/tensor/cuda/linear.cuh"

namespace trident::tensor::cuda {

//! What forward keeps for backward, in device memory: the host block's fields
//! (tensor::basic_block_activations), allocated once by make_activations(). Under
//! block_config::bf16_gemm without sequence parallelism the three GEMM inputs that nothing else
//! reads (the norms' outputs and GELU's) are kept in bf16 instead (ln1_out, ln2_out and
//! gelu_out are then empty): their producers write them rounded, so neither forward's GEMMs nor
//! backward's weight gradients round them again, and they take half the memory.
struct block_activations : tensor::basic_block_activations<cuda_space> {
  buffer<bf16, cuda_space> ln1_bf16, ln2_bf16, gelu_bf16;
};

//! backward's scratch (mem_category::other): the gradients between its layers, attention's
//! dS, the recomputed probabilities under selective recomputation, sequence parallelism's
//! gathered and partial rows, and the norms' parameter sums per chunk of rows. Blocks that run
//! backward one at a time share one (share_backward_workspace).
struct block_workspace {
  buffer<float, cuda_space> d_gelu, d_fc1, d_attn, d_qkv;  // this rank's features
  buffer<float, cuda_space> d_ln2, d_ln1, d_mid;           // [rows this rank holds, hidden]
  buffer<float, cuda_space> ds, probs;                     // [batch, heads / t, seq, seq] (flash: ds [.., seq], no probs)
  buffer<float, cuda_space> full, gathered, partial;       // sequence parallelism: [seq x batch, hidden]
  buffer<float, cuda_space> norms;                         // sequence parallelism: the norms' 4 x hidden gradients
  buffer<double, cuda_space> norm_sums;                    // the norms' parameter sums per chunk of rows (layer_norm's scratch)
};

//! tensor::transformer_block on the GPU (see the header comment).
class transformer_block {
 public:
  using weights = block_tensors<const float, cuda_space>;
  using gradients = block_tensors<float, cuda_space>;

  template <communicator Comm>
  transformer_block(const Comm& tp, block_config c, std::string name = "block")
      : name_(name), shape_(tp, c, name), qkv_(tp, shape_.config().hidden, 3 * shape_.config().hidden, name + ".attn.qkv"),
        proj_(tp, shape_.config().hidden, shape_.config().hidden, name + ".attn.proj"),
        fc1_(tp, shape_.config().hidden, shape_.config().ffn, name + ".mlp.fc1"),
        fc2_(tp, shape_.config().ffn, shape_.config().hidden, name + ".mlp.fc2") {}

  //! The shapes, shardings and parameters (the host block's: parameters(), init_parameters(),
  //! add_parameters(), rows(), local_rows(), local_heads()).
  const tensor::transformer_block& shape() const noexcept { return shape_; }
  const block_config& config() const noexcept { return shape_.config(); }
  //! Whether backward overlaps each input-gradient all-reduce (or reduce-scatter) with its
  //! weight-gradient GEMM.
  void set_overlap(bool on) noexcept {
    qkv_.overlap = on;
    fc1_.overlap = on;
  }
  //! Uses `other`'s backward workspace (a block of the same sizes): a stack of blocks that run
  //! backward one at a time holds one.
  void share_backward_workspace(const transformer_block& other) {
    const auto &a = config(), &b = other.config();
    TRIDENT_EXPECT(a.seq == b.seq && a.batch == b.batch && a.hidden == b.hidden && a.ffn == b.ffn && a.heads == b.heads &&
                       a.selective_recompute == b.selective_recompute && a.sequence_parallel == b.sequence_parallel &&
                       a.flash_attention == b.flash_attention && a.flash_bf16 == b.flash_bf16 && parts() == other.parts(),
                   name(), ": share_backward_workspace with ", other.name(), ", a block of other sizes");
    other.scratch();
    workspace_ = other.workspace_;
  }

  block_activations make_activations() const {
    const std::size_t n = rows(), m = local_rows(), h = config().hidden, lh = local_width();
    const std::size_t f = fc1_.shape().local_out_features(), sp = config().sequence_parallel ? n * h : 0;
    const auto kept = [](std::size_t count) { return block_activations::storage(count, mem_category::activations); };
    const auto comm = [](std::size_t count) { return block_activations::storage(count, mem_category::communication); };
    const auto half = [](std::size_t count) { return buffer<bf16, cuda_space>(count, mem_category::activations); };
    const bool r = rounded_inputs();
    return {{kept(m * h),          kept(m),     kept(m),    kept(r ? 0 : m * h),
             kept(n * 3 * lh),     kept(saved_probs_size()),
             kept(n * lh),         kept(m * h), kept(m),    kept(m),
             kept(r ? 0 : m * h),  kept(n * f), kept(r ? 0 : n * f), comm(sp), comm(sp)},
            half(r ? m * h : 0), half(r ? m * h : 0), half(r ? n * f : 0)};
  }

  //! y from x, both [seq x batch, hidden] and the same on every rank of the group, or with
  //! sequence parallelism this rank's [seq / t x batch, hidden] rows.
  template <communicator Comm>
  void forward(cuda_context& ctx, nn::blas_ref blas, Comm& tp, const weights& w, device_span<const float> x,
               device_span<float> y, block_activations& s) const {
    tensor::detail::check_group(name(), "forward", tp, parts());
    blas = gemms(blas);
    const std::size_t n = rows(), m = local_rows(), h = config().hidden;
    TRIDENT_EXPECT(x.size() == m * h && y.size() == m * h, name(), ".forward: x and y must be [", rows_name(), "=", m,
                   ", hidden=", h, "] = ", m * h, " elements; got ", x.size(), " and ", y.size());
    check_activations(s);
    const cudaStream_t stream = ctx.stream();
    const nn::cuda::layer_norm ln{h, config().eps};
    const bool sp = config().sequence_parallel;
    // The column layers take every row: the norm's output itself, or its gathered shards.
    auto whole = [&](block_activations::storage& normed) -> device_span<const float> {
      if (!sp) return normed.device_handle();
      gather(ctx, tp, normed.device_handle(), s.gathered.device_handle());
      return s.gathered.device_handle();
    };
    // The row layers sum over the group: all-reduced (g), or reduce-scattered to this rank's rows.
    auto row = [&](const row_parallel_linear& layer, device_span<const float> in, device_span<const float> weight,
                   device_span<const float> bias, device_span<float> out) {
      if (sp) layer.forward_to_sequence(ctx, blas, tp, n, in, weight, bias, s.partial.device_handle(), out);
      else layer.forward(ctx, blas, tp, n, in, weight, bias, out);
    };
    TRIDENT_CUDA_CHECK(cudaMemcpyAsync(s.x.data(), x.data(), x.size() * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    const bool r = rounded_inputs();
    if (r) {  // the norms and GELU write their GEMMs' operands in bf16 (no sequence parallelism here)
      ln.forward(stream, m, x, w.ln1_weight, w.ln1_bias, s.ln1_bf16.device_handle(), s.ln1_mean.device_handle(),
                 s.ln1_rstd.device_handle());
      qkv_.forward(ctx, blas, tp, n, device_span<const bf16>(s.ln1_bf16.device_handle()), w.qkv_weight, w.qkv_bias,
                   s.qkv.device_handle());
    } else {
      ln.forward(stream, m, x, w.ln1_weight, w.ln1_bias, s.ln1_out.device_handle(), s.ln1_mean.device_handle(),
                 s.ln1_rstd.device_handle());
      qkv_.forward(ctx, blas, tp, n, whole(s.ln1_out), w.qkv_weight, w.qkv_bias, s.qkv.device_handle());
    }
    if (config().flash_bf16) {
      flash_bf16().forward(stream, s.qkv.device_handle(), s.attn.device_handle(), s.probs.device_handle());  // probs: lse
    } else if (config().flash_attention) {
      flash().forward(stream, s.qkv.device_handle(), s.attn.device_handle(), s.probs.device_handle());  // probs: lse
    } else {
      const auto probs = config().selective_recompute ? scratch().probs.device_handle() : s.probs.device_handle();
      attention().forward(blas, stream, s.qkv.device_handle(), s.attn.device_handle(), probs);
    }
    row(proj_, s.attn.device_handle(), w.proj_weight, w.proj_bias, s.mid.device_handle());
    nn::cuda::add_to(x, s.mid.device_handle(), stream);
    if (r) {
      ln.forward(stream, m, s.mid.device_handle(), w.ln2_weight, w.ln2_bias, s.ln2_bf16.device_handle(),
                 s.ln2_mean.device_handle(), s.ln2_rstd.device_handle());
      fc1_.forward(ctx, blas, tp, n, device_span<const bf16>(s.ln2_bf16.device_handle()), w.fc1_weight, w.fc1_bias,
                   s.fc1_out.device_handle());
      nn::cuda::activation_forward<nn::gelu>(s.fc1_out.device_handle(), s.gelu_bf16.device_handle(), stream);
      fc2_.forward(ctx, blas, tp, n, device_span<const bf16>(s.gelu_bf16.device_handle()), w.fc2_weight, w.fc2_bias, y);
    } else {
      ln.forward(stream, m, s.mid.device_handle(), w.ln2_weight, w.ln2_bias, s.ln2_out.device_handle(),
                 s.ln2_mean.device_handle(), s.ln2_rstd.device_handle());
      fc1_.forward(ctx, blas, tp, n, whole(s.ln2_out), w.fc1_weight, w.fc1_bias, s.fc1_out.device_handle());
      nn::cuda::activation_forward<nn::gelu>(s.fc1_out.device_handle(), s.gelu_out.device_handle(), stream);
      row(fc2_, s.gelu_out.device_handle(), w.fc2_weight, w.fc2_bias, y);
    }
    nn::cuda::add_to(s.mid.device_handle(), y, stream);
    s.filled = true;
  }

  //! dx (overwritten) from dy, shaped as forward's x and y; the parameters' gradients (this
  //! rank's parts) accumulate (+=).
  template <communicator Comm>
  void backward(cuda_context& ctx, nn::blas_ref blas, Comm& tp, const weights& w, const block_activations& s,
                device_span<const float> dy, device_span<float> dx, const gradients& g) const {
    tensor::detail::check_group(name(), "backward", tp, parts());
    blas = gemms(blas);
    const std::size_t n = rows(), m = local_rows(), h = config().hidden;
    TRIDENT_EXPECT(dy.size() == m * h && dx.size() == m * h, name(), ".backward: dy and dx must be [", rows_name(), "=", m,
                   ", hidden=", h, "] = ", m * h, " elements; got ", dy.size(), " and ", dx.size());
    check_activations(s);
    TRIDENT_EXPECT(s.filled, name(), ".backward: these activations were never filled by a forward (make_activations() "
                   "gives them empty)");
    const cudaStream_t stream = ctx.stream();
    const nn::cuda::layer_norm ln{h, config().eps};
    const bool sp = config().sequence_parallel;
    auto& ws = scratch();
    // Every scratch buffer is overwritten before it is read.
    const auto d_mid = ws.d_mid.device_handle().subspan(0, m * h), d_ln2 = ws.d_ln2.device_handle().subspan(0, m * h);
    const auto d_ln1 = ws.d_ln1.device_handle().subspan(0, m * h);
    const auto d_gelu = ws.d_gelu.device_handle(), d_fc1 = ws.d_fc1.device_handle(), d_attn = ws.d_attn.device_handle();
    const auto d_qkv = ws.d_qkv.device_handle();
    const auto full = ws.full.device_handle(), gathered = ws.gathered.device_handle(), partial = ws.partial.device_handle();
    // Sequence parallelism: the norms' weight gradients over this rank's rows, summed over the
    // group at the end (ln1 weight, ln1 bias, ln2 weight, ln2 bias).
    const auto norms = ws.norms.device_handle();
    if (sp) TRIDENT_CUDA_CHECK(cudaMemsetAsync(norms.data(), 0, norms.size() * sizeof(float), stream));
    const auto norm_grad = [&](device_span<float> whole_grad, std::size_t k) {
      return sp ? norms.subspan(k * h, h) : whole_grad;
    };
    // MLP: y = mid + fc2(gelu(fc1(ln2(mid)))).
    device_span<const float> dy_rows = dy;
    if (sp) {  // g's backward: the output gradient's shards all-gathered
      gather(ctx, tp, dy, full);
      dy_rows = full;
    }
    const bool r = rounded_inputs();
    if (r) {
      fc2_.backward(ctx, blas, tp, n, device_span<const bf16>(s.gelu_bf16.device_handle()), w.fc2_weight, dy_rows, d_gelu,
                    g.fc2_weight, g.fc2_bias);
    } else {
      fc2_.backward(ctx, blas, tp, n, s.gelu_out.device_handle(), w.fc2_weight, dy_rows, d_gelu, g.fc2_weight, g.fc2_bias);
    }
    nn::cuda::activation_backward<nn::gelu>(s.fc1_out.device_handle(), d_gelu, d_fc1, stream);
    if (sp) {  // forward kept this rank's rows of the norm's output: gathered again for the weights
      gather(ctx, tp, s.ln2_out.device_handle(), gathered);
      fc1_.backward_to_sequence(ctx, blas, tp, n, gathered, w.fc1_weight, d_fc1, partial, d_ln2, g.fc1_weight, g.fc1_bias);
    } else if (r) {
      fc1_.backward(ctx, blas, tp, n, device_span<const bf16>(s.ln2_bf16.device_handle()), w.fc1_weight, d_fc1, d_ln2,
                    g.fc1_weight, g.fc1_bias);  // f
    } else {
      fc1_.backward(ctx, blas, tp, n, s.ln2_out.device_handle(), w.fc1_weight, d_fc1, d_ln2, g.fc1_weight, g.fc1_bias);  // f
    }
    ln.backward(stream, m, s.mid.device_handle(), w.ln2_weight, s.ln2_mean.device_handle(), s.ln2_rstd.device_handle(), d_ln2,
                d_mid, norm_grad(g.ln2_weight, 2), norm_grad(g.ln2_bias, 3), ws.norm_sums.device_handle(), dy);  // d_mid = dy + ...
    // Attention: mid = x + proj(attn(qkv(ln1(x)))).
    device_span<const float> d_mid_rows = d_mid;
    if (sp) {
      gather(ctx, tp, d_mid, full);
      d_mid_rows = full;
    }
    proj_.backward(ctx, blas, tp, n, s.attn.device_handle(), w.proj_weight, d_mid_rows, d_attn, g.proj_weight, g.proj_bias);
    if (config().flash_bf16) {  // s.probs holds lse, ws.ds the rows' delta
      flash_bf16().backward(stream, s.qkv.device_handle(), s.attn.device_handle(), s.probs.device_handle(), d_attn,
                            ws.ds.device_handle(), d_qkv);
    } else if (config().flash_attention) {
      flash().backward(stream, s.qkv.device_handle(), s.attn.device_handle(), s.probs.device_handle(), d_attn,
                       ws.ds.device_handle(), d_qkv);
    } else {
      device_span<const float> probs = s.probs.device_handle();
      if (config().selective_recompute) {  // the forward's softmax again, from the kept q, k, v: the same bits
        attention().probabilities(blas, stream, s.qkv.device_handle(), ws.probs.device_handle());
        probs = ws.probs.device_handle();
      }
      attention().backward(blas, stream, s.qkv.device_handle(), probs, d_attn, d_qkv, ws.ds.device_handle());
    }
    if (sp) {
      gather(ctx, tp, s.ln1_out.device_handle(), gathered);
      qkv_.backward_to_sequence(ctx, blas, tp, n, gathered, w.qkv_weight, d_qkv, partial, d_ln1, g.qkv_weight, g.qkv_bias);
    } else if (r) {
      qkv_.backward(ctx, blas, tp, n, device_span<const bf16>(s.ln1_bf16.device_handle()), w.qkv_weight, d_qkv, d_ln1,
                    g.qkv_weight, g.qkv_bias);  // f
    } else {
      qkv_.backward(ctx, blas, tp, n, s.ln1_out.device_handle(), w.qkv_weight, d_qkv, d_ln1, g.qkv_weight, g.qkv_bias);  // f
    }
    ln.backward(stream, m, s.x.device_handle(), w.ln1_weight, s.ln1_mean.device_handle(), s.ln1_rstd.device_handle(), d_ln1, dx,
                norm_grad(g.ln1_weight, 0), norm_grad(g.ln1_bias, 1), ws.norm_sums.device_handle(), d_mid);  // dx = d_mid + ...
    if (sp) {  // the norms' gradients over every row: one all-reduce, then added to the caller's
      ctx.hand_to(tp.stream());
      tp.all_reduce(space_span<float, cuda_space>(norms.data(), norms.size()), reduce_op::sum);
      ctx.order_after(tp.stream());
      const std::array<device_span<float>, 4> targets{g.ln1_weight, g.ln1_bias, g.ln2_weight, g.ln2_bias};
      for (std::size_t k = 0; k < 4; ++k) nn::cuda::add_to(norms.subspan(k * h, h), targets[k], stream);
    }
  }

 private:
  const std::string& name() const noexcept { return name_; }
  int parts() const noexcept { return qkv_.shape().parts(); }
  // The blas_ref the block's GEMMs run with: the caller's, or under block_config::bf16_gemm the
  // same handle in gemm_math::bf16 (its rounding kernel set here if the handle has none yet).
  nn::blas_ref gemms(nn::blas_ref blas) const {
    if (!config().bf16_gemm) return blas;
    TRIDENT_EXPECT(blas.bf16 != nullptr, name(), ": block_config::bf16_gemm rounds the GEMMs' operands into a cublas_handle's "
                   "scratch; this blas_ref was made from a raw cublasHandle_t");
    if (blas.bf16->round == nullptr) blas.bf16->round = &nn::cuda::round_to_bf16;
    blas.math = nn::gemm_math::bf16;
    return blas;
  }
  // Whether the GEMMs' inputs are kept in bf16 (see block_activations). With sequence parallelism
  // the norms' outputs are all-gathered in float first, and the GEMMs round them as before.
  bool rounded_inputs() const noexcept { return config().bf16_gemm && !config().sequence_parallel; }
  std::size_t rows() const noexcept { return shape_.rows(); }
  std::size_t local_rows() const noexcept { return shape_.local_rows(); }
  const char* rows_name() const noexcept { return config().sequence_parallel ? "seq / t x batch" : "seq x batch"; }
  std::size_t head_dim() const noexcept { return config().hidden / config().heads; }
  std::size_t local_width() const noexcept { return shape_.local_heads() * head_dim(); }
  nn::cuda::causal_attention attention() const { return {config().seq, config().batch, shape_.local_heads(), head_dim()}; }
  nn::cuda::flash_attention flash() const { return {config().seq, config().batch, shape_.local_heads(), head_dim()}; }
  nn::cuda::flash_attention_bf16 flash_bf16() const {
    return {config().seq, config().batch, shape_.local_heads(), head_dim()};
  }
  // The saved "probs": flash attention's lse, none under selective recomputation, else the probabilities.
  std::size_t saved_probs_size() const noexcept {
    return config().flash_attention ? flash().lse_size() : config().selective_recompute ? 0 : attention().probs_size();
  }

  // whole [rows, hidden] = every rank's shard [local rows, hidden], in rank order (sequence-major
  // rows: rank r's shard is rows [r m, (r + 1) m)), on the communicator's stream.
  template <class Comm>
  static void gather(cuda_context& ctx, Comm& tp, device_span<const float> shard, device_span<float> whole) {
    ctx.hand_to(tp.stream());
    tp.all_gather(space_span<const float, cuda_space>(shard.data(), shard.size()),
                  space_span<float, cuda_space>(whole.data(), whole.size()));
    ctx.order_after(tp.stream());
  }

  // Made at first use (forward's, under selective recomputation: the probabilities go there; or
  // shared); the probabilities' workspace only under selective recomputation, sequence
  // parallelism's buffers only with it.
  block_workspace& scratch() const {
    if (!workspace_) {
      const std::size_t n = rows(), nh = n * config().hidden, f = n * fc1_.shape().local_out_features(), lw = n * local_width();
      const bool fa = config().flash_attention;
      const std::size_t p = attention().probs_size(), sp = config().sequence_parallel ? nh : 0;
      auto make = [](std::size_t count) { return buffer<float, cuda_space>(count, mem_category::other); };
      workspace_ = std::make_shared<block_workspace>(block_workspace{
          make(f), make(f), make(lw), make(3 * lw), make(nh), make(nh), make(nh), make(fa ? flash().lse_size() : p),
          make(config().selective_recompute && !fa ? p : 0), make(sp), make(sp), make(sp),
          make(config().sequence_parallel ? 4 * config().hidden : 0),
          buffer<double, cuda_space>(nn::cuda::layer_norm{config().hidden}.backward_scratch_size(local_rows()), mem_category::other)});
    }
    return *workspace_;
  }
  void check_activations(const block_activations& s) const {
    const std::size_t n = rows();
    const std::size_t f = n * fc1_.shape().local_out_features(), mh = local_rows() * config().hidden;
    const bool r = rounded_inputs();
    TRIDENT_EXPECT(s.probs.size() == saved_probs_size() && s.qkv.size() == n * 3 * local_width() && s.fc1_out.size() == f &&
                       s.x.size() == mh && s.gathered.size() == (config().sequence_parallel ? n * config().hidden : 0) &&
                       s.ln1_out.size() == (r ? 0 : mh) && s.ln2_out.size() == (r ? 0 : mh) && s.gelu_out.size() == (r ? 0 : f) &&
                       s.ln1_bf16.size() == (r ? mh : 0) && s.ln2_bf16.size() == (r ? mh : 0) && s.gelu_bf16.size() == (r ? f : 0),
                   name(), ": the saved activations are not this block's; expected make_activations() of the same block");
  }

  std::string name_;
  tensor::transformer_block shape_;
  column_parallel_linear qkv_;
  row_parallel_linear proj_;
  column_parallel_linear fc1_;
  row_parallel_linear fc2_;
  mutable std::shared_ptr<block_workspace> workspace_;
};

}  // namespace trident::tensor::cuda
