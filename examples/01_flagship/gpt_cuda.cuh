// trident-requires: nvcc
#pragma once
// The flagship GPT on GPUs: gpt.hpp's model (same parameters, same initialisation by global
// index, same ZeRO layers and buckets) with its arithmetic on the device, over NCCL:
//
//   tokens -> wte (vocabulary-parallel, tensor::cuda) + wpe -> N x tensor::cuda::transformer_block
//     -> final LayerNorm (nn::cuda) -> tied head (column-parallel on wte's rows)
//     -> vocabulary-parallel cross-entropy (tensor::cuda)
//
// on a (data, tensor) grid of nccl_comm ranks, ZeRO 0-3 on the data axis (its CUDA engine: the
// fused AdamW, CUB's gradient statistics, buckets reduced on the data communicator's stream),
// fp32, gradient accumulation, global-norm clipping, AdamW with a learning-rate schedule, and
// selective recomputation. train_cuda() is flagship::train's loop for it: the same options and
// the same step reports, so a GPU run is checked step for step against the host's serial run
// (tests/gpt/test_gpt_nccl.cu).
//
// Compute runs on one cuda_context stream. ZeRO's spans are ready on the data communicator's
// stream, so the compute stream orders itself after it before using them and hands itself back
// before grad_ready / release / step (exec/cuda/stream.hpp); the tensor layers order their own
// collectives on the tensor communicator's stream. A micro-batch's forward and backward run
// back to back (p = 1), so one set of activations is kept. The host waits once per step: for
// step()'s reports (the clipping and overflow decision) and the step's loss.
//
// Not on the GPU yet (train_cuda says so when asked): pipeline stages (their messages are host
// vectors), sequence parallelism (the embedding and head have no sequence-sharded GPU path),
// full recomputation, bf16/fp16, validation, checkpoints and traces.
//
//   auto world = trident::nccl_comm::from_mpi(MPI_COMM_WORLD);
//   flagship::train_options o;  o.model = {...};  o.tensor = 2;  o.zero_stage = 3;
//   auto reports = flagship::cuda::train_cuda(world, o);
#if !defined(__CUDACC__)
#error "examples/01_flagship/gpt_cuda.cuh contains CUDA kernels: compile this translation unit with nvcc"
#endif

#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/comm/process_grid.hpp"
#include "trident/core/buffer.hpp"
#include "trident/exec/cuda/stream.hpp"
#include "trident/nn/cuda/cublas.hpp"
#include "trident/nn/cuda/layers.cuh"
#include "trident/nn/cuda/norm.cuh"
#include "trident/parallel/data/cuda/zero_engine.cuh"
#include "trident/parallel/data/zero_optimizer.hpp"
#include "trident/parallel/tensor/cuda/block.cuh"
#include "trident/parallel/tensor/cuda/linear.cuh"
#include "trident/parallel/tensor/cuda/vocab.cuh"

namespace flagship::cuda {

namespace detail {

using trident::device_span;

// x[r, :] += wpe[r / batch, :] (rows sequence-major: row r is position r / batch).
template <class = void>
__global__ void add_positions_kernel(device_span<float> x, device_span<const float> wpe, std::size_t batch, std::size_t hidden) {
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < x.size(); e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = e / hidden, j = e % hidden;
    x[e] += wpe[r / batch * hidden + j];
  }
}

// dwpe[p, j] += sum over b of dx[p x batch + b, j], in order of b (one thread per element of
// dwpe: deterministic, and the host's order within a position).
template <class = void>
__global__ void position_grad_kernel(device_span<const float> dx, device_span<float> dwpe, std::size_t batch, std::size_t hidden) {
  for (std::size_t e = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; e < dwpe.size(); e += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t p = e / hidden, j = e % hidden;
    float s = dwpe[e];
    for (std::size_t b = 0; b < batch; ++b) s += dx[(p * batch + b) * hidden + j];
    dwpe[e] = s;
  }
}

// sum[0] += loss[0] (a step's micro-batch losses, kept on the device until the step ends).
template <class = void>
__global__ void accumulate_kernel(device_span<double> sum, device_span<const float> loss) {
  if (blockIdx.x == 0 && threadIdx.x == 0) sum[0] += static_cast<double>(loss[0]);
}

inline unsigned grid_for(std::size_t n) { return trident::nn::cuda::detail::grid_for(n); }
inline constexpr unsigned block = trident::nn::cuda::detail::block_size;

}  // namespace detail

