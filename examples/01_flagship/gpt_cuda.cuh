// trident-requires: nvcc
#pragma once
// The flagship GPT on GPUs: gpt.hpp's model (same parameters, same initialisation by global
// index, same ZeRO layers and buckets) with its arithmetic on the device, over NCCL:
//
//   tokens -> wte (vocabulary-parallel, tensor::cuda) + wpe -> N x tensor::cuda::transformer_block
//     -> final LayerNorm (nn::cuda) -> tied head (column-parallel on wte's rows)
//     -> vocabulary-parallel cross-entropy (tensor::cuda)
//
// on a (data, tensor, pipeline) grid of nccl_comm ranks, ZeRO 0-3 on the data axis (its CUDA
// engine: the fused AdamW, CUB's gradient statistics, buckets reduced on the data communicator's
// stream), fp32 or bf16 (gpt_rank's mixed precision: bf16 working weights and gradients, the
// kernels on float copies; GEMMs on TF32 tensor cores unless train_options::gpu_gemm says
// otherwise), gradient accumulation, global-norm clipping, AdamW with a learning-rate
// schedule, and selective recomputation. Pipeline stages are gpt.hpp's chunks (p x virtual
// stages, the tied embedding kept on the last stage as gpt_rank keeps it), run by the pipeline
// executor with device messages. train_cuda() is flagship::train's loop for it: the same options
// and the same step reports, so a GPU run is checked step for step against the host's serial run
// (tests/gpt/test_gpt_nccl.cu).
//
// Compute runs on one cuda_context stream. ZeRO's spans are ready on the data communicator's
// stream, so the compute stream orders itself after it before using them and hands itself back
// before grad_ready / release / step (exec/cuda/stream.hpp); the tensor layers order their own
// collectives on the tensor communicator's stream. With one stage a micro-batch's forward and
// backward run back to back, so one set of activations is kept, and the host waits once per
// step: for step()'s reports (the clipping and overflow decision) and the step's loss. Pipeline
// stages synchronise their stream before handing a message to the executor (its contract), and
// keep each micro-batch's activations until its backward.
//
// Validation runs chunk after chunk forward only (evaluate()), as the host's; checkpoints are
// trident/checkpoint/zero.hpp's on the NCCL optimizer, with the data position, as the host's (a
// run resumes from either). The trace of a step has the host's spans on one track per rank and
// the compute stream's phases, timed by CUDA events, on another. Not on the GPU yet (train_cuda
// says so when asked): sequence parallelism (the embedding and head have no sequence-sharded GPU
// path), full recomputation and fp16 (its loss scaling); pipeline stage counts other than 1, 2
// and 4.
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
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
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
#include "trident/parallel/pipeline/pipeline.hpp"
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

// out[i] = in[i] as float (exact: a half working weight's value, for the fp32 kernels).
template <class Half>
__global__ void to_float_kernel(device_span<const Half> in, device_span<float> out) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < in.size(); i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = static_cast<float>(in[i]);
}

// g[i] = Half(float(g[i]) + add[i]): a layer's float gradients joining the half ones, rounded
// once, as the host's add_into (gpt.hpp) does.
template <class Half>
__global__ void add_into_kernel(device_span<Half> g, device_span<const float> add) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < g.size(); i += std::size_t{gridDim.x} * blockDim.x)
    g[i] = Half(static_cast<float>(g[i]) + add[i]);
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
    if (enabled || timeline_) {
      marks_.push_back({name, event()});
      TRIDENT_CUDA_CHECK(cudaEventRecord(marks_.back().second, stream));
    }
  }
  //! Ends the current phase.
  void end(cudaStream_t stream) {
    if (!open_) return;
    nvtxRangePop();
    open_ = false;
    if (enabled || timeline_) {
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

  //! A timeline of the phases from here (a trace of one step): waits for `stream`'s work, then
  //! takes the host's clock and an event together as the common origin.
  void start_timeline(cudaStream_t stream) {
    collect();
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream));
    origin_event_ = event();
    TRIDENT_CUDA_CHECK(cudaEventRecord(origin_event_, stream));
    TRIDENT_CUDA_CHECK(cudaEventSynchronize(origin_event_));
    origin_ = std::chrono::steady_clock::now();
    timeline_ = true;
  }
  //! The phases since start_timeline() as spans on the host's steady_clock (waits for them), and
  //! the timeline off again. A collect() in between takes the marks into totals() instead.
  std::vector<trident::trace_event> timeline() {
    std::vector<trident::trace_event> out;
    if (!timeline_) return out;
    auto at = [&](cudaEvent_t e) {
      TRIDENT_CUDA_CHECK(cudaEventSynchronize(e));
      float ms = 0;
      TRIDENT_CUDA_CHECK(cudaEventElapsedTime(&ms, origin_event_, e));
      return origin_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double, std::milli>(ms));
    };
    for (std::size_t i = 0; i + 1 < marks_.size(); ++i)
      if (marks_[i].first != nullptr) out.push_back({marks_[i].first, "gpu", at(marks_[i].second), at(marks_[i + 1].second)});
    if (enabled) {
      collect();  // the step's times count in totals() too
    } else {
      for (const auto& m : marks_) free_.push_back(m.second);  // every one waited for above
      marks_.clear();
    }
    free_.push_back(origin_event_);
    timeline_ = false;
    return out;
  }

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

  bool open_ = false, timeline_ = false;
  cudaEvent_t origin_event_ = nullptr;
  std::chrono::steady_clock::time_point origin_{};
  std::vector<cudaEvent_t> events_, free_;
  std::vector<std::pair<const char*, cudaEvent_t>> marks_;  // name (nullptr: an end) and its event
  std::vector<std::pair<std::string, double>> totals_;
};

//! This rank's chunks of the GPT on the GPU and the ZeRO optimizer that holds them: gpt_rank's
//! layout (chunk k of p x v on pipeline rank k % p; t: the tensor group's share; the data axis:
//! ZeRO-Stage). Chunk k runs as a pipeline stage through forward(k, x, mb) and
//! backward(k, dy, mb) on device messages; with one chunk, forward_backward() runs a step's
//! micro-batches without the pipeline executor.
//!
//! Precision: full_precision, or mixed_precision<bf16> as gpt_rank keeps it (fp32 master weights
//! in the optimizer, bf16 working weights and gradients): the kernels read float copies of the
//! working weights (exact), and each layer's float gradients are added to the bf16 ones, rounded
//! once, in gpt_rank's order, so the GPU run follows the host's. The GEMMs' math is the cuBLAS
//! handle's (set_gemm_math): fp32 unless set (train_cuda sets TF32 for bf16, or what --gemm
//! asks). The activations stay float: gemm_math::bf16 rounds each GEMM's operands to bf16 on
//! the way in (autocast's way); activations kept in bf16 are the next step.
template <int Stage, class Opt = optimizer_type, class Precision = trident::full_precision>
class gpt_cuda_rank {
 public:
  using comm_type = trident::nccl_comm;
  using zero_type = trident::zero::zero_optimizer<Stage, Opt, comm_type, Precision>;
  using half_type = typename Precision::half_type;
  static constexpr bool full = std::is_same_v<half_type, float>;
  static_assert(full || std::is_same_v<half_type, trident::bf16>,
                "gpt_cuda_rank: the GPU path trains in fp32 or bf16 (fp16's loss scaling is not on it yet)");
  using policy = trident::zero::stage_policy_t<Stage>;
  template <class T>
  using device_buffer = trident::buffer<T, trident::cuda_space>;
  //! What goes between pipeline stages: activations and their gradients, [rows, hidden].
  using message = device_buffer<float>;

  //! Collective over the grid (the optimizer's construction). `chunks` stages of the model over
  //! the pipeline axis (a multiple of its ranks), `micro_batches` per step of `batch` rows each.
  //! The model is gpt.hpp's: gpt_parameters() names and initialises it.
  gpt_cuda_rank(trident::process_grid<comm_type>& grid, const gpt_config& c, int chunks, int micro_batches, std::size_t batch, Opt opt,
                trident::zero::zero_options options, std::uint64_t seed)
      : tp_(&grid.tensor()), dp_(&grid.data()), pipe_(&grid.pipeline()), c_(c), chunks_(chunks), p_(grid.pipeline().size()),
        prank_(grid.pipeline().rank()), m_(micro_batches), batch_(batch), n_(c.seq * batch),
        block_cfg_{.seq = c.seq, .batch = batch, .hidden = c.hidden, .heads = c.heads, .ffn = c.ffn, .eps = c.eps,
                   .sequence_parallel = false, .selective_recompute = c.recompute == recompute_mode::selective,
                   .flash_attention = c.flash_attention, .flash_bf16 = c.flash_bf16, .bf16_gemm = c.bf16_gemm},
        wte_(grid.tensor(), c.vocab, c.hidden, "wte"), head_(grid.tensor(), c.hidden, c.vocab, "lm_head"),
        ce_(grid.tensor(), c.vocab, "lm_head") {
    if (c.bf16_gemm) set_gemm_math(trident::nn::gemm_math::bf16);  // the head's GEMMs too
    TRIDENT_EXPECT(!c.sequence_parallel && c.recompute != recompute_mode::full,
                   "gpt_cuda_rank: sequence parallelism and full recomputation are not on the GPU path yet; expected "
                   "sequence_parallel = false and recompute none or selective");
    TRIDENT_EXPECT(micro_batches >= 1 && batch >= 1, "gpt_cuda_rank: ", micro_batches, " micro-batches of ", batch,
                   " rows; expected at least one of each");
    TRIDENT_EXPECT(chunks >= 1 && chunks % p_ == 0 && c.layers % static_cast<std::size_t>(chunks) == 0, "gpt_cuda_rank: ", chunks,
                   " stages over ", p_, " pipeline ranks and ", c.layers, " layers; expected a multiple of the ranks that divides the layers");
    const auto all = gpt_parameters(grid.tensor(), c_, seed);
    const int t_rank = grid.tensor().rank();
    const int per_chunk = static_cast<int>(c_.layers) / chunks_;
    auto find = [&](const std::string& name) -> const gpt_parameter& {
      for (const auto& p : all)
        if (p.name == name) return p;
      throw trident::usage_error("gpt_cuda_rank: no parameter " + name);
    };
    // gpt_rank's layers and buckets: per chunk, the embedding (chunk 0; reduced once per step,
    // after the others), the blocks, the final norm (the last chunk); each chunk's buckets its own.
    trident::model_spec spec;
    std::vector<const gpt_parameter*> mine;
    auto add = [&](const gpt_parameter& p, int layer) {
      spec.add(p.name, p.split, t_rank, layer);
      mine.push_back(&p);
    };
    int layer = 0;
    for (int k = prank_; k < chunks_; k += p_) {
      chunk ch;
      ch.k = k;
      if (layer > 0) spec.bucket_boundary(layer);
      if (k == 0) {
        ch.emb_layer = layer;
        add(find("wte"), layer);
        add(find("wpe"), layer);
        ++layer;
        spec.bucket_boundary(layer);
      }
      ch.first_block_layer = layer;
      for (int l = k * per_chunk; l < (k + 1) * per_chunk; ++l) {
        std::string name = "h";  // not "h" + to_string(l): g++ 12 -O3 warns falsely on that (-Wrestrict)
        name += std::to_string(l);
        ch.blocks.emplace_back(grid.tensor(), block_cfg_, name);
        // One backward workspace for all of this rank's blocks: they run one at a time.
        if (!chunks_mine_.empty() || ch.blocks.size() > 1)
          ch.blocks.back().share_backward_workspace(chunks_mine_.empty() ? ch.blocks.front() : chunks_mine_.front().blocks.front());
        for (const auto& p : ch.blocks.back().shape().parameters()) add(find(p.name), layer);
        ++layer;
      }
      if (k == chunks_ - 1) {
        ch.final_layer = layer;
        add(find("ln_f.weight"), layer);
        add(find("ln_f.bias"), layer);
        ++layer;
      }
      chunks_mine_.push_back(std::move(ch));
    }
    if (options.count_replicas == std::nullopt) options.count_replicas = t_rank == 0;
    z_ = std::make_unique<zero_type>(grid.data(), grid.model(), spec, std::move(opt), options);
    for (const auto* p : mine) z_->set_parameter(p->name, p->part(t_rank));
    for (auto& ch : chunks_mine_) {
      if (ch.emb_layer >= 0) {
        wte_h_ = z_->handle("wte");
        wpe_h_ = z_->handle("wpe");
      }
      for (const auto& b : ch.blocks)
        for (const auto& p : b.shape().parameters()) ch.handles.push_back(z_->handle(p.name));
      if (ch.final_layer >= 0) {
        lnf_w_ = z_->handle("ln_f.weight");
        lnf_b_ = z_->handle("ln_f.bias");
      }
    }
    using trident::mem_category;
    const std::size_t h = c_.hidden;
    // The last chunk's copy of the tied embedding and its gradient (more than one chunk:
    // Megatron's embedding group, as gpt_rank keeps them).
    if (owns(chunks_ - 1) && chunks_ > 1) {
      auto w = find("wte").part(t_rank);
      // The working weights' values: rounded to the half type, as chunk 0's are.
      if constexpr (!full) std::transform(w.begin(), w.end(), w.begin(), [](float v) { return static_cast<float>(half_type(v)); });
      wte_copy_ = device_buffer<float>(w.size(), mem_category::parameters);
      trident::copy(std::span<const float>(w), wte_copy_);
      head_grad_ = device_buffer<float>(w.size(), mem_category::gradients);
      trident::fill_zero(head_grad_);
    }
    if (owns(0) && chunks_ > 1 && !owns(chunks_ - 1))  // also the bf16 embedding's float copy on its way
      tie_ = device_buffer<float>(wte_.shape().weight_sharding().local_numel(), mem_category::communication);
    // Float scratch for the layers' views of bf16 weights and gradients (gpt_rank's arenas).
    if constexpr (!full) {
      std::size_t block = 0;
      for (const auto& ch : chunks_mine_)
        for (const auto& b : ch.blocks) {
          std::size_t n = 0;
          for (const auto& p : b.shape().parameters()) n += p.split.local_numel();
          block = std::max(block, n);
        }
      const std::size_t wte = wte_.shape().weight_sharding().local_numel();
      auto arena = [](std::size_t count, mem_category what) { return view_arena{device_buffer<float>(count, what), 0}; };
      weights_ = arena(block, mem_category::parameters);
      grads_ = arena(block, mem_category::gradients);
      if (owns(0)) {
        emb_w_ = arena(wte + c_.seq * h, mem_category::parameters);
        emb_g_ = arena(wte + c_.seq * h, mem_category::gradients);
      }
      if (owns(chunks_ - 1)) {
        if (chunks_ == 1) {
          head_w_ = arena(wte, mem_category::parameters);
          head_g_ = arena(wte, mem_category::gradients);
        }
        lnf_w_scratch_ = arena(2 * h, mem_category::parameters);
        lnf_g_ = arena(2 * h, mem_category::gradients);
      }
    }
    x_ = device_buffer<float>(n_ * h, mem_category::activations);
    y_ = device_buffer<float>(n_ * h, mem_category::activations);
    d_out_ = device_buffer<float>(n_ * h, mem_category::other);
    tokens_ = device_buffer<std::int32_t>(static_cast<std::size_t>(m_) * n_, mem_category::other);
    targets_ = device_buffer<std::int32_t>(static_cast<std::size_t>(m_) * n_, mem_category::other);
    loss_ = device_buffer<float>(1, mem_category::other);
    loss_sum_ = device_buffer<double>(1, mem_category::other);
    // the final norm's backward sums its parameter gradients in chunks of rows through this
    if (owns(chunks_ - 1)) {
      lnf_scratch_ = device_buffer<double>(trident::nn::cuda::layer_norm{h}.backward_scratch_size(n_), mem_category::other);
      if (c_.bf16_gemm) logits_ = device_buffer<float>(n_ * ce_.shape().vocab_range().size(), mem_category::activations);
    }
    trident::fill_zero(loss_sum_);
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
  }