//! Where a step's GPU time goes: each phase of forward_backward is an NVTX range (for Nsight
//! Systems, always) and, when enabled, a pair of CUDA events on the compute stream, whose elapsed
//! times collect() adds up by phase once the stream has passed them.
//!
//!   model.phases().enabled = true;
//!   ... steps ...
//!   for (const auto& [name, ms] : model.phases().totals()) std::printf("%s %.2f ms\n", name.c_str(), ms);
class gpu_phases {
 public:
  bool enabled = false;

  gpu_phases() = default;
  gpu_phases(const gpu_phases&) = delete;
  gpu_phases& operator=(const gpu_phases&) = delete;
  ~gpu_phases() {
    for (auto e : events_) (void)cudaEventDestroy(e);
  }

  //! Ends the current phase (if any) and starts `name`, at this point of `stream`'s work.
  void mark(cudaStream_t stream, const char* name) {
    end(stream);
    nvtxRangePushA(name);
    open_ = true;
    if (enabled) {
      marks_.push_back({name, event()});
      TRIDENT_CUDA_CHECK(cudaEventRecord(marks_.back().second, stream));
    }
  }
  //! Ends the current phase.
  void end(cudaStream_t stream) {
    if (!open_) return;
    nvtxRangePop();
    open_ = false;
    if (enabled) {
      marks_.push_back({nullptr, event()});
      TRIDENT_CUDA_CHECK(cudaEventRecord(marks_.back().second, stream));
    }
  }
  //! Adds the recorded phases' times to totals() (waits for their events).
  void collect() {
    for (std::size_t i = 0; i + 1 < marks_.size(); ++i) {
      if (marks_[i].first == nullptr) continue;
      TRIDENT_CUDA_CHECK(cudaEventSynchronize(marks_[i + 1].second));
      float ms = 0;
      TRIDENT_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i].second, marks_[i + 1].second));
      auto it = std::find_if(totals_.begin(), totals_.end(), [&](const auto& t) { return t.first == marks_[i].first; });
      if (it == totals_.end()) totals_.emplace_back(marks_[i].first, ms);
      else it->second += ms;
    }
    for (const auto& m : marks_) free_.push_back(m.second);
    marks_.clear();
  }
  const std::vector<std::pair<std::string, double>>& totals() const noexcept { return totals_; }
  void reset() { totals_.clear(); }

 private:
  cudaEvent_t event() {
    if (free_.empty()) {
      cudaEvent_t e = nullptr;
      TRIDENT_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
      return e;
    }
    const cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }

  bool open_ = false;
  std::vector<cudaEvent_t> events_, free_;
  std::vector<std::pair<const char*, cudaEvent_t>> marks_;  // name (nullptr: an end) and its event
  std::vector<std::pair<std::string, double>> totals_;
};

//! This rank's part of the GPT on the GPU and the ZeRO optimizer that holds it (p = 1: every
//! layer; t: the tensor group's share; the data axis: ZeRO-Stage). fp32.
template <int Stage, class Opt = optimizer_type>
class gpt_cuda_rank {
 public:
  using comm_type = trident::nccl_comm;
  using zero_type = trident::zero::zero_optimizer<Stage, Opt, comm_type, trident::full_precision>;
  using policy = trident::zero::stage_policy_t<Stage>;
  template <class T>
  using device_buffer = trident::buffer<T, trident::cuda_space>;

  //! Collective over the grid (the optimizer's construction). `micro_batches` per step of
  //! `batch` rows each. The model is gpt.hpp's: gpt_parameters() names and initialises it.
  gpt_cuda_rank(trident::process_grid<comm_type>& grid, const gpt_config& c, int micro_batches, std::size_t batch, Opt opt,
                trident::zero::zero_options options, std::uint64_t seed)
      : tp_(&grid.tensor()), dp_(&grid.data()), c_(c), m_(micro_batches), batch_(batch), n_(c.seq * batch),
        block_cfg_{.seq = c.seq, .batch = batch, .hidden = c.hidden, .heads = c.heads, .ffn = c.ffn, .eps = c.eps,
                   .sequence_parallel = false, .selective_recompute = c.recompute == recompute_mode::selective},
        wte_(grid.tensor(), c.vocab, c.hidden, "wte"), head_(grid.tensor(), c.hidden, c.vocab, "lm_head"),
        ce_(grid.tensor(), c.vocab, "lm_head") {
    TRIDENT_EXPECT(grid.pipeline().size() == 1, "gpt_cuda_rank: ", grid.pipeline().size(),
                   " pipeline ranks; the GPU path runs one pipeline stage (p = 1) for now");
    TRIDENT_EXPECT(!c.sequence_parallel && c.recompute != recompute_mode::full,
                   "gpt_cuda_rank: sequence parallelism and full recomputation are not on the GPU path yet; expected "
                   "sequence_parallel = false and recompute none or selective");
    TRIDENT_EXPECT(micro_batches >= 1 && batch >= 1, "gpt_cuda_rank: ", micro_batches, " micro-batches of ", batch,
                   " rows; expected at least one of each");
    const auto all = gpt_parameters(grid.tensor(), c_, seed);
    const int t_rank = grid.tensor().rank();
    auto find = [&](const std::string& name) -> const gpt_parameter& {
      for (const auto& p : all)
        if (p.name == name) return p;
      throw trident::usage_error("gpt_cuda_rank: no parameter " + name);
    };
    // gpt_rank's layers and buckets for one chunk: the embedding (reduced once per step, after
    // the others), the blocks, the final norm.
    trident::model_spec spec;
    std::vector<const gpt_parameter*> mine;
    auto add = [&](const gpt_parameter& p, int layer) {
      spec.add(p.name, p.split, t_rank, layer);
      mine.push_back(&p);
    };
    add(find("wte"), 0);
    add(find("wpe"), 0);
    spec.bucket_boundary(1);
    for (std::size_t l = 0; l < c_.layers; ++l) {
      std::string name = "h";  // not "h" + to_string(l): g++ 12 -O3 warns falsely on that (-Wrestrict)
      name += std::to_string(l);
      blocks_.emplace_back(grid.tensor(), block_cfg_, name);
      if (l > 0) blocks_.back().share_backward_workspace(blocks_.front());
      for (const auto& p : blocks_.back().shape().parameters()) add(find(p.name), static_cast<int>(l) + 1);
    }
    final_layer_ = static_cast<int>(c_.layers) + 1;
    add(find("ln_f.weight"), final_layer_);
    add(find("ln_f.bias"), final_layer_);
    if (options.count_replicas == std::nullopt) options.count_replicas = t_rank == 0;
    z_ = std::make_unique<zero_type>(grid.data(), grid.model(), spec, std::move(opt), options);
    for (const auto* p : mine) z_->set_parameter(p->name, p->part(t_rank));
    wte_h_ = z_->handle("wte");
    wpe_h_ = z_->handle("wpe");
    for (const auto& b : blocks_)
      for (const auto& p : b.shape().parameters()) handles_.push_back(z_->handle(p.name));
    lnf_w_ = z_->handle("ln_f.weight");
    lnf_b_ = z_->handle("ln_f.bias");
    // One micro-batch's activations (its backward follows its forward), made once.
    for (const auto& b : blocks_) saved_.push_back(b.make_activations());
    const std::size_t h = c_.hidden, local_vocab = ce_.shape().vocab_range().size();
    using trident::mem_category;
    x_ = device_buffer<float>(n_ * h, mem_category::activations);
    y_ = device_buffer<float>(n_ * h, mem_category::activations);
    ln_out_ = device_buffer<float>(n_ * h, mem_category::activations);
    ln_mean_ = device_buffer<float>(n_, mem_category::activations);
    ln_rstd_ = device_buffer<float>(n_, mem_category::activations);
    logits_ = device_buffer<float>(n_ * local_vocab, mem_category::activations);
    d_out_ = device_buffer<float>(n_ * h, mem_category::other);
    tokens_ = device_buffer<std::int32_t>(static_cast<std::size_t>(m_) * n_, mem_category::other);
    targets_ = device_buffer<std::int32_t>(static_cast<std::size_t>(m_) * n_, mem_category::other);
    loss_ = device_buffer<float>(1, mem_category::other);
    loss_sum_ = device_buffer<double>(1, mem_category::other);
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  }