  gpt_cuda_rank(const gpt_cuda_rank&) = delete;
  gpt_cuda_rank& operator=(const gpt_cuda_rank&) = delete;

  zero_type& optimizer() noexcept { return *z_; }
  const gpt_config& config() const noexcept { return c_; }
  int chunks() const noexcept { return chunks_; }
  bool owns(int k) const noexcept { return k % p_ == prank_; }
  //! The cuBLAS handle every GEMM of the model uses, with its math (fp32 unless set).
  trident::nn::blas_ref blas() const noexcept { return blas_; }
  //! The math of the model's GEMMs from now on (nn/cuda/cublas.hpp): fp32, tf32, or bf16 (the
  //! operands rounded to bf16 for bf16 tensor cores, float results: nn::cuda::use_bf16_gemm).
  //! gpt_config::bf16_gemm fixes bf16: another math is then an error.
  void set_gemm_math(trident::nn::gemm_math m) {
    TRIDENT_EXPECT(!c_.bf16_gemm || m == trident::nn::gemm_math::bf16, "gpt_cuda_rank: GEMM math ", trident::nn::name(m),
                   " for a model with gpt_config::bf16_gemm; expected bf16");
    if (m == trident::nn::gemm_math::bf16) trident::nn::cuda::use_bf16_gemm(blas_);
    else blas_.set_math(m);
  }
  //! The phases of forward and backward (NVTX ranges; CUDA-event times when enabled).
  gpu_phases& phases() noexcept { return phases_; }
  //! A timeline of the phases from here, for a trace (gpu_phases::start_timeline on the compute
  //! stream); phases().timeline() returns it.
  void start_timeline() { phases_.start_timeline(ctx_.stream()); }

  std::size_t input_numel(int k) const { return k == 0 ? 1 : n_ * c_.hidden; }
  std::size_t output_numel(int k) const { return k == chunks_ - 1 ? 1 : n_ * c_.hidden; }

  //! A step's micro-batches (m of them, seq x batch tokens each, sequence-major), copied to the
  //! device; the step's loss starts from 0.
  void set_batches(const step_batches& b) {
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
  }

  //! Chunk k's forward of micro-batch mb (a pipeline stage's): x is the previous chunk's output
  //! (chunk 0: ignored, it reads the tokens); returns this chunk's output, or for the last chunk
  //! one float (unused: the loss accumulates on the device, see loss()). The last chunk also
  //! computes the loss's gradient, for a loss weight of 1 / micro-batches. Returns with the
  //! output written (the stream synchronised), as the pipeline executor's messages must be.
  message forward(int k, const message& x, int mb) {
    auto& ch = chunk_of(k);
    TRIDENT_EXPECT(ch.emb_layer >= 0 || x.size() == n_ * c_.hidden, "gpt chunk ", k, ": input of ", x.size(),
                   " elements; expected ", n_ * c_.hidden);
    message y(output_numel(k), trident::mem_category::activations);
    run_forward(ch, mb, x.device_handle(), ch.final_layer >= 0 ? trident::device_span<float>{} : y.device_handle());
    ctx_.synchronize();
    return y;
  }
  //! Chunk k's backward of micro-batch mb: dy is the next chunk's input gradient (the last
  //! chunk: ignored, its forward computed the loss's gradient); returns this chunk's input
  //! gradient (chunk 0: one unused float), the stream synchronised.
  message backward(int k, const message& dy, int mb) {
    auto& ch = chunk_of(k);
    TRIDENT_EXPECT(ch.final_layer >= 0 || dy.size() == n_ * c_.hidden, "gpt chunk ", k, ": output gradient of ", dy.size(),
                   " elements; expected ", n_ * c_.hidden);
    message dx(input_numel(k), trident::mem_category::activations);
    run_backward(ch, mb, dy.device_handle(), ch.emb_layer >= 0 ? trident::device_span<float>{} : dx.device_handle());
    ctx_.synchronize();
    return dx;
  }

  //! One chunk, no pipeline: forward and backward of every micro-batch of `b`, then
  //! finish_backward(). Nothing waits on the host.
  void forward_backward(const step_batches& b) {
    TRIDENT_EXPECT(chunks_ == 1, "gpt_cuda_rank::forward_backward: ", chunks_, " chunks; run them as pipeline stages instead");
    set_batches(b);
    for (int mb = 0; mb < m_; ++mb) {
      run_forward(chunks_mine_.front(), mb, {}, {});
      run_backward(chunks_mine_.front(), mb, {}, {});
    }
    finish_backward();
  }

  //! After every micro-batch's backward: the tied head's gradient joins the embedding's, whose
  //! bucket is then reduced (once per step).
  void finish_backward() {
    if (chunks_ > 1 && owns(chunks_ - 1) && !owns(0)) {
      ctx_.hand_to(pipe_->stream());
      pipe_->send(trident::space_span<const float, trident::cuda_space>(head_grad_.data(), head_grad_.size()), 0);
      TRIDENT_CUDA_CHECK(cudaMemsetAsync(head_grad_.data(), 0, head_grad_.size() * sizeof(float), pipe_->stream()));  // after the send
      ctx_.order_after(pipe_->stream());
    }
    if (!owns(0)) return;
    if constexpr (!policy::shards_gradients) z_->set_gradient_sync(true);
    if (chunks_ > 1) {
      const auto s = z_->gradients(wte_h_);
      const device_span<half_type> g(s.data(), s.size());
      if (owns(chunks_ - 1)) {
        wait_for_optimizer();
        add_into(g, head_grad_.device_handle());
        TRIDENT_CUDA_CHECK(cudaMemsetAsync(head_grad_.data(), 0, head_grad_.size() * sizeof(float), ctx_.stream()));
      } else {
        ctx_.hand_to(pipe_->stream());  // tie_ is free: the last add from it is done
        pipe_->recv(trident::space_span<float, trident::cuda_space>(tie_.data(), tie_.size()), (chunks_ - 1) % p_);
        ctx_.order_after(pipe_->stream());
        wait_for_optimizer();
        add_into(g, tie_.device_handle());
      }
      hand_to_optimizer();
    }
    z_->grad_ready(chunks_mine_.front().emb_layer);
  }