  gpt_cuda_rank(const gpt_cuda_rank&) = delete;
  gpt_cuda_rank& operator=(const gpt_cuda_rank&) = delete;

  zero_type& optimizer() noexcept { return *z_; }
  const gpt_config& config() const noexcept { return c_; }
  //! The cuBLAS handle every GEMM of the model uses (FP32 math: nn/cuda/cublas.hpp); a
  //! benchmark may switch it to TF32 (cublasSetMathMode).
  cublasHandle_t blas() const noexcept { return blas_.get(); }
  //! The phases of forward_backward (NVTX ranges; CUDA-event times when enabled).
  gpu_phases& phases() noexcept { return phases_; }

  //! Forward and backward of every micro-batch of `b` (m of them, seq x batch tokens each,
  //! sequence-major): the gradients accumulate in the optimizer, the mean loss on the device.
  void forward_backward(const step_batches& b) {
    TRIDENT_EXPECT(b.inputs.size() == static_cast<std::size_t>(m_) && b.targets.size() == static_cast<std::size_t>(m_),
                   "gpt_cuda_rank: ", b.inputs.size(), " micro-batches of inputs and ", b.targets.size(), " of targets; expected ",
                   m_);
    for (int mb = 0; mb < m_; ++mb) {
      TRIDENT_EXPECT(b.inputs[mb].size() == n_ && b.targets[mb].size() == n_, "gpt_cuda_rank: micro-batch ", mb, " has ",
                     b.inputs[mb].size(), " inputs and ", b.targets[mb].size(), " targets; expected seq x batch = ", n_);
      trident::copy_async(ctx_, std::span<std::int32_t>(tokens_.data() + mb * n_, n_), std::span<const std::int32_t>(b.inputs[mb]));
      trident::copy_async(ctx_, std::span<std::int32_t>(targets_.data() + mb * n_, n_), std::span<const std::int32_t>(b.targets[mb]));
    }
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(loss_sum_.data(), 0, sizeof(double), ctx_.stream()));
    for (int mb = 0; mb < m_; ++mb) {
      if constexpr (!policy::shards_gradients) z_->set_gradient_sync(mb + 1 == m_);
      const auto tokens = device_span<const std::int32_t>(tokens_.data() + mb * n_, n_);
      const auto targets = device_span<const std::int32_t>(targets_.data() + mb * n_, n_);
      forward(tokens, targets, 1.0f / static_cast<float>(m_));
      backward(tokens);
    }
    // The embedding's bucket (the head's gradient is in it too) is reduced once per step.
    if constexpr (!policy::shards_gradients) z_->set_gradient_sync(true);
    z_->grad_ready(0);
  }

  //! The optimizer's step (collective over the grid; the host waits for every rank's report).
  trident::zero::step_result step() { return z_->step(); }

  //! The last forward_backward's loss: the mean over the micro-batches, averaged over the data
  //! axis (the same on every rank). Waits for it.
  double loss() {
    ctx_.hand_to(dp_->stream());
    dp_->all_reduce(trident::space_span<double, trident::cuda_space>(loss_sum_.data(), 1), trident::reduce_op::avg);
    double v = 0;
    TRIDENT_CUDA_CHECK(cudaMemcpyAsync(&v, loss_sum_.data(), sizeof(double), cudaMemcpyDeviceToHost, dp_->stream()));
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(dp_->stream()));
    return v / m_;
  }

 private:
  using device_span_c = trident::device_span<const float>;
  template <class T>
  using device_span = trident::device_span<T>;

  // ZeRO's spans, ready on the data communicator's stream: the compute stream waits for it.
  device_span_c param(trident::tensor_handle h) {
    const auto s = z_->parameters(h);
    return {s.data(), s.size()};
  }
  device_span<float> grad(trident::tensor_handle h) {
    const auto s = z_->gradients(h);
    return {s.data(), s.size()};
  }
  trident::tensor::cuda::transformer_block::weights block_weights(std::size_t l) {
    std::array<device_span_c, 12> s;
    for (std::size_t i = 0; i < 12; ++i) s[i] = param(handles_[l * 12 + i]);
    return trident::tensor::cuda::transformer_block::weights::from(s);
  }
  trident::tensor::cuda::transformer_block::gradients block_gradients(std::size_t l) {
    std::array<device_span<float>, 12> s;
    for (std::size_t i = 0; i < 12; ++i) s[i] = grad(handles_[l * 12 + i]);
    return trident::tensor::cuda::transformer_block::gradients::from(s);
  }
  void wait_for_optimizer() { ctx_.order_after(dp_->stream()); }
  void hand_to_optimizer() { ctx_.hand_to(dp_->stream()); }

  // The loss's gradient (for a loss weight of `weight`) replaces the logits.
  void forward(device_span<const std::int32_t> tokens, device_span<const std::int32_t> targets, float weight) {
    const std::size_t h = c_.hidden;
    phases_.mark(ctx_.stream(), "embedding forward");
    const auto wte = param(wte_h_), wpe = param(wpe_h_);
    wait_for_optimizer();
    wte_.forward(ctx_, *tp_, tokens, wte, x_.device_handle());
    detail::add_positions_kernel<><<<detail::grid_for(n_ * h), detail::block, 0, ctx_.stream()>>>(x_.device_handle(), wpe, batch_, h);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    auto* cur = &x_;
    auto* next = &y_;
    phases_.mark(ctx_.stream(), "blocks forward");
    for (std::size_t l = 0; l < blocks_.size(); ++l) {
      const auto w = block_weights(l);
      wait_for_optimizer();
      blocks_[l].forward(ctx_, blas_.get(), *tp_, w, cur->device_handle(), next->device_handle(), saved_[l]);
      hand_to_optimizer();
      z_->release(static_cast<int>(l) + 1);
      std::swap(cur, next);
    }
    last_ = cur;
    phases_.mark(ctx_.stream(), "final norm, head and loss");
    const trident::nn::cuda::layer_norm ln{h, c_.eps};
    const auto lnw = param(lnf_w_), lnb = param(lnf_b_);
    wait_for_optimizer();
    ln.forward(ctx_.stream(), n_, cur->device_handle(), lnw, lnb, ln_out_.device_handle(), ln_mean_.device_handle(),
               ln_rstd_.device_handle());
    head_.forward(ctx_, blas_.get(), *tp_, n_, ln_out_.device_handle(), param(wte_h_), {}, logits_.device_handle());
    ce_.forward(ctx_, *tp_, n_, logits_.device_handle(), targets, loss_.device_handle());
    detail::accumulate_kernel<><<<1, 1, 0, ctx_.stream()>>>(loss_sum_.device_handle(), loss_.device_handle());
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    ce_.backward(ctx_, n_, logits_.device_handle(), targets, logits_.device_handle(), weight);  // in place
    hand_to_optimizer();
    z_->release(final_layer_);
    phases_.end(ctx_.stream());
  }

  void backward(device_span<const std::int32_t> tokens) {
    const std::size_t h = c_.hidden;
    const trident::nn::cuda::layer_norm ln{h, c_.eps};
    // The head (its weight is wte: the gradient joins the embedding's) and the final norm.
    phases_.mark(ctx_.stream(), "head and final norm backward");
    const auto wte = param(wte_h_);
    const auto gwte = grad(wte_h_);
    const auto lnw = param(lnf_w_);
    const auto glnw = grad(lnf_w_), glnb = grad(lnf_b_);
    wait_for_optimizer();
    head_.backward(ctx_, blas_.get(), *tp_, n_, ln_out_.device_handle(), wte, logits_.device_handle(), d_out_.device_handle(), gwte,
                   {});
    auto* g = last_ == &x_ ? &y_ : &x_;  // the buffer the last block did not write
    auto* dx = last_;
    ln.backward(ctx_.stream(), n_, last_->device_handle(), lnw, ln_mean_.device_handle(), ln_rstd_.device_handle(),
                d_out_.device_handle(), g->device_handle(), glnw, glnb);
    hand_to_optimizer();
    z_->release(final_layer_);
    z_->grad_ready(final_layer_);
    phases_.mark(ctx_.stream(), "blocks backward");
    for (std::size_t l = blocks_.size(); l-- > 0;) {
      const auto w = block_weights(l);
      const auto gr = block_gradients(l);
      wait_for_optimizer();
      blocks_[l].backward(ctx_, blas_.get(), *tp_, w, saved_[l], g->device_handle(), dx->device_handle(), gr);
      hand_to_optimizer();
      z_->release(static_cast<int>(l) + 1);
      z_->grad_ready(static_cast<int>(l) + 1);
      std::swap(g, dx);
    }
    phases_.mark(ctx_.stream(), "embedding backward");
    const auto gwte2 = grad(wte_h_), gwpe = grad(wpe_h_);
    wait_for_optimizer();
    wte_.backward(ctx_, *tp_, tokens, g->device_handle(), gwte2);
    detail::position_grad_kernel<><<<detail::grid_for(gwpe.size()), detail::block, 0, ctx_.stream()>>>(g->device_handle(), gwpe,
                                                                                                        batch_, h);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    hand_to_optimizer();
    z_->release(0);
    phases_.end(ctx_.stream());
  }

  trident::cuda_context ctx_;
  trident::nn::cublas_handle blas_;
  gpu_phases phases_;
  comm_type* tp_;
  comm_type* dp_;
  gpt_config c_;
  int m_;
  std::size_t batch_, n_;
  trident::tensor::block_config block_cfg_;
  trident::tensor::cuda::vocab_parallel_embedding wte_;
  trident::tensor::cuda::column_parallel_linear head_;
  trident::tensor::cuda::vocab_parallel_cross_entropy ce_;
  std::vector<trident::tensor::cuda::transformer_block> blocks_;
  std::vector<trident::tensor::cuda::block_activations> saved_;
  std::unique_ptr<zero_type> z_;
  trident::tensor_handle wte_h_, wpe_h_, lnf_w_, lnf_b_;
  std::vector<trident::tensor_handle> handles_;  // 12 per block
  int final_layer_ = 0;
  device_buffer<float> x_, y_, ln_out_, ln_mean_, ln_rstd_, logits_, d_out_, loss_;
  device_buffer<float>* last_ = nullptr;  // the last block's output (x_ or y_)
  device_buffer<std::int32_t> tokens_, targets_;
  device_buffer<double> loss_sum_;
};

namespace detail {

// Every rank learns whether any rank read a token outside the vocabulary (one int over the
// world, on the device), so that all of them throw at the same step.
inline void check_tokens(trident::nccl_comm& world, const step_batches& b, std::size_t vocab, long step) {
  std::int32_t bad = 0;
  for (const auto* lists : {&b.inputs, &b.targets})
    for (const auto& list : *lists)
      for (const auto v : list) bad |= v < 0 || static_cast<std::size_t>(v) >= vocab;
  trident::buffer<std::int32_t, trident::cuda_space> flag(1, trident::mem_category::other);
  trident::copy(std::span<const std::int32_t>(&bad, 1), flag);
  world.all_reduce(flag, trident::reduce_op::max);
  world.synchronize();
  const auto any = trident::to_vector(flag)[0];
  if (any != 0)
    throw trident::usage_error(trident::detail::concat("train_cuda: step ", step, ": ", bad ? "this rank" : "another rank",
                                                       " read a token outside the vocabulary [0, ", vocab, ") (rank ", world.rank(), ")"));
}

template <int Stage>
std::vector<step_report> run_cuda(trident::nccl_comm& world, trident::process_grid<trident::nccl_comm>& grid, const train_options& o,
                                  const std::function<void(const step_report&)>& on_step) {
  const optimizer_type opt = flagship::detail::optimizer_of(o);
  gpt_cuda_rank<Stage> rank(grid, o.model, o.accumulation, o.micro_batch, opt, flagship::detail::zero_options_of(o), o.seed);
  const int d = grid.data().size(), m = o.accumulation;
  const int slice = o.data_slice ? o.data_slice->first : grid.data().rank(), slices = o.data_slice ? o.data_slice->second : d;
  trident::data::shard_loader train(o.train_files, o.micro_batch, o.model.seq, slice, slices);
  trident::data::token_batch scratch;
  step_batches batches;
  const double tokens = static_cast<double>(d) * m * static_cast<double>(o.micro_batch * o.model.seq);
  std::vector<step_report> reports;
  for (long s = 1; s <= o.steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    batches = {};
    for (int i = 0; i < m; ++i) append_batch(train, scratch, batches);
    check_tokens(world, batches, o.model.vocab, s);
    rank.forward_backward(batches);
    const auto result = rank.step();
    step_report rep;
    rep.step = s;
    rep.loss = rank.loss();
    rep.lr = opt.schedule(s);
    rep.grad_norm = result.grad_norm;
    rep.applied = result.applied;
    rep.tokens = tokens;
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (on_step) on_step(rep);
    reports.push_back(rep);
  }
  return reports;
}

}  // namespace detail