  //! The optimizer's step (collective over the grid; the host waits for every rank's report),
  //! then the new token embedding to the last chunk's copy.
  trident::zero::step_result step() {
    const auto r = z_->step();
    for (auto& ch : chunks_mine_) ch.backwards = 0;
    send_tied_embedding();
    return r;
  }

  //! The step's loss: the mean over its micro-batches, averaged over the data axis, from the
  //! ranks of the last chunk to every rank. Waits for it.
  double loss() { return mean_loss(m_); }

  //! A validation pass begins: the loss sum from 0 (after the step: its loss is read).
  void begin_eval() { TRIDENT_CUDA_CHECK(cudaMemsetAsync(loss_sum_.data(), 0, sizeof(double), ctx_.stream())); }
  //! Validation: one micro-batch of seq x batch tokens (a step_batches of one) into micro-batch
  //! 0's place (after the step: the step's tokens are spent); its loss adds to the pass's sum.
  void set_eval_batch(const step_batches& b) {
    TRIDENT_EXPECT(b.inputs.size() == 1 && b.targets.size() == 1 && b.inputs[0].size() == n_ && b.targets[0].size() == n_,
                   "gpt_cuda_rank: a validation batch is one micro-batch of seq x batch = ", n_, " tokens and targets");
    trident::copy_async(ctx_, std::span<std::int32_t>(tokens_.data(), n_), std::span<const std::int32_t>(b.inputs[0]));
    trident::copy_async(ctx_, std::span<std::int32_t>(targets_.data(), n_), std::span<const std::int32_t>(b.targets[0]));
  }
  //! Forward only (validation) of chunk k on set_eval_batch's tokens, nothing kept for a
  //! backward: this chunk's output (the last chunk: one unused float; its loss adds to the sum
  //! eval_loss() reads). Returns with the output written (the stream synchronised).
  message evaluate(int k, const message& x) {
    auto& ch = chunk_of(k);
    TRIDENT_EXPECT(ch.emb_layer >= 0 || x.size() == n_ * c_.hidden, "gpt chunk ", k, ": input of ", x.size(),
                   " elements; expected ", n_ * c_.hidden);
    message y(output_numel(k), trident::mem_category::activations);
    run_forward(ch, 0, x.device_handle(), ch.final_layer >= 0 ? trident::device_span<float>{} : y.device_handle(), eval_key);
    ctx_.synchronize();
    auto node = ch.saved.extract(eval_key);
    ch.pool.push_back(std::move(node.mapped()));  // its activations, for the next forward
    return y;
  }
  //! The mean validation loss over `batches` evaluated micro-batches, averaged over the data
  //! axis, on every rank. Waits for it.
  double eval_loss(int batches) { return mean_loss(batches); }

  //! Checkpoints of the whole grid's optimizer state (trident/checkpoint/zero.hpp; collective
  //! over `world`), as gpt_rank's: save_checkpoint starts an asynchronous save (waiting for the
  //! previous one), finish_saves waits for the last, load_checkpoint loads the newest good one
  //! under `root` (saved in any layout, on the host or a GPU) and hands the last chunk its copy
  //! of the tied embedding.
  void save_checkpoint(comm_type& world, const std::filesystem::path& root, std::int64_t step,
                       std::map<std::string, std::string> metadata, int keep) {
    pending_save_ = trident::checkpoint::save_async(world, *z_, root, step, {.metadata = std::move(metadata), .keep = keep},
                                                    std::move(pending_save_));
  }
  void finish_saves(comm_type& world) {
    trident::checkpoint::detail::agreed(world, "gpt_cuda_rank::finish_saves", [&] { pending_save_.wait(); });
  }
  std::optional<trident::checkpoint::load_result> load_checkpoint(comm_type& world, const std::filesystem::path& root,
                                                                  std::vector<std::string>* skipped = nullptr) {
    auto r = trident::checkpoint::load_latest(world, *z_, root, skipped, /*echoes=*/false);
    if (r) send_tied_embedding();
    return r;
  }

 private:
  // The activations' key of a forward-only pass (micro-batch keys are >= 0).
  static constexpr int eval_key = -1;