//! flagship::train on GPUs (see the header comment): every rank of `world` calls it with the
//! same options; the step reports are the same on every rank. Options the GPU path does not
//! have yet are errors that say so, before anything collective.
inline std::vector<step_report> train_cuda(trident::nccl_comm& world, const train_options& o,
                                           const std::function<void(const step_report&)>& on_step = {}) {
  TRIDENT_EXPECT(o.pipeline == 1 && o.virtual_stages == 1, "train_cuda: pipeline ", o.pipeline, " x virtual stages ",
                 o.virtual_stages, "; the GPU path runs one pipeline stage for now (expected 1 and 1; pipelines run on thread "
                 "and MPI ranks)");
  TRIDENT_EXPECT(!o.model.sequence_parallel && o.model.recompute != recompute_mode::full,
                 "train_cuda: sequence parallelism and full recomputation are not on the GPU path yet");
  TRIDENT_EXPECT(o.eval_every <= 0 && o.trace_step <= 0 && o.save_every <= 0 && !o.resume,
                 "train_cuda: validation, traces and checkpoints are not on the GPU path yet; expected eval_every, trace_step "
                 "and save_every 0 and no resume");
  TRIDENT_EXPECT(o.tensor >= 1 && world.size() % o.tensor == 0, "train_cuda: a world of ", world.size(),
                 " ranks is not d x t for t = ", o.tensor, "; expected a multiple of ", o.tensor);
  TRIDENT_EXPECT(o.accumulation >= 1 && o.steps >= 0, "train_cuda: accumulation ", o.accumulation, ", steps ", o.steps,
                 "; expected at least 1 micro-batch per step and no negative step count");
  const auto& c = o.model;
  flagship::detail::check_model(c, static_cast<std::size_t>(o.tensor), 1, "train_cuda");
  {
    const trident::data::shard_loader check(o.train_files, o.micro_batch, c.seq, 0, world.size() / o.tensor);
  }
  trident::process_grid grid(world, o.tensor, 1);
  std::vector<step_report> out;
  flagship::detail::with_zero_stage(o.zero_stage, [&](auto stage) { out = detail::run_cuda<decltype(stage)::value>(world, grid, o, on_step); });
  return out;
}

}  // namespace flagship::cuda