  // The loss sum (over `count` micro-batches) averaged over the data axis, from the ranks of the
  // last chunk to every rank, divided by count.
  double mean_loss(int count) {
    ctx_.hand_to(dp_->stream());
    dp_->all_reduce(trident::space_span<double, trident::cuda_space>(loss_sum_.data(), 1), trident::reduce_op::avg);
    ctx_.order_after(dp_->stream());
    ctx_.hand_to(pipe_->stream());
    pipe_->broadcast(trident::space_span<double, trident::cuda_space>(loss_sum_.data(), 1), (chunks_ - 1) % p_);
    double v = 0;
    TRIDENT_CUDA_CHECK(cudaMemcpyAsync(&v, loss_sum_.data(), sizeof(double), cudaMemcpyDeviceToHost, pipe_->stream()));
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(pipe_->stream()));
    ctx_.order_after(pipe_->stream());
    return v / count;
  }

  using device_span_c = trident::device_span<const float>;
  template <class T>
  using device_span = trident::device_span<T>;

  // What forward keeps for backward, per micro-batch; recycled through a pool so that a warm
  // step allocates no activations.
  // Under gpt_config::bf16_gemm the loss's gradient is kept in bf16 (dlogits16: what the head's
  // bf16 GEMMs read, written so by the cross-entropy's backward), and the float logits live in
  // one scratch (logits_) only while forward needs them: half the bytes per micro-batch in flight,
  // and no float gradient to read back and round. Else the gradient replaces the float logits.
  struct final_saved {
    device_buffer<float> x, out, mean, rstd, logits;
    device_buffer<trident::bf16> dlogits16;
  };
  struct saved_set {
    std::vector<trident::tensor::cuda::block_activations> blocks;
    std::optional<final_saved> final;
  };
  struct chunk {
    int k = 0;
    int emb_layer = -1, first_block_layer = 0, final_layer = -1;
    int backwards = 0;
    std::vector<trident::tensor::cuda::transformer_block> blocks;
    std::vector<trident::tensor_handle> handles;  // 12 per block
    std::map<int, saved_set> saved;
    std::vector<saved_set> pool;
  };

  chunk& chunk_of(int k) {
    for (auto& ch : chunks_mine_)
      if (ch.k == k) return ch;
    throw trident::usage_error(trident::detail::concat("gpt_cuda_rank: stage ", k, " is not on pipeline rank ", prank_));
  }
  saved_set take(chunk& ch) {
    if (!ch.pool.empty()) {
      auto s = std::move(ch.pool.back());
      ch.pool.pop_back();
      return s;
    }
    saved_set s;
    for (const auto& b : ch.blocks) s.blocks.push_back(b.make_activations());
    if (ch.final_layer >= 0) {
      auto kept = [](std::size_t count) { return device_buffer<float>(count, trident::mem_category::activations); };
      const std::size_t h = c_.hidden, local_vocab = ce_.shape().vocab_range().size();
      s.final = final_saved{kept(n_ * h), kept(n_ * h), kept(n_), kept(n_), kept(c_.bf16_gemm ? 0 : n_ * local_vocab),
                            device_buffer<trident::bf16>(c_.bf16_gemm ? n_ * local_vocab : 0, trident::mem_category::activations)};
    }
    return s;
  }

  // Float scratch on the device and how much of it the current views use.
  struct view_arena {
    device_buffer<float> buffer;
    std::size_t at = 0;
  };
  // ZeRO's spans, ready on the data communicator's stream: the compute stream waits for it. In
  // fp32 they are the optimizer's own. In bf16 a parameter is converted into `a` (valid until
  // the arena is reset and used again) on the compute stream, and a gradient view is zeroed
  // float scratch that commit() adds into the bf16 gradients, gpt_rank's param_view/grad_view.
  device_span_c param(trident::tensor_handle h, view_arena& a) { return params(std::array{h}, a)[0]; }
  // Several at once: their spans first (ZeRO-3 gathers them), then one wait for all.
  template <std::size_t N>
  std::array<device_span_c, N> params(const std::array<trident::tensor_handle, N>& hs, view_arena& a) {
    std::array<device_span_c, N> out;
    std::array<device_span<const half_type>, N> spans;
    for (std::size_t i = 0; i < N; ++i) {
      const auto s = z_->parameters(hs[i]);
      spans[i] = device_span<const half_type>(s.data(), s.size());
    }
    if constexpr (full) {
      (void)a;
      return spans;
    } else {
      wait_for_optimizer();
      for (std::size_t i = 0; i < N; ++i) {
        const device_span<float> f = take(a, spans[i].size());
        detail::to_float_kernel<half_type><<<detail::grid_for(f.size()), detail::block, 0, ctx_.stream()>>>(spans[i], f);
        TRIDENT_CUDA_CHECK(cudaGetLastError());
        out[i] = f;
      }
      return out;
    }
  }
  device_span<float> grad(trident::tensor_handle h, view_arena& a) {
    const auto s = z_->gradients(h);
    if constexpr (full) {
      (void)a;
      return {s.data(), s.size()};
    } else {
      const device_span<float> out = take(a, s.size());
      TRIDENT_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.size() * sizeof(float), ctx_.stream()));
      pending_.push_back({device_span<half_type>(s.data(), s.size()), out});
      return out;
    }
  }
  // The next `count` floats of `a`.
  static device_span<float> take(view_arena& a, std::size_t count) {
    TRIDENT_EXPECT(a.at + count <= a.buffer.size(), "gpt_cuda_rank: internal: a scratch arena of ", a.buffer.size(),
                   " floats is too small for ", a.at + count);
    const device_span<float> out(a.buffer.data() + a.at, count);
    a.at += count;
    return out;
  }
  static view_arena& reset(view_arena& a) {
    a.at = 0;
    return a;
  }
  // Adds the float gradients of the views handed out since the last commit to the bf16 ones, on
  // the compute stream, which must already be ordered after the optimizer's (wait_for_optimizer).
  void commit() {
    if constexpr (!full) {
      for (const auto& [g, add] : pending_) add_into(g, add);
      pending_.clear();
    }
  }
  void add_into(device_span<half_type> g, device_span_c add) {
    if constexpr (full) {
      trident::nn::cuda::add_to(add, g, ctx_.stream());
    } else {
      detail::add_into_kernel<half_type><<<detail::grid_for(g.size()), detail::block, 0, ctx_.stream()>>>(g, add);
      TRIDENT_CUDA_CHECK(cudaGetLastError());
    }
  }
  trident::tensor::cuda::transformer_block::weights block_weights(const chunk& ch, std::size_t l) {
    std::array<trident::tensor_handle, 12> hs;
    for (std::size_t i = 0; i < 12; ++i) hs[i] = ch.handles[l * 12 + i];
    return trident::tensor::cuda::transformer_block::weights::from(params(hs, reset(weights_)));
  }
  trident::tensor::cuda::transformer_block::gradients block_gradients(const chunk& ch, std::size_t l) {
    std::array<device_span<float>, 12> s;
    auto& a = reset(grads_);
    for (std::size_t i = 0; i < 12; ++i) s[i] = grad(ch.handles[l * 12 + i], a);
    return trident::tensor::cuda::transformer_block::gradients::from(s);
  }
  void wait_for_optimizer() { ctx_.order_after(dp_->stream()); }
  void hand_to_optimizer() { ctx_.hand_to(dp_->stream()); }
  // The scratch buffer that is not `in` (x_ unless `in` is x_).
  device_buffer<float>& other_than(device_span_c in) { return in.data() == x_.data() ? y_ : x_; }
  device_span<const std::int32_t> tokens_of(int mb) const { return {tokens_.data() + static_cast<std::size_t>(mb) * n_, n_}; }
  device_span<const std::int32_t> targets_of(int mb) const { return {targets_.data() + static_cast<std::size_t>(mb) * n_, n_}; }
  // The head's weight and its gradient: the embedding's own with one chunk, else the last
  // chunk's copy (its gradient sent to chunk 0 by finish_backward).
  device_span_c head_weight() {
    return chunks_ == 1 ? param(wte_h_, reset(head_w_)) : device_span_c(wte_copy_.data(), wte_copy_.size());
  }
  device_span<float> head_gradient() { return chunks_ == 1 ? grad(wte_h_, reset(head_g_)) : head_grad_.device_handle(); }

  // Forward of one chunk: `in` is its input (chunk 0: unused), `out` its output (the last
  // chunk: unused; the loss goes to loss_sum_, its gradient into final_saved). The
  // activations are kept under `key` (default: mb).
  void run_forward(chunk& ch, int mb, device_span_c in, device_span<float> out, std::optional<int> key = std::nullopt) {
    auto& saved = ch.saved[key.value_or(mb)];
    if (saved.blocks.empty()) saved = take(ch);
    const std::size_t h = c_.hidden;
    device_span_c cur = in;
    if (ch.emb_layer >= 0) {
      phases_.mark(ctx_.stream(), "embedding forward");
      const auto [wte, wpe] = params(std::array{wte_h_, wpe_h_}, reset(emb_w_));
      wait_for_optimizer();
      wte_.forward(ctx_, *tp_, tokens_of(mb), wte, x_.device_handle());
      detail::add_positions_kernel<><<<detail::grid_for(n_ * h), detail::block, 0, ctx_.stream()>>>(x_.device_handle(), wpe, batch_, h);
      TRIDENT_CUDA_CHECK(cudaGetLastError());
      hand_to_optimizer();
      z_->release(ch.emb_layer);
      cur = x_.device_handle();
    }
    phases_.mark(ctx_.stream(), "blocks forward");
    for (std::size_t l = 0; l < ch.blocks.size(); ++l) {
      const bool last = l + 1 == ch.blocks.size();
      const device_span<float> next = last && ch.final_layer < 0 ? out : other_than(cur).device_handle();
      const auto w = block_weights(ch, l);
      wait_for_optimizer();
      ch.blocks[l].forward(ctx_, blas_, *tp_, w, cur, next, saved.blocks[l]);
      hand_to_optimizer();
      z_->release(ch.first_block_layer + static_cast<int>(l));
      cur = next;
    }
    if (ch.final_layer >= 0) head_forward(ch, mb, cur, *saved.final);
    phases_.end(ctx_.stream());
  }

  // Final norm, head and loss; the loss's gradient (weight 1 / micro-batches) replaces the logits,
  // or under bf16_gemm goes to dlogits16 in bf16 (final_saved).
  void head_forward(const chunk& ch, int mb, device_span_c y, final_saved& f) {
    phases_.mark(ctx_.stream(), "final norm, head and loss");
    const std::size_t h = c_.hidden;
    const trident::nn::cuda::layer_norm ln{h, c_.eps};
    TRIDENT_CUDA_CHECK(cudaMemcpyAsync(f.x.data(), y.data(), y.size() * sizeof(float), cudaMemcpyDeviceToDevice, ctx_.stream()));
    const auto [lnw, lnb] = params(std::array{lnf_w_, lnf_b_}, reset(lnf_w_scratch_));
    const auto w = head_weight();
    wait_for_optimizer();
    ln.forward(ctx_.stream(), n_, y, lnw, lnb, f.out.device_handle(), f.mean.device_handle(), f.rstd.device_handle());
    const device_span<float> logits = c_.bf16_gemm ? logits_.device_handle() : f.logits.device_handle();
    head_.forward(ctx_, blas_, *tp_, n_, f.out.device_handle(), w, {}, logits);
    ce_.forward(ctx_, *tp_, n_, logits, targets_of(mb), loss_.device_handle());
    detail::accumulate_kernel<><<<1, 1, 0, ctx_.stream()>>>(loss_sum_.device_handle(), loss_.device_handle());
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    const float dloss = 1.0f / static_cast<float>(m_);
    if (c_.bf16_gemm) ce_.backward(ctx_, n_, logits, targets_of(mb), f.dlogits16.device_handle(), dloss);
    else ce_.backward(ctx_, n_, logits, targets_of(mb), logits, dloss);
    hand_to_optimizer();
    z_->release(ch.final_layer);
    if (chunks_ == 1) z_->release(ch.emb_layer);
  }

  // Backward of one chunk: `dy` the gradient of its output (the last chunk: unused), `dx` of its
  // input (chunk 0: unused; the embedding's gradients accumulate instead).
  void run_backward(chunk& ch, int mb, device_span_c dy, device_span<float> dx) {
    auto node = ch.saved.extract(mb);
    TRIDENT_EXPECT(!node.empty(), "gpt chunk ", ch.k, ": backward of micro-batch ", mb, " without its forward");
    auto& saved = node.mapped();
    // Stages 0-1 reduce a bucket once per step: on the chunk's last micro-batch.
    if constexpr (!policy::shards_gradients) z_->set_gradient_sync(++ch.backwards == m_);
    device_span_c g = dy;
    if (ch.final_layer >= 0) g = head_backward(ch, *saved.final);
    phases_.mark(ctx_.stream(), "blocks backward");
    for (std::size_t l = ch.blocks.size(); l-- > 0;) {
      const int layer = ch.first_block_layer + static_cast<int>(l);
      const device_span<float> next = l == 0 && ch.emb_layer < 0 ? dx : other_than(g).device_handle();
      const auto w = block_weights(ch, l);
      const auto gr = block_gradients(ch, l);
      wait_for_optimizer();
      ch.blocks[l].backward(ctx_, blas_, *tp_, w, saved.blocks[l], g, next, gr);
      commit();
      hand_to_optimizer();
      z_->release(layer);
      z_->grad_ready(layer);
      g = next;
    }
    ch.pool.push_back(std::move(saved));
    if (ch.emb_layer >= 0) embed_backward(mb, g);
    phases_.end(ctx_.stream());
  }

  // The head (its gradient joins the embedding's) and the final norm; returns the gradient of
  // the last block's output (in x_ or y_).
  device_span_c head_backward(const chunk& ch, final_saved& f) {
    phases_.mark(ctx_.stream(), "head and final norm backward");
    const trident::nn::cuda::layer_norm ln{c_.hidden, c_.eps};
    const auto w = head_weight();
    const auto gw = head_gradient();
    const auto lnw = param(lnf_w_, reset(lnf_w_scratch_));
    auto& ga = reset(lnf_g_);
    const auto glnw = grad(lnf_w_, ga), glnb = grad(lnf_b_, ga);
    wait_for_optimizer();
    if (c_.bf16_gemm) {
      head_.backward(ctx_, blas_, *tp_, n_, f.out.device_handle(), w, device_span<const trident::bf16>(f.dlogits16.device_handle()),
                     d_out_.device_handle(), gw, {});
    } else {
      head_.backward(ctx_, blas_, *tp_, n_, f.out.device_handle(), w, f.logits.device_handle(), d_out_.device_handle(), gw, {});
    }
    ln.backward(ctx_.stream(), n_, f.x.device_handle(), lnw, f.mean.device_handle(), f.rstd.device_handle(), d_out_.device_handle(),
                x_.device_handle(), glnw, glnb, lnf_scratch_.device_handle());
    commit();  // the head's gradient (one chunk) and the final norm's
    hand_to_optimizer();
    z_->release(ch.final_layer);
    if (chunks_ == 1) z_->release(ch.emb_layer);  // the head's weight; embed_backward needs only gradients
    z_->grad_ready(ch.final_layer);
    return x_.device_handle();
  }

  void embed_backward(int mb, device_span_c g) {
    phases_.mark(ctx_.stream(), "embedding backward");
    auto& a = reset(emb_g_);
    const auto gwte = grad(wte_h_, a), gwpe = grad(wpe_h_, a);
    wait_for_optimizer();
    wte_.backward(ctx_, *tp_, tokens_of(mb), g, gwte);
    detail::position_grad_kernel<><<<detail::grid_for(gwpe.size()), detail::block, 0, ctx_.stream()>>>(g, gwpe, batch_, c_.hidden);
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    commit();
    hand_to_optimizer();
  }

  // The token embedding's new values from chunk 0's rank to the last chunk's copy.
  void send_tied_embedding() {
    if (chunks_ == 1) return;
    if (owns(0)) {
      const auto s = z_->parameters(wte_h_);
      const device_span<const half_type> w(s.data(), s.size());
      wait_for_optimizer();
      // The working weights' float values: the copy's own (bf16: converted, into tie_ to be sent).
      const auto to_float = [&](device_span<float> out) {
        if constexpr (full) {
          TRIDENT_CUDA_CHECK(cudaMemcpyAsync(out.data(), w.data(), w.size() * sizeof(float), cudaMemcpyDeviceToDevice, ctx_.stream()));
        } else {
          detail::to_float_kernel<half_type><<<detail::grid_for(w.size()), detail::block, 0, ctx_.stream()>>>(w, out);
          TRIDENT_CUDA_CHECK(cudaGetLastError());
        }
      };
      if (owns(chunks_ - 1)) {
        to_float(wte_copy_.device_handle());
      } else {
        device_span_c sent(reinterpret_cast<const float*>(w.data()), w.size());
        if constexpr (!full) {
          to_float(tie_.device_handle());
          sent = tie_.device_handle();
        }
        ctx_.hand_to(pipe_->stream());
        pipe_->send(trident::space_span<const float, trident::cuda_space>(sent.data(), sent.size()), (chunks_ - 1) % p_);
        ctx_.order_after(pipe_->stream());
      }
      hand_to_optimizer();  // the buffer is reused only after the copy or the send
      z_->release(chunks_mine_.front().emb_layer);
    } else if (owns(chunks_ - 1)) {
      ctx_.hand_to(pipe_->stream());  // the last reads of the copy are done
      pipe_->recv(trident::space_span<float, trident::cuda_space>(wte_copy_.data(), wte_copy_.size()), 0);
      ctx_.order_after(pipe_->stream());
    }
  }

  trident::cuda_context ctx_;
  trident::nn::cublas_handle blas_;
  gpu_phases phases_;
  comm_type* tp_;
  comm_type* dp_;
  comm_type* pipe_;
  gpt_config c_;
  int chunks_, p_, prank_, m_;
  std::size_t batch_, n_;
  trident::tensor::block_config block_cfg_;
  trident::tensor::cuda::vocab_parallel_embedding wte_;
  trident::tensor::cuda::column_parallel_linear head_;
  trident::tensor::cuda::vocab_parallel_cross_entropy ce_;
  std::vector<chunk> chunks_mine_;
  std::unique_ptr<zero_type> z_;
  trident::tensor_handle wte_h_, wpe_h_, lnf_w_, lnf_b_;
  device_buffer<float> wte_copy_, head_grad_, tie_;  // the tied embedding across stages
  // bf16: float views of the working weights and gradients (param, grad), and the gradient views
  // not yet added to the bf16 ones (commit).
  view_arena weights_, grads_, emb_w_, emb_g_, head_w_, head_g_, lnf_w_scratch_, lnf_g_;
  std::vector<std::pair<device_span<half_type>, device_span<float>>> pending_;
  device_buffer<float> x_, y_, d_out_, loss_;
  device_buffer<float> logits_;  // under gpt_config::bf16_gemm, on the rank of the last stage (final_saved)
  device_buffer<std::int32_t> tokens_, targets_;
  device_buffer<double> loss_sum_, lnf_scratch_;
  trident::checkpoint::pending_save pending_save_;  // the last asynchronous save (ends before z_ goes)
};

//! Chunk k of a gpt_cuda_rank as a pipeline stage (trident::pipeline::stage) with device messages.
template <int Stage, class Precision = trident::full_precision>
class gpt_cuda_stage {
 public:
  using rank_type = gpt_cuda_rank<Stage, optimizer_type, Precision>;
  using input_type = typename rank_type::message;
  using output_type = typename rank_type::message;

  gpt_cuda_stage(rank_type& rank, int k) : rank_(&rank), k_(k) {}
  std::size_t input_numel() const { return rank_->input_numel(k_); }
  std::size_t output_numel() const { return rank_->output_numel(k_); }
  output_type forward(const input_type& x, int mb) { return rank_->forward(k_, x, mb); }
  input_type backward(const output_type& dy, int mb) { return rank_->backward(k_, dy, mb); }

 private:
  rank_type* rank_;
  int k_;
};

//! The pipeline stage counts (p x virtual stages) the GPU trainer compiles.
inline constexpr std::array<int, 3> compiled_gpu_stage_counts{1, 2, 4};

namespace detail {

// Every rank learns whether any rank read a token outside the vocabulary (one int over the
// world, in `flag`: device memory made once per run, not per step), so that all of them throw
// at the same step.
inline void check_tokens(trident::nccl_comm& world, const step_batches& b, std::size_t vocab, long step,
                         trident::buffer<std::int32_t, trident::cuda_space>& flag, const char* what = "micro-batch") {
  std::int32_t bad = 0;
  for (const auto* lists : {&b.inputs, &b.targets})
    for (const auto& list : *lists)
      for (const auto v : list) bad |= v < 0 || static_cast<std::size_t>(v) >= vocab;
  trident::copy(std::span<const std::int32_t>(&bad, 1), flag);
  world.all_reduce(flag, trident::reduce_op::max);
  world.synchronize();
  const auto any = trident::to_vector(flag)[0];
  if (any != 0)
    throw trident::usage_error(trident::detail::concat("train_cuda: step ", step, ": ", bad ? "this rank" : "another rank",
                                                       " read a token outside the vocabulary [0, ", vocab, ") in a ", what, " (rank ",
                                                       world.rank(), ")"));
}

template <class F>
void with_gpu_stage_count(int n, F&& f) {
  switch (n) {
    case 1: f(std::integral_constant<std::size_t, 1>{}); return;
    case 2: f(std::integral_constant<std::size_t, 2>{}); return;
    case 4: f(std::integral_constant<std::size_t, 4>{}); return;
    default: break;
  }
  throw trident::usage_error(trident::detail::concat("train_cuda: ", n, " pipeline stages (pipeline x virtual_stages) are not "
                                                     "compiled in on the GPU; expected 1, 2 or 4"));
}

template <int Stage, class Precision, std::size_t N>
std::vector<step_report> loop_cuda(trident::nccl_comm& world, trident::process_grid<trident::nccl_comm>& grid, const train_options& o,
                                   const std::function<void(const step_report&)>& on_step,
                                   gpt_cuda_rank<Stage, optimizer_type, Precision>& rank, const optimizer_type& opt) {
  namespace pp = trident::pipeline;
  using stage_type = gpt_cuda_stage<Stage, Precision>;
  const int p = grid.pipeline().size(), d = grid.data().size(), m = o.accumulation;
  pp::uniform_pipeline<stage_type, N> pipe(grid.pipeline(), [&](auto k) { return stage_type(rank, static_cast<int>(k)); });
  const auto schedule = flagship::detail::make_schedule(o.schedule, p, m, static_cast<int>(N) / p);
  const int slice = o.data_slice ? o.data_slice->first : grid.data().rank(), slices = o.data_slice ? o.data_slice->second : d;
  trident::data::shard_loader train(o.train_files, o.micro_batch, o.model.seq, slice, slices);
  std::optional<trident::data::shard_loader> val;
  if (o.eval_every > 0) {
    TRIDENT_EXPECT(!o.val_files.empty(), "train_cuda: a validation loss every ", o.eval_every, " steps needs validation shards");
    val.emplace(o.val_files, o.micro_batch, o.model.seq, grid.data().rank(), d);
  }
  trident::data::token_batch scratch;
  step_batches batches;
  using message = typename gpt_cuda_rank<Stage, optimizer_type, Precision>::message;
  const message unused(1, trident::mem_category::other);
  trident::buffer<std::int32_t, trident::cuda_space> bad_tokens(1, trident::mem_category::other);
  const double tokens = static_cast<double>(d) * m * static_cast<double>(o.micro_batch * o.model.seq);
  const auto coordinates = trident::detail::concat("rank ", world.rank(), " (d ", grid.coordinate(trident::grid_axis::data), ", t ",
                                                   grid.coordinate(trident::grid_axis::tensor), ", p ",
                                                   grid.coordinate(trident::grid_axis::pipeline), ")");
  const std::size_t step_tokens = static_cast<std::size_t>(d) * static_cast<std::size_t>(m) * o.micro_batch * o.model.seq;
  long first = 1;
  if (o.resume)
    first = flagship::detail::resume(train, o, step_tokens, world.rank(), [&](std::vector<std::string>* skipped) {
      return rank.load_checkpoint(world, o.checkpoint_dir, skipped);
    });
  std::vector<step_report> reports;
  for (long s = first; s <= o.steps; ++s) {
    // The traced step: the host's spans (the library's: enqueueing collectives, the pipeline
    // executor, the ZeRO step) on one track per rank, the compute stream's phases as the GPU ran
    // them (CUDA events) on another.
    std::optional<trident::trace_recorder> recorder, gpu_track;
    if (s == o.trace_step) {
      recorder.emplace(world.rank(), coordinates);
      gpu_track.emplace(world.size() + world.rank(), coordinates + " GPU");
      rank.start_timeline();
    }
    trident::scoped_trace tracing(recorder ? &*recorder : nullptr);
    const auto start = std::chrono::steady_clock::now();
    std::optional<trident::trace_span> step_span;
    step_span.emplace("step", [&] { return "step " + std::to_string(s); });
    {
      const trident::trace_span span("data", "load batches");
      batches = {};
      for (int i = 0; i < m; ++i) append_batch(train, scratch, batches);
      check_tokens(world, batches, o.model.vocab, s, bad_tokens);
    }
    if (N == 1) {
      rank.forward_backward(batches);  // no executor: nothing waits on the host until the step
    } else {
      rank.set_batches(batches);
      // The loss accumulates on the device (rank.loss()); the executor's value is not used.
      const auto* placeholder = &unused;  // chunk 0's input: it reads the tokens instead
      (void)pipe.run(grid.pipeline(), schedule, [placeholder](int) -> const auto& { return *placeholder; },
                     [](const auto&, int, auto&) { return 0.0; });
      rank.finish_backward();
    }
    const auto result = rank.step();
    step_span.reset();
    step_report rep;
    rep.step = s;
    rep.loss = rank.loss();
    rep.lr = opt.schedule(s);
    rep.grad_norm = result.grad_norm;
    rep.applied = result.applied;
    rep.tokens = tokens;
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (val && s % o.eval_every == 0) {
      val->reset();
      rank.begin_eval();
      const int prank = grid.pipeline().rank();
      for (int i = 0; i < o.eval_batches; ++i) {
        step_batches one;
        append_batch(*val, scratch, one);
        check_tokens(world, one, o.model.vocab, s, bad_tokens, "validation batch");
        rank.set_eval_batch(one);
        // Forward only, chunk after chunk, as the host's loop: a rank runs its chunks in order
        // and passes the activations on; each transfer is waited for (the data flows one way,
        // so nothing waits in a cycle) before its buffer is used or dropped.
        std::optional<message> x;
        for (int k = 0; k < static_cast<int>(N); ++k) {
          if (k % p != prank) continue;
          if (k > 0 && (k - 1) % p != k % p) {
            x.emplace(rank.input_numel(k), trident::mem_category::activations);
            grid.pipeline().recv(*x, (k - 1) % p);
            grid.pipeline().synchronize();
          }
          message y = rank.evaluate(k, x ? *x : unused);
          if (k + 1 < static_cast<int>(N) && (k + 1) % p != k % p) {
            grid.pipeline().send(std::as_const(y), (k + 1) % p);
            grid.pipeline().synchronize();
          }
          x.emplace(std::move(y));
        }
      }
      rep.val_loss = rank.eval_loss(o.eval_batches);
      rep.validated = true;
    }
    // A step whose loss is not finite is not saved: its weights may be NaN already, and a save
    // would pass for good (and with keep_checkpoints push out an older good one).
    if (o.save_every > 0 && s % o.save_every == 0 && std::isfinite(rep.loss)) {
      const trident::trace_span span("checkpoint", "save (the copy to host memory)");  // in the traced step's trace
      rank.save_checkpoint(world, o.checkpoint_dir, s, flagship::detail::data_position(train, step_tokens), o.keep_checkpoints);
    }
    if (recorder) {
      tracing.end();
      for (auto& e : rank.phases().timeline()) gpu_track->record(std::move(e.name), e.category, e.begin, e.end);
      const trident::trace_recorder* const tracks[] = {&*recorder, &*gpu_track};
      flagship::detail::write_trace(world, std::span<const trident::trace_recorder* const>(tracks), o.trace_file);
    }
    if (on_step) on_step(rep);
    reports.push_back(rep);
  }
  if (o.save_every > 0) rank.finish_saves(world);
  return reports;
}

template <int Stage, class Precision>
std::vector<step_report> run_cuda(trident::nccl_comm& world, trident::process_grid<trident::nccl_comm>& grid, const train_options& o,
                                  const std::function<void(const step_report&)>& on_step) {
  const optimizer_type opt = flagship::detail::optimizer_of(o);
  const int chunks = o.pipeline * o.virtual_stages;
  gpt_cuda_rank<Stage, optimizer_type, Precision> rank(grid, o.model, chunks, o.accumulation, o.micro_batch, opt,
                                                       flagship::detail::zero_options_of(o), o.seed);
  // gpt_config::bf16_gemm (set by --gemm bf16) is bf16 math; else --gemm's, fp32 for fp32 and TF32 for bf16.
  rank.set_gemm_math(o.model.bf16_gemm ? trident::nn::gemm_math::bf16
                                       : o.gpu_gemm.value_or(std::is_same_v<Precision, trident::full_precision>
                                                                 ? trident::nn::gemm_math::fp32
                                                                 : trident::nn::gemm_math::tf32));
  std::vector<step_report> out;
  with_gpu_stage_count(chunks,
                       [&](auto n) { out = loop_cuda<Stage, Precision, decltype(n)::value>(world, grid, o, on_step, rank, opt); });
  return out;
}

}  // namespace detail

//! flagship::train on GPUs (see the header comment), in Precision (full_precision or
//! mixed_precision<bf16>, as train's): every rank of `world` calls it with the same options; the
//! step reports are the same on every rank. Options the GPU path does not have yet are errors
//! that say so, before anything collective.
template <class Precision = trident::full_precision>
std::vector<step_report> train_cuda(trident::nccl_comm& world, const train_options& o,
                                    const std::function<void(const step_report&)>& on_step = {}) {
  TRIDENT_EXPECT(o.tensor >= 1 && o.pipeline >= 1 && o.virtual_stages >= 1, "train_cuda: tensor ", o.tensor, ", pipeline ",
                 o.pipeline, ", virtual_stages ", o.virtual_stages, "; expected all at least 1");
  const int chunks = o.pipeline * o.virtual_stages;
  TRIDENT_EXPECT(std::find(compiled_gpu_stage_counts.begin(), compiled_gpu_stage_counts.end(), chunks) != compiled_gpu_stage_counts.end(),
                 "train_cuda: ", chunks, " pipeline stages (pipeline x virtual_stages) are not compiled in on the GPU; expected 1, 2 "
                 "or 4");
  TRIDENT_EXPECT(!o.model.sequence_parallel && o.model.recompute != recompute_mode::full,
                 "train_cuda: sequence parallelism and full recomputation are not on the GPU path yet");
  flagship::detail::check_run_options(o, "train_cuda");
  TRIDENT_EXPECT(world.size() % (o.tensor * o.pipeline) == 0, "train_cuda: a world of ", world.size(),
                 " ranks is not d x t x p for t = ", o.tensor, " and p = ", o.pipeline, "; expected a multiple of ",
                 o.tensor * o.pipeline);
  TRIDENT_EXPECT(o.accumulation >= 1 && o.steps >= 0, "train_cuda: accumulation ", o.accumulation, ", steps ", o.steps,
                 "; expected at least 1 micro-batch per step and no negative step count");
  (void)flagship::detail::make_schedule(o.schedule, o.pipeline, o.accumulation, o.virtual_stages);
  const auto& c = o.model;
  flagship::detail::check_model(c, static_cast<std::size_t>(o.tensor), static_cast<std::size_t>(chunks), "train_cuda");
  {
    const int d = world.size() / (o.tensor * o.pipeline);
    const trident::data::shard_loader check(o.train_files, o.micro_batch, c.seq, 0, d);
    if (o.eval_every > 0 && !o.val_files.empty()) (void)trident::data::shard_loader(o.val_files, o.micro_batch, c.seq, 0, d);
  }
  trident::process_grid grid(world, o.tensor, o.pipeline);
  std::vector<step_report> out;
  flagship::detail::with_zero_stage(o.zero_stage,
                                    [&](auto stage) { out = detail::run_cuda<decltype(stage)::value, Precision>(world, grid, o, on_step); });
  return out;
}

}  // namespace flagship::cuda
