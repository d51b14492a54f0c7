#pragma once
// ZeRO (Rajbhandari et al., 2020) stages 0-3 over a data-parallel communicator, composed with an
// optimizer and a precision policy:
//
//   zero_optimizer<Stage, Opt, Comm, Precision = full_precision>
//     Stage is a stage policy (parallel/data/stages/stage_N.hpp, concept zero_stage in
//     parallel/data/stage.hpp) or its number: zero_optimizer<zero::stage_2{}, ...> is
//     zero_optimizer<2, ...>. Every stage-dependent decision below reads the policy's
//     shards_optimizer_state / shards_gradients / shards_parameters, not the number.
//     Stage 0  gradients all-reduced; every rank keeps full parameters, gradients, states
//     Stage 1  + optimizer states (and fp32 master weights) sharded; parameters all-gathered
//              after the step
//     Stage 2  + gradients reduce-scattered: each rank keeps only its shard of them
//     Stage 3  + parameters sharded: gathered bucket by bucket before a layer's forward and
//              backward, released after, the next bucket prefetched; buckets smaller than a
//              persistence threshold stay gathered
//   struct zero_options   bucket sizes, averaging, clipping, stage-3 gathering, checked mode
//   struct step_result    what step() did
//
// Per-rank bytes for parameters, gradients and optimizer states, mixed-precision Adam, Ψ
// parameters (padded to whole buckets), N ranks: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N. Bucket
// buffers for gradient reduction (stages 2-3) and gathered parameters (stage 3) are charged to
// mem_category::communication, so they are reported separately.
//
// How a step goes (the user writes forward and backward):
//   auto w = zero.handle("fc1.weight");   once: later look-ups index an array, not a map of names
//   for each micro-batch:
//     forward:  p = zero.parameters(w) ...; zero.release(layer) (stage 3)
//     backward: g = zero.gradients(w); g += ... (accumulate, scaled by loss_scale());
//               zero.grad_ready(layer) once per layer as its gradients are complete: a bucket
//               whose layers are all ready starts its (asynchronous) reduction at once
//   zero.step(): waits for the reductions, checks every rank's gradients for inf/NaN (a step
//   with an overflow anywhere is skipped everywhere), clips to a global norm, runs the
//   optimizer on this rank's shard, and all-gathers the new parameters (stages 1-2).
//   zero.step_async() does the same with the decision and the step count kept in the
//   optimizer's memory (no host wait: a CUDA graph can capture it); zero.last_step() reads
//   what it did.
//
// Streams (CUDA): the optimizer's own work (copies, clears, statistics, updates), its
// collectives and the reuse of its bucket buffers (pooled, never freed per step) are ordered on
// the communicator's stream, so a bucket costs the host no wait, and a step one: reading back
// every rank's report to decide whether to apply it. The spans that parameters() and
// gradients() hand out are ready on that stream, and a pooled buffer may have served another
// bucket just before. Work on another stream must therefore order itself after the
// communicator's before touching them (cuda_context::order_after(comm.stream())), and before the
// next call that hands them back (grad_ready, release, step: cuda_context::hand_to), as llm.c
// hands its compute stream to NCCL's (exec/cuda/stream.hpp).
//
// What the spans are valid for. parameters(): stages 0-2 for the optimizer's life; stage 3 until
// the bucket is released (release() of every layer of it that has tensors, step(),
// set_parameter()). gradients(): stages 0-1 for the
// optimizer's life; stages 2-3 until the bucket's reduction finishes (gradients() asked for the
// bucket in the next micro-batch, or step()). Gradients must be written before grad_ready(layer):
// the reduction takes them then.
//
// Bad use is a usage_error naming the call, the layer or bucket and what was expected, raised
// before anything is updated, and by a call that would queue a collective before it is queued:
//   - grad_ready(layer) twice in one micro-batch (stages 0-1: after its bucket was reduced in this
//     step; stages 2-3: while its bucket's reduction is in flight). Layers without tensors are
//     legal: grad_ready and release are no-ops for them.
//   - ranks whose bucket collectives (reductions, stage-3 gathers) come in different orders:
//     collectives are matched by position, so two equal-sized buckets would be silently swapped.
//     Every rank records the sequence it issued; step() compares them (a digest and a count per
//     rank travel in the all-gather step() makes anyway) and, if they differ, every rank throws the
//     same usage_error naming the first position and both buckets. It is caught at the next
//     step(), before any update: that micro-batch's forward and backward already ran on the
//     wrong data. Discovering it at each gather would cost a collective (and a host wait on GPUs)
//     per gather. When the collectives differ in kind or size (stage 3 with prefetch: a rank's
//     prefetch follows its own order, so it gathers where another reduce-scatters), the
//     communicator may refuse them first: the thread backend at the wait (it fails what each
//     rank queued behind, so the ranks stay matched), MPI with TRIDENT_CHECK_COLLECTIVES at the
//     start. The call that meets the refusal (parameters, release, gradients, grad_ready,
//     finish, step, zero_grad) then waits for what is in flight, exchanges the sequences (error
//     path only) and throws the same message, prefixed with the call and rank, on every rank.
//     MPI without the check cannot tell: an all-gather against a reduce-scatter is undefined
//     there (garbage, or a hang until the watchdog); if it completes, step() names it.
//   - zero_options out of range (NaN or negative max_grad_norm, buckets smaller than one element).
//   - the optimizer's hyperparameters out of torch.optim's ranges (a NaN or negative lr, a beta
//     of 1): at construction, and at the start of every step() for the lr a schedule gives it,
//     before the loss scaler, the step count or any parameter changes.
// A rank that alone makes a mistake throws alone; on the thread backend that aborts the world,
// so its peers throw a trident::error naming it instead of waiting (comm/local.hpp); MPI ends
// the job, NCCL's peers time out. What can be checked collectively is checked in step().
//
// Checked mode (zero_options::check_usage; on by default when NDEBUG is not defined, like
// assert: build every translation unit of a program alike) also catches what costs memory and
// time to catch:
//   - a parameters() span read after release() in stage 3: released buckets are not freed but
//     filled with NaN (and reused for the bucket's next gather), so a stale read yields NaN
//     instead of whatever took over the memory; stage 3 then holds every bucket it ever gathered.
//   - gradients written after grad_ready(): a bucket is reduced from a private copy, and a 64-bit
//     fingerprint of the user's gradients taken when its reduction starts is compared when it
//     finishes and at step() (stages 2-3 keep their bucket buffers for this); step() then throws
//     the same usage_error on every rank, naming the rank and the bucket, and applies nothing.
// Without it, such gradients written in stages 2-3 after their bucket was reduced but never
// marked ready again are still caught (a non-zero bucket buffer at step()).
//
// Destruction: communication in flight uses the optimizer's buffers, so the destructor waits for
// it. A destructor cannot throw; call finish() first to get such errors as exceptions (step()
// does it). Whatever still fails in the destructor goes to zero_options::on_destructor_error
// (default: one line on stderr), never nowhere.
//
// Model parallelism: constructed with a second, model-parallel communicator (the tensor axis of
// a process_grid), the optimizer holds this rank's part of a tensor-parallel model; the global
// norm counts each shard on every rank and each replica (model_copy::replica) once, and the
// overflow decision is the grid's (one all-reduce of three doubles over that group per step).
// Two tensor-parallel blocks trained this way on a (t = 2, d = 2) grid equal one rank's
// training (tests/tensor, ZeRO-1 and ZeRO-3, clipping on). Under pipeline parallelism the
// model-parallel group is process_grid::model() (tensor x pipeline ranks) and each stage's
// replicas count on its tensor rank 0 (zero_options::count_replicas): tests/pipeline trains
// a (d, t, p) = (2, 2, 2) grid so, clipped, to one rank's parameters and norms.
//
// Equivalence: the result equals single-rank training on the global batch (gradients are
// averaged over ranks), and on the thread backend stages 0-3 agree bit for bit, because every
// stage reduces each bucket with the same summation order and updates the same elements with
// the same arithmetic; the gradient norm is always summed over the same shard pieces, in rank
// order. Checked mode changes none of it.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/comm/host_reduce.hpp"
#include "trident/compress/reducer.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/exec/trace.hpp"
#include "trident/optim/optimizers.hpp"
#include "trident/model/flat_layout.hpp"
#include "trident/offload/store.hpp"
#include "trident/precision/mixed_precision.hpp"
#include "trident/parallel/data/stage.hpp"

namespace trident::detail {

//! step_async()'s decision, where its reports are (host memory, or one device thread): the same
//! sum in rank order, overflow check and clipping factor as step(), with the step skipped when a
//! rank reports a misuse or the ranks' collective sequences differ. `state` holds
//! optim::deferred_decision's fields (apply, step count, multiplier: the count moves only when
//! the step is applied), then the norm, a sticky error flag, and a copy of the reports that
//! raised it. A loss scale that never changes is assumed (step_async checks it).
TRIDENT_HOST_DEVICE inline void decide_step(const double* reports, std::size_t ranks, std::size_t fields, float unscale,
                                            float max_grad_norm, double* state) {
  using dd = optim::deferred_decision;
  constexpr std::size_t norm_at = dd::size, error_at = dd::size + 1, reports_at = dd::size + 2;
  double norm_squared = 0;
  bool overflow = false, misuse = false;
  for (std::size_t r = 0; r < ranks; ++r) {
    const double* report = reports + r * fields;
    norm_squared += report[0];  // in rank order, as step()
    overflow = overflow || report[1] != 0;
    misuse = misuse || report[4] != 0 || report[2] != reports[2] || report[3] != reports[3];
  }
#if defined(__CUDA_ARCH__)
  const double norm = ::sqrt(norm_squared);
#else
  const double norm = std::sqrt(norm_squared);
#endif
  state[norm_at] = norm;
  if (misuse && state[error_at] == 0) {
    state[error_at] = 1;
    for (std::size_t i = 0; i < ranks * fields; ++i) state[reports_at + i] = reports[i];
  }
  const bool apply = !overflow && !misuse;
  state[dd::apply] = apply ? 1.0 : 0.0;
  if (!apply) return;
  state[dd::step_number] += 1;
  float multiplier = unscale;
  if (max_grad_norm > 0) multiplier *= optim::detail::clip_coefficient(norm, max_grad_norm);
  state[dd::multiplier] = multiplier;
}

}  // namespace trident::detail

namespace trident::zero {

//! Where the element-wise work of a step runs: the gradient statistics, the optimizer update and
//! the accumulation of reduced gradient pieces. Specialised per memory space; the host engine is
//! below, the CUDA one in trident/parallel/data/cuda/zero_engine.cuh (include it to use cuda_space
//! communicators such as nccl_comm). Work is ordered on the communicator's stream, if it has one.
template <memory_space Space>
struct engine;

//
// Every member queues its work like the rest (nothing waited for, nothing allocated), so that
// a bucket costs no host wait and a step one (reading back every rank's report):
//   stats_into   the sum of squares of float(g) * multiplier (in double; non-finite when a
//                gradient is) into *sum, a slot of the space's memory, using `scratch`
//                (stats_scratch(n) doubles there) as it likes: step() fills one slot per bucket;
//   total_into   out[0] = the n slots summed in order, out[1] = 1 if that is not finite (sums
//                of squares cannot cancel an inf), i.e. this rank's report;
//   step, accumulate   the optimizer update of a piece; dst += src for reduced pieces;
//   step_deferred      step() with apply, step number and multiplier read from `decision`
//                      (optim::deferred_decision, in the space's memory): step_async's update;
//   decide, store      detail::decide_step where the reports are; n (<= 4) doubles written
//                      from values passed by value (no host copy: a graph can hold them);
//   capturing          whether the communicator's stream is being captured into a CUDA graph;
//   copy, fill_zero    within the space, or from the host into it (the source may be reused at
//                return): bucket buffers are pooled, so these must be ordered with the rest.
template <>
struct engine<host_space> {
  static constexpr std::size_t stats_scratch(std::size_t) noexcept { return 0; }
  template <class Comm, class H>
  static void stats_into(Comm&, const H* grads, std::size_t n, float multiplier, double* sum, double* /*scratch*/,
                         std::size_t /*scratch_size*/) {
    *sum = optim::gradient_stats(std::span<const H>(grads, n), multiplier).sum_squares;
  }
  template <class Comm, class Opt, class H, std::size_t S>
  static void step(Comm&, const Opt& opt, float* params, const H* grads, const std::array<float*, S>& states, std::size_t n,
                   std::int64_t t, float multiplier, H* working) {
    std::array<std::span<float>, S> state;
    for (std::size_t s = 0; s < S; ++s) state[s] = {states[s], n};
    opt.step(std::span<float>(params, n), std::span<const H>(grads, n), state, t, multiplier,
             working ? std::span<H>(working, n) : std::span<H>());
  }
  template <class Comm, class H>
  static void accumulate(Comm&, H* dst, const H* src, std::size_t n) {
    detail::host_combine(dtype_of<H>, reduce_op::sum, dst, dst, src, n);
  }
  template <class Comm>
  static void total_into(Comm&, const double* sums, std::size_t n, double* out) {
    double total = 0;
    for (std::size_t b = 0; b < n; ++b) total += sums[b];
    out[0] = total;
    out[1] = std::isfinite(total) ? 0.0 : 1.0;
  }
  template <class Comm>
  static void copy(Comm&, void* dst, const void* src, std::size_t bytes) {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  template <class Comm>
  static void fill_zero(Comm&, void* dst, std::size_t bytes) {
    if (bytes != 0) std::memset(dst, 0, bytes);
  }
  template <class Comm, class Opt, class H, std::size_t S>
  static void step_deferred(Comm& comm, const Opt& opt, float* params, const H* grads, const std::array<float*, S>& states,
                            std::size_t n, const double* decision, H* working) {
    using dd = optim::deferred_decision;
    if (decision[dd::apply] == 0) return;
    step(comm, opt, params, grads, states, n, static_cast<std::int64_t>(decision[dd::step_number]),
         static_cast<float>(decision[dd::multiplier]), working);
  }
  template <class Comm>
  static void decide(Comm&, const double* reports, std::size_t ranks, std::size_t fields, float unscale, float max_grad_norm,
                     double* state) {
    detail::decide_step(reports, ranks, fields, unscale, max_grad_norm, state);
  }
  template <class Comm>
  static void store(Comm&, double* dst, const std::array<double, 4>& values, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = values[i];
  }
  template <class Comm>
  static bool capturing(Comm&) noexcept {
    return false;
  }
};

struct zero_options {
  std::size_t bucket_bytes = std::size_t{25} << 20;      // gradient bucket cap (PyTorch DDP's default)
  std::size_t first_bucket_bytes = std::size_t{1} << 20;  // smaller, so the first reduction starts early
  bool average = true;                                    // average gradients over ranks (else sum)
  float max_grad_norm = 0.0f;                             // global-norm clipping; 0 = off (+inf: never clips)
  std::size_t persistence_threshold = 100'000;            // stage 3: buckets with fewer elements stay gathered
  bool prefetch = true;                                   // stage 3: gather the next bucket in the background
  //! With a model-parallel group: whether this rank's replicas (model_copy::replica) count in
  //! the global norm. Unset: model-parallel rank 0's do, right when the group is the tensor
  //! axis. With tensor and pipeline stages in the group (process_grid::model()), each stage's
  //! replicas count once: set it to grid.coordinate(grid_axis::tensor) == 0 (Megatron-LM's
  //! "not a tensor-parallel duplicate").
  std::optional<bool> count_replicas;
#ifdef NDEBUG
  bool check_usage = false;  // checked mode (see the top of this header): memory and time for diagnostics
#else
  bool check_usage = true;
#endif
  //! Receives what failed in the destructor, which cannot throw (see the top of this header);
  //! empty: one line on stderr.
  std::function<void(const std::string&)> on_destructor_error;
  //! Where the fp32 master weights and optimizer states live (stages 1-3): empty = the
  //! optimizer's memory space; offload::host() = host memory (ZeRO-Offload);
  //! offload::nvme(dir) = files (ZeRO-Infinity, offload/nvme.hpp). Each step then streams them
  //! through the host optimizer piece by piece (a bucket's share), the next piece read while
  //! the current one is updated; the result is the in-memory optimizer's, bit for bit.
  //! offload::tiered(rule, host, nvme) chooses the tier per tensor. A device optimizer
  //! (nccl_comm) brings each gradient piece down and its half parameters back up through
  //! pinned host memory (docs/OFFLOAD.md; not yet run on a GPU).
  std::shared_ptr<const offload::placement> offload;
};

//! What step() did.
struct step_result {
  bool applied;         // false: an inf/NaN gradient on some rank, the step was skipped everywhere
  double grad_norm;     // global L2 norm of the (unscaled, unclipped) gradients
  float loss_scale;     // the scale the next step uses
};

template <auto Stage, class Opt, communicator Comm, class Precision = full_precision>
class zero_optimizer {
  using policy = stage_policy_t<Stage>;
  static_assert(zero_stage<policy>,
                "zero_optimizer<Stage, ...>: Stage must be 0, 1, 2 or 3 or a policy modelling trident::zero::zero_stage: "
                "number, shards_optimizer_state, shards_gradients, shards_parameters, each implying the one before "
                "(parallel/data/stage.hpp)");
  // Said here in words, before any member uses Opt or Precision and fails deep inside.
  static_assert(optim::optimizer<Opt>,
                "zero_optimizer<Stage, Opt, ...>: Opt must model trident::optim::optimizer: a nested `options` type, an "
                "`opt` member of it, `static constexpr std::size_t state_count`, and a const step(params, grads, state, "
                "step_number, multiplier[, working]) for float, fp16 and bf16 gradients (optim/optimizers.hpp)");
  static_assert(precision_policy<Precision>,
                "zero_optimizer<Stage, Opt, Comm, Precision>: Precision must model trident::precision_policy: half_type "
                "(float, fp16 or bf16), scaler_type (a loss_scaler) and has_master, e.g. trident::mixed_precision<bf16>");
  static_assert(requires { sizeof(engine<typename Comm::space>); },
                "zero_optimizer: no engine for this communicator's memory space; for cuda_space (nccl_comm) include "
                "<trident/parallel/data/cuda/zero_engine.cuh> (compiled by nvcc)");

 public:
  using space = typename Comm::space;
  using half_type = typename Precision::half_type;
  using scaler_type = typename Precision::scaler_type;
  //! The stage's policy (parallel/data/stages/) and its number.
  using stage_type = policy;
  static constexpr int stage = policy::number;
  static constexpr bool has_master = Precision::has_master;

  zero_optimizer(Comm& dp, const model_spec& spec, Opt optimizer, zero_options options = {}, scaler_type scaler = {})
      : zero_optimizer(dp, nullptr, spec, std::move(optimizer), std::move(options), scaler) {}

  //! The same for a model split over a model-parallel group as well (the tensor axis of a
  //! process_grid): `dp` holds the ranks with the same part of the model, `model_parallel` the
  //! ranks holding the other parts. The model_spec is this rank's part (local shapes), each
  //! tensor marked a shard or a replica (model_copy); the global gradient norm sums every
  //! shard over the model-parallel group and counts each replica once (Megatron-LM's clipping),
  //! and the skip-on-overflow decision is the whole grid's: one more all-reduce of three
  //! doubles per step, over `model_parallel`. Every rank of the grid must call step() together.
  //!
  //!   trident::process_grid grid(world, /*tensor=*/2, /*pipeline=*/1);
  //!   zero_optimizer<1, optim::adamw, local_comm> zero(grid.data(), grid.tensor(), spec, adamw, options);
  zero_optimizer(Comm& dp, Comm& model_parallel, const model_spec& spec, Opt optimizer, zero_options options = {},
                 scaler_type scaler = {})
      : zero_optimizer(dp, &model_parallel, spec, std::move(optimizer), std::move(options), scaler) {}

 private:
  zero_optimizer(Comm& dp, Comm* model_parallel, const model_spec& spec, Opt optimizer, zero_options options, scaler_type scaler)
      : comm_(&dp), model_parallel_(model_parallel), opt_(std::move(optimizer)), options_(validated(std::move(options))),
        scaler_(scaler),
        layout_(spec, dp.size(), options_.bucket_bytes / sizeof(half_type), options_.first_bucket_bytes / sizeof(half_type)),
        rank_(dp.rank()) {
    check_hyperparameters(1, "zero_optimizer");
    const std::size_t full = layout_.full_size(), shard = layout_.shard_size();
    if constexpr (!policy::shards_parameters) working_ = zeroed<half_type>(full, mem_category::parameters);
    else working_ = zeroed<half_type>(shard, mem_category::parameters);
    grads_ = zeroed<half_type>(!policy::shards_gradients ? full : shard, mem_category::gradients);
    if (offloaded()) {
      make_store();
    } else {
      if constexpr (has_master) master_ = zeroed<float>(!policy::shards_optimizer_state ? full : shard, mem_category::parameters);
      for (auto& s : states_) s = zeroed<float>(!policy::shards_optimizer_state ? full : shard, mem_category::optimizer_state);
    }
    // step()'s all-gather of every rank's report, charged to the ledger current now.
    reports_ = buffer<double, space>(report_fields * static_cast<std::size_t>(dp.size()), mem_category::communication);
    // The gradient statistics of step(): a slot per counted range of this rank's pieces (one
    // per bucket, unless replicas are left out) and the engine's scratch for the largest,
    // allocated once (on CUDA a step allocates nothing for them, nor waits per bucket).
    stat_ranges_ = counted_ranges(spec);
    bucket_sums_ = buffer<double, space>(stat_ranges_.size(), mem_category::communication);
    std::size_t scratch = 0;
    for (const auto& r : stat_ranges_) scratch = std::max(scratch, engine<space>::stats_scratch(r.length));
    stats_scratch_ = buffer<double, space>(scratch, mem_category::communication);
    deferred_state_ = zeroed<double>(deferred_reports + report_fields * static_cast<std::size_t>(dp.size()),
                                     mem_category::communication);
    if (model_parallel_ != nullptr) {
      model_report_ = buffer<double, space>(4, mem_category::communication);
      check_model_parallel_group();
    }
    const std::size_t nb = layout_.buckets().size();
    layer_ready_.assign(static_cast<std::size_t>(layout_.layers()), false);
    with_tensors_.assign(nb, 0);
    for (int l = 0; l < layout_.layers(); ++l)
      if (layout_.layer_elements(l) > 0) ++with_tensors_[layout_.bucket_of_layer(l)];
    waiting_ = with_tensors_;
    launched_.assign(nb, false);
    synced_.assign(nb, false);
    bucket_grads_.resize(nb);
    bucket_live_.assign(nb, false);
    stale_fingerprint_.resize(nb);
    reduced_fingerprint_.resize(nb);
    gathered_.resize(nb);
    is_gathered_.assign(nb, false);
    layer_released_.assign(static_cast<std::size_t>(layout_.layers()), false);
    released_.assign(nb, 0);
    pending_gather_.resize(nb);
  }

 public:
  zero_optimizer(const zero_optimizer&) = delete;
  zero_optimizer& operator=(const zero_optimizer&) = delete;
  ~zero_optimizer() {
    await_holds();  // an asynchronous checkpoint may still be copying our state
    // Communication in flight reads and writes our buffers: wait for all of it, even past a
    // failure, before they go. The destructor cannot throw, so a failure is reported rather than
    // lost (call finish() first to get it as an exception).
    for (auto& p : pending_reduce_)
      if (p.request) wait_in_destructor(*p.request);
    for (auto& g : pending_gather_)
      if (g) wait_in_destructor(*g);
  }

  const flat_layout& layout() const noexcept { return layout_; }
  const zero_options& options() const noexcept { return options_; }
  float loss_scale() const noexcept { return static_cast<float>(scaler_.scale()); }
  //! Optimizer steps applied (after a step_async(): as of the last last_step()).
  std::int64_t steps_taken() const noexcept { return step_count_; }

  //! A tensor resolved once: parameters(h) and gradients(h) then index an array instead of
  //! looking a name up. Valid for this optimizer only.
  //!
  //!   const auto fc1 = zero.handle("fc1.weight");
  //!   for (...) { auto w = zero.parameters(fc1); ... auto g = zero.gradients(fc1); ... }
  tensor_handle handle(const std::string& name) const { return layout_.handle(name, "handle"); }

  // ---- parameters ----------------------------------------------------------------------------

  //! Sets a parameter from its full value (every rank passes the same values; each keeps what its
  //! stage keeps).
  void set_parameter(const std::string& name, std::span<const float> values) {
    await_holds();
    const auto& p = layout_.find(name);
    TRIDENT_EXPECT(values.size() == p.numel, "set_parameter(", name, "): got ", values.size(), " values; expected ", p.numel);
    std::vector<half_type> halves(p.numel);
    for (std::size_t j = 0; j < p.numel; ++j) halves[j] = static_cast<half_type>(values[j]);
    if constexpr (!policy::shards_parameters) upload(working_, p.offset, halves.data(), p.numel);
    if constexpr (has_master && !policy::shards_optimizer_state) upload(master_, p.offset, values.data(), p.numel);
    // The part of the tensor in this rank's piece of its bucket (a tensor never spans buckets).
    const std::size_t piece = layout_.piece_size(p.bucket);
    const std::size_t begin = layout_.piece_begin(p.bucket, rank_);
    const std::size_t lo = std::max(p.offset, begin), hi = std::min(p.offset + p.numel, begin + piece);
    if (lo < hi) {
      const std::size_t local = layout_.buckets()[p.bucket].shard_begin + (lo - begin);
      if constexpr (policy::shards_parameters) upload(working_, local, halves.data() + (lo - p.offset), hi - lo);
      if constexpr (has_master && policy::shards_optimizer_state) {
        if (offloaded()) {
          with_piece(p.bucket, true, [&](float* const* f) {
            std::copy(values.data() + (lo - p.offset), values.data() + (hi - p.offset), f[0] + (local - layout_.buckets()[p.bucket].shard_begin));
          });
        } else {
          upload(master_, local, values.data() + (lo - p.offset), hi - lo);
        }
      }
    }
    invalidate_gathered();
  }

  //! The full fp32 value of a parameter (the master weights where there are any): collective, as
  //! it gathers the shards.
  std::vector<float> parameter(const std::string& name) {
    const auto all = full_master();
    const auto& p = layout_.find(name);
    return std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(p.offset),
                              all.begin() + static_cast<std::ptrdiff_t>(p.offset + p.numel));
  }

  //! All parameters in fp32, in layout order (padding included): collective.
  std::vector<float> full_master() {
    if constexpr (!policy::shards_optimizer_state) {
      comm_->synchronize();
      return to_vector(master_or_working_buffer());
    } else {
      std::vector<float> full(layout_.full_size());
      for (std::size_t b = 0; b < layout_.buckets().size(); ++b) {
        const auto& k = layout_.buckets()[b];
        const std::size_t piece = layout_.piece_size(b);
        const std::size_t at = has_master || policy::shards_parameters ? k.shard_begin : layout_.piece_begin(b, rank_);
        buffer<float, space> whole(k.size, mem_category::other);
        if (has_master && offloaded()) {
          buffer<float, space> mine(piece, mem_category::other);
          with_piece(b, false, [&](float* const* f) { copy_within(mine.data(), f[0], piece); });
          comm_->all_gather(space_span<const float, space>(mine.data(), piece), whole);
        } else {
          comm_->all_gather(space_span<const float, space>(master_or_working_buffer().data() + at, piece), whole);
        }
        comm_->synchronize();
        const auto host = to_vector(whole);
        std::copy(host.begin(), host.end(), full.begin() + static_cast<std::ptrdiff_t>(k.begin));
      }
      return full;
    }
  }

  //! The working weights of a tensor for forward and backward. Stage 3 gathers its bucket first
  //! (and prefetches the next one); call release(layer) when the layer is done with them.
  space_span<const half_type, space> parameters(tensor_handle h) {
    const auto& p = layout_.at(h, "parameters");
    if constexpr (!policy::shards_parameters) {
      return {working_.data() + p.offset, p.numel};
    } else {
      const std::size_t b = p.bucket;
      guarded("parameters", [&] {
        gather(b);
        prefetch_after(b);
      });
      return {gathered_[b].data() + (p.offset - layout_.buckets()[b].begin), p.numel};
    }
  }
  space_span<const half_type, space> parameters(const std::string& name) { return parameters(layout_.handle(name, "parameters")); }

  //! Stage 3: the layer no longer needs its gathered parameters (no-op in stages 0-2, for a
  //! layer without tensors, and for a layer released again). Release is per layer: the bucket's
  //! gathered memory goes once every layer of it that has tensors has been released since the
  //! bucket was gathered, so a bucket of several layers is gathered once per pass, not once per
  //! layer. (A layer never released keeps its bucket gathered until step().)
  void release(int layer) {
    const std::size_t b = layout_.bucket_of_layer(layer, "release");
    if constexpr (policy::shards_parameters) {
      const auto l = static_cast<std::size_t>(layer);
      if (layout_.layer_elements(layer) == 0 || persistent(b) || !is_gathered_[b] || layer_released_[l]) return;
      layer_released_[l] = true;
      if (++released_[b] == with_tensors_[b]) guarded("release", [&] { drop_gathered(b); });
    } else {
      (void)b;
    }
  }

  // ---- gradients ----------------------------------------------------------------------------

  //! Where backward accumulates (+=) the gradient of a tensor. Stages 0-1: the full gradient
  //! buffer; stages 2-3: the bucket's communication buffer, zeroed on first use in a micro-batch.
  space_span<half_type, space> gradients(tensor_handle h) {
    const auto& p = layout_.at(h, "gradients");
    // A new micro-batch must not write into gradients that are still being reduced.
    for (const auto& q : pending_reduce_)
      if (q.bucket == p.bucket) {
        guarded("gradients", [&] { finish_reductions(); });
        break;
      }
    if constexpr (!policy::shards_gradients) {
      return {grads_.data() + p.offset, p.numel};
    } else {
      auto& g = live_bucket(p.bucket);
      return {g.data() + (p.offset - layout_.buckets()[p.bucket].begin), p.numel};
    }
  }
  space_span<half_type, space> gradients(const std::string& name) { return gradients(layout_.handle(name, "gradients")); }

  //! Stages 0-1: whether this micro-batch's gradients are reduced (false for all but the last
  //! micro-batch of an accumulation: gradients then accumulate locally, as with DDP's no_sync).
  void set_gradient_sync(bool sync) {
    TRIDENT_EXPECT(!policy::shards_gradients || sync, "set_gradient_sync(false): stages 2 and 3 keep only a shard of the gradients, so "
                   "they reduce every micro-batch");
    sync_ = sync;
  }

  //! Each bucket's gradients go through `reducer` instead of the plain all-reduce (stages 0-1) or
  //! reduce-scatter (stages 2-3, which reduce the whole bucket through it and keep their piece):
  //! compress::cast<bf16>, compress::powersgd, compress::onebit (compress/) or any type with
  //! all_reduce(comm, compress::bucket_view) that leaves the same values on every rank. Called
  //! synchronously, once per bucket per reduction, on every rank; the reducer keeps its state
  //! (error feedback, warm starts) per bucket, so give each optimizer its own. Call it on every
  //! rank, between steps; nullptr goes back to the plain reduction.
  //!
  //!   auto powersgd = std::make_shared<trident::compress::powersgd>(trident::compress::powersgd_options{.rank = 4});
  //!   zero.reduce_gradients_with(powersgd);
  template <class R>
    requires compress::gradient_reducer<R, Comm, half_type>
  void reduce_gradients_with(std::shared_ptr<R> reducer) {
    TRIDENT_EXPECT(pending_reduce_.empty(), "reduce_gradients_with: reductions are in flight; call it between steps");
    if (!reducer) {
      reducer_ = nullptr;
      reducer_skipped_ = nullptr;
      return;
    }
    if (bucket_tensors_.empty()) {
      bucket_tensors_.resize(layout_.buckets().size());
      for (std::size_t i = 0; i < layout_.tensors(); ++i) {
        const auto& p = layout_.at_index(i);
        const auto& t = layout_.spec_at(i);
        const std::size_t rows = t.shape.empty() ? 1 : t.shape[0];
        bucket_tensors_[p.bucket].push_back({t.name, p.offset - layout_.buckets()[p.bucket].begin, rows, t.numel / rows});
      }
    }
    if constexpr (compress::stateful_reducer<R, Comm>) reducer_skipped_ = [r = reducer](Comm& comm) { r->step_skipped(comm); };
    else reducer_skipped_ = nullptr;
    reducer_ = [r = std::move(reducer)](Comm& comm, const compress::bucket_view<half_type, space>& b) { r->all_reduce(comm, b); };
  }

  //! The gradients of `layer` are complete for this micro-batch: call it once per layer and
  //! micro-batch. When every layer of a bucket is ready its reduction starts, asynchronously.
  //! A layer without tensors has nothing to reduce: the call is accepted and does nothing.
  void grad_ready(int layer) {
    const std::size_t b = layout_.bucket_of_layer(layer, "grad_ready");
    if (layout_.layer_elements(layer) == 0) return;
    // Checked before anything is queued: a second reduction of the same bucket would apply its
    // gradients twice (stages 0-1) or reduce a buffer that is freed under it (stages 2-3).
    if (layer_ready_[static_cast<std::size_t>(layer)]) throw usage_error(already_ready(layer, b));
    layer_ready_[static_cast<std::size_t>(layer)] = true;
    if (--waiting_[b] > 0) return;
    if (!sync_) {  // stages 0-1 without sync: the micro-batch accumulates locally, the next one starts afresh
      reset_bucket(b);
      return;
    }
    // The layers stay marked until the reduction finishes (stages 2-3) or the step (stages 0-1).
    launched_[b] = true;
    synced_[b] = true;
    guarded("grad_ready", [&] { launch_reduction(b); });
  }

  //! Waits for every reduction and gather in flight, rethrowing the first failure; what it had
  //! not waited for yet stays in flight, so call it again until it returns. step() does it
  //! itself. Call it before an optimizer with communication in flight is destroyed (e.g. after
  //! an exception between grad_ready() and step()) to see such failures as exceptions.
  void finish() {
    guarded("finish", [&] {
      finish_reductions();
      for (std::size_t b = 0; b < pending_gather_.size(); ++b) wait_gather(b);
    });
  }

  //! Waits for the reductions, then (collectively) checks for overflow, clips, updates this
  //! rank's shard and all-gathers the result. Every layer must have been marked ready.
  step_result step() {
    const trace_span span("optimizer", "ZeRO step");
    if (async_pending_) last_step();  // the step count is on the device until then
    check_hyperparameters(step_count_ + 1, "step");
    if (store_) {
      store_->verify();  // a damaged file is an error before anything changes
      // The first pieces come in while the reductions finish and the step decides.
      if (whole_.empty()) store_->begin_pass(pass_order_);
    }
    check_every_layer_ready("step");
    guarded("step", [&] { finish_reductions(); });
    check_gradients_untouched();

    // This rank's report (queue_report), then every rank's, in one all-gather, read back once:
    // the step's one host wait.
    const float unscale = queue_report();
    const auto reports = guarded("step", [&] { return exchange_reports(); });
    double norm_squared = 0;
    bool overflow = false;
    for (std::size_t r = 0; r < static_cast<std::size_t>(comm_->size()); ++r) {
      norm_squared += reports[r * report_fields + 0];  // in rank order: the same sum on every rank
      overflow = overflow || reports[r * report_fields + 1] != 0;
    }
    if (model_parallel_ != nullptr) agree_across_model(reports, norm_squared, overflow);
    check_reports(reports);  // the same usage_error on every rank if any rank misbehaved
    const double norm = std::sqrt(norm_squared);
    // A skipped step's gradients must not live on in a reducer's state (error feedback, warm
    // start, momentum): one inf there would overflow every later step. Before the scaler, which
    // may throw at its minimum scale.
    if (overflow && reducer_skipped_) guarded("step", [&] { reducer_skipped_(*comm_); });
    const bool applied = scaler_.update(overflow);
    await_holds();  // the state changes from here: an asynchronous checkpoint must have copied it

    if (applied) {
      ++step_count_;
      device_count_stale_ = true;
      float multiplier = unscale;
      if (options_.max_grad_norm > 0) multiplier *= optim::clip_multiplier(norm, options_.max_grad_norm);
      auto in_memory = [&](std::size_t param_at, const half_type* grads, std::size_t state_at, std::size_t n, std::size_t working_at) {
        update(param_at, grads, state_at, n, multiplier, working_at);
      };
      if constexpr (policy::shards_optimizer_state) {
        if (offloaded()) offloaded_update(multiplier);
        else update_pieces(in_memory);
      } else {
        update_pieces(in_memory);
      }
      gather_parameters();
      invalidate_gathered();
    } else if (store_) {
      store_->end_pass();  // skipped: the pieces read ahead go back unchanged
    }
    zero_grad();
    last_gathered_.reset();  // each step's prefetching follows that step's order alone
    return {applied, norm, static_cast<float>(scaler_.scale())};
  }

  //! step() without its host wait, for a step that can be captured into a CUDA graph: the
  //! overflow check, the clipping factor, the step count and the skip decision are computed in
  //! the optimizer's memory space, on the communicator's stream, from the same all-gathered
  //! reports, so that nothing is read back, allocated or waited for (on the thread backend and
  //! MPI the work runs at once, as step()'s does). The result is step()'s, bit for bit on host
  //! memory; on a device the optimizer's scalars are computed there (optim::detail::visit_adam).
  //! last_step() waits for it and says what it did; step() and checkpoint_counters() need it
  //! called first (step() calls it itself).
  //!
  //! Needs what decides on the host to be absent: a loss scale that does not change (full
  //! precision, bf16, or a static_loss_scaler: a dynamic scaler's scale is what backward
  //! multiplies by, on the host), no model-parallel group, no offload, no checked mode
  //! (zero_options::check_usage reads fingerprints), and an optimizer whose update a kernel can
  //! build (optim::deferrable_optimizer). A misuse found by the ranks' reports (gradients
  //! written after grad_ready, bucket collectives in different orders) skips the step on every
  //! rank and is thrown by the next last_step(), on every rank.
  //!
  //!   zero.finish();                                    // the reductions, outside the graph
  //!   cudaStreamBeginCapture(comm.stream(), cudaStreamCaptureModeGlobal);
  //!   zero.step_async();
  //!   cudaStreamEndCapture(comm.stream(), &graph);      // fails if step_async waited or allocated
  //!   ... cudaGraphLaunch(exec, comm.stream()); auto r = zero.last_step();
  void step_async()
    requires optim::deferrable_optimizer<Opt>
  {
    const trace_span span("optimizer", "ZeRO step (deferred)");
    check_deferrable("step_async");
    check_hyperparameters(step_count_ + 1, "step_async");
    check_every_layer_ready("step_async");
    guarded("step_async", [&] { finish_reductions(); });
    check_gradients_untouched();

    const float unscale = queue_report();
    if (device_count_stale_) {  // step() or restore_counters() moved the count on the host
      engine<space>::store(*comm_, deferred_state_.data() + optim::deferred_decision::step_number,
                           {static_cast<double>(step_count_), 0.0, 0.0, 0.0}, 1);
      device_count_stale_ = false;
    }
    // The rest of this rank's report, as kernel arguments rather than a copy from the host (a
    // graph replays a kernel's arguments; a copy from pageable memory cannot be captured).
    engine<space>::store(*comm_, report_of_this_rank() + 2, known_report_fields(), report_fields - 2);
    guarded("step_async", [&] {
      bucket_collective(no_bucket, false, false, [&] {
        const std::size_t at = static_cast<std::size_t>(rank_) * report_fields;
        comm_->all_gather(space_span<const double, space>(reports_.data() + at, report_fields), reports_);
      });
    });
    // What the reports carry is sent: the next step records anew.
    collectives_ = 0;
    digest_ = fnv_basis;
    sequence_.clear();
    problem_.reset();
    engine<space>::decide(*comm_, reports_.data(), static_cast<std::size_t>(comm_->size()), report_fields, unscale,
                          options_.max_grad_norm, deferred_state_.data());
    await_holds();

    const double* decision = deferred_state_.data();
    update_pieces([&](std::size_t param_at, const half_type* grads, std::size_t state_at, std::size_t n, std::size_t working_at) {
      std::array<float*, Opt::state_count> state;
      for (std::size_t s = 0; s < Opt::state_count; ++s) state[s] = states_[s].data() + state_at;
      half_type* working = nullptr;
      if constexpr (has_master) working = working_.data() + working_at;
      engine<space>::step_deferred(*comm_, opt_, master_or_working_buffer().data() + param_at, grads, state, n, decision,
                                   working);
    });
    gather_parameters();  // a skipped step gathers the unchanged pieces
    invalidate_gathered();
    zero_grad();
    last_gathered_.reset();
    async_pending_ = true;
  }

  //! Waits for the last step_async() and says what it did (step()'s result); then the host's
  //! step count is the device's again. Throws the misuse that made the ranks skip a deferred
  //! step, on every rank, once. Without a pending step_async(): applied = true, the norm of the
  //! last deferred step (0 before any). A captured step_async() is pending from its capture:
  //! call last_step() after launching the graph, not before.
  step_result last_step() {
    comm_->synchronize();
    const auto state = to_vector(deferred_state_);
    using dd = optim::deferred_decision;
    const bool was_pending = async_pending_;
    // Only a pending step's count is news: after step() the host's is ahead of the device's.
    if (was_pending) step_count_ = static_cast<std::int64_t>(state[dd::step_number]);
    async_pending_ = false;
    if (state[deferred_error] != 0) {
      engine<space>::store(*comm_, deferred_state_.data() + deferred_error, {0.0, 0.0, 0.0, 0.0}, 1);
      comm_->synchronize();
      throw_deferred_misuse(std::vector<double>(state.begin() + deferred_reports, state.end()));
    }
    return {!was_pending || state[dd::apply] != 0, state[deferred_norm], static_cast<float>(scaler_.scale())};
  }

  // ---- checkpoints (checkpoint/zero.hpp) ------------------------------------------------------

  //! A run of one tensor's elements [begin, begin + count) that sits at element `at` of a
  //! state_field's buffer.
  struct state_range {
    std::size_t tensor;  // index in the model_spec
    std::size_t begin;
    std::size_t count;
    std::size_t at;
  };
  //! One kind of per-element state this rank keeps, for checkpoints: "parameters" (the working
  //! weights, half_type), "master" (the fp32 master weights, with a master copy) and the
  //! optimizer's states ("state0", "state1", ..., in the order of Opt's step()). `held`: every
  //! part of a tensor kept here, which a load must fill. `owned`: this rank's piece of every
  //! bucket (in every stage), which a save writes, so the ranks together write each element
  //! once. `data` is in this optimizer's memory space.
  struct state_field {
    std::string name;
    dtype type;
    void* data;
    std::vector<state_range> held, owned;
  };
  //! The fields above (waits for reductions in flight). Call between steps; after writing into
  //! them, restore_counters() makes stage 3 gather anew.
  //!
  //!   for (auto& f : zero.state_fields()) for (auto& r : f.owned) write(f.name, layout.name_at(r.tensor), r, f.data);
  std::vector<state_field> state_fields() {
    guarded("state_fields", [&] { finish_reductions(); });
    await_holds();  // the caller may write into them
    std::vector<state_field> out;
    out.push_back({"parameters", dtype_of<half_type>, working_.data(), ranges(!policy::shards_parameters, false),
                   ranges(!policy::shards_parameters, true)});
    constexpr bool full_states = !policy::shards_optimizer_state;
    if constexpr (has_master) out.push_back({"master", dtype::float32, field_data(0), ranges(full_states, false), ranges(full_states, true)});
    for (std::size_t i = 0; i < Opt::state_count; ++i)
      out.push_back({detail::concat("state", i), dtype::float32, field_data(master_fields + i), ranges(full_states, false),
                     ranges(full_states, true)});
    return out;
  }
  //! The counters a resumed run must continue from: optimizer steps applied and the loss
  //! scaler's state.
  struct counters {
    std::int64_t steps;
    loss_scaler_state scaler;
  };
  counters checkpoint_counters() const
    requires restorable_loss_scaler<scaler_type>
  {
    TRIDENT_EXPECT(!async_pending_, "checkpoint_counters on rank ", rank_, ": a step_async() is pending and the step count is "
                   "on the device; call last_step() first");
    return {step_count_, scaler_.state()};
  }
  //! Restores them (every rank alike), after a load has filled state_fields(); gradients are
  //! cleared and stage 3 gathers anew.
  void restore_counters(const counters& c)
    requires restorable_loss_scaler<scaler_type>
  {
    TRIDENT_EXPECT(c.steps >= 0, "restore_counters: a step count of ", c.steps, "; expected >= 0");
    if (async_pending_) last_step();
    await_holds();
    scaler_.restore(c.scaler);
    step_count_ = c.steps;
    device_count_stale_ = true;
    invalidate_gathered();
    zero_grad();
  }

  //! Makes the next change of the optimizer's state wait until `ready` (step()'s update,
  //! set_parameter(), state_fields(), restore_counters(), the destructor): an asynchronous
  //! checkpoint copies the state in the background meanwhile, so training stalls only where
  //! the next update comes before the copy is done. A failure behind `ready` is not raised
  //! here (its owner raises it).
  //!
  //!   zero.hold_state(copied.get_future().share());   // what checkpoint::save_async does
  void hold_state(std::shared_future<void> ready) { holds_.push_back(std::move(ready)); }

  //! Clears the gradients, after waiting for reductions in flight (step() does this itself).
  void zero_grad() {
    guarded("zero_grad", [&] { finish_reductions(); });  // they write into the buffers cleared here
    clear(grads_);
    for (std::size_t b = 0; b < bucket_grads_.size(); ++b) {
      auto& g = bucket_grads_[b];
      bucket_live_[b] = false;
      if (!options_.check_usage || g.size() == 0) {
        give_buffer(g);
        stale_fingerprint_[b].reset();
      } else {
        // Checked mode keeps the buffer that earlier spans point into, so a late write through
        // one lands here, not in freed memory, and is caught when the bucket is used again.
        clear(g);
        stale_fingerprint_[b] = fingerprint(g.data(), g.size());
      }
    }
    std::fill(layer_ready_.begin(), layer_ready_.end(), false);
    waiting_ = with_tensors_;
    std::fill(launched_.begin(), launched_.end(), false);
    std::fill(synced_.begin(), synced_.end(), false);
    for (auto& f : reduced_fingerprint_) f.reset();
    problem_.reset();
  }

 private:
  using request_type = decltype(std::declval<Comm&>().all_reduce_async(std::declval<space_span<half_type, space>>(), reduce_op::sum));
  struct pending {
    std::size_t bucket;
    buffer<half_type, space> copy;  // checked mode: the private copy being reduced
    std::uint64_t fingerprint;      // checked mode: the user's gradients when the reduction started
    std::optional<request_type> request;  // none: a gradient reducer finished it at once
  };

  // A misuse found on this rank before step() (checked mode), reported by step() on every rank.
  enum class misuse : int { none = 0, written_after_ready = 1, written_not_reduced = 2 };
  struct problem {
    misuse kind;
    std::size_t bucket;
  };

  // What each rank contributes to step()'s all-gather.
  static constexpr std::size_t report_fields = 6;  // sum of squares, non-finite, collectives, digest, misuse, bucket
  // step_async()'s state in the optimizer's memory space: optim::deferred_decision's fields
  // (apply, step count, multiplier), the norm, a sticky misuse flag and the reports that raised it.
  static constexpr std::size_t deferred_norm = optim::deferred_decision::size;
  static constexpr std::size_t deferred_error = deferred_norm + 1;
  static constexpr std::size_t deferred_reports = deferred_error + 1;
  // Bucket collectives remembered one by one to name the first disagreement (the digest covers all).
  static constexpr std::size_t recorded_collectives = 1024;
  static constexpr std::uint64_t fnv_basis = 1469598103934665603ull;

  static zero_options validated(zero_options o) {
    TRIDENT_EXPECT(!std::isnan(o.max_grad_norm) && o.max_grad_norm >= 0, "zero_optimizer: zero_options::max_grad_norm = ",
                   o.max_grad_norm, "; expected 0 (no clipping) or a positive norm");
    TRIDENT_EXPECT(o.bucket_bytes >= sizeof(half_type), "zero_optimizer: zero_options::bucket_bytes = ", o.bucket_bytes,
                   "; expected at least one element (", sizeof(half_type), " bytes)");
    TRIDENT_EXPECT(o.first_bucket_bytes >= sizeof(half_type), "zero_optimizer: zero_options::first_bucket_bytes = ",
                   o.first_bucket_bytes, "; expected at least one element (", sizeof(half_type), " bytes)");
    return o;
  }

  // Where each tensor's elements sit in a buffer of full (flat layout) or shard storage: all of
  // the tensor, or its part in this rank's piece of its bucket (`owned_only`, and always for a
  // shard, which holds nothing else).
  std::vector<state_range> ranges(bool full, bool owned_only) const {
    std::vector<state_range> out;
    for (std::size_t t = 0; t < layout_.tensors(); ++t) {
      const auto& p = layout_.at_index(t);
      if (full && !owned_only) {
        if (p.numel != 0) out.push_back({t, 0, p.numel, p.offset});
        continue;
      }
      const std::size_t begin = layout_.piece_begin(p.bucket, rank_), piece = layout_.piece_size(p.bucket);
      const std::size_t lo = std::max(p.offset, begin), hi = std::min(p.offset + p.numel, begin + piece);
      if (lo >= hi) continue;
      const std::size_t at = full ? lo : layout_.buckets()[p.bucket].shard_begin + (lo - begin);
      out.push_back({t, lo - p.offset, hi - lo, at});
    }
    return out;
  }

  template <class T>
  buffer<T, space> zeroed(std::size_t n, mem_category c) {
    buffer<T, space> b(n, c);
    clear(b);
    return b;
  }
  // Memory work goes through the engine, ordered with the communicator's work: a pooled bucket
  // buffer is cleared or filled after whatever last used it, with no host wait (on CUDA a
  // plain cudaMemset/cudaMemcpy would run on the legacy stream, unordered with a non-blocking one).
  template <class T>
  void clear(buffer<T, space>& b) {
    engine<space>::fill_zero(*comm_, b.data(), b.size() * sizeof(T));
  }
  template <class T>
  void copy_within(T* dst, const T* src, std::size_t n) {
    engine<space>::copy(*comm_, dst, src, n * sizeof(T));
  }

  // Bad hyperparameters (a NaN or negative lr, betas out of range) are a usage_error on every
  // rank at construction and at the start of step(), before the scaler, the step count or any
  // parameter changes; a schedule's lr is checked for the step about to be taken. Optimizers
  // without visit_update check in their own step().
  void check_hyperparameters(std::int64_t t, const char* call) const {
    if constexpr (optim::elementwise_optimizer<Opt>) {
      try {
        opt_.visit_update(t, [](const auto&) {});
      } catch (const usage_error& e) {
        throw usage_error(detail::concat(call, " on rank ", rank_, " (step ", t, "): ", e.message()), e.operation(), e.where());
      }
    }
  }

  template <class T>
  void upload(buffer<T, space>& dst, std::size_t at, const T* host, std::size_t n) {
    engine<space>::copy(*comm_, dst.data() + at, host, n * sizeof(T));
  }

  // ---- offload (offload/store.hpp) -------------------------------------------------------------

  static constexpr std::size_t master_fields = has_master ? 1 : 0;  // the store's fields: [master,] states...
  // Spelt without `i < master_fields`, which nvcc flags as a pointless unsigned comparison when
  // there is no master copy.
  static constexpr bool is_master_field(std::size_t i) noexcept { return has_master && i == 0; }

  bool offloaded() const noexcept { return options_.offload && options_.offload->where() != offload::tier::memory; }

  void make_store() {
    TRIDENT_EXPECT(policy::shards_optimizer_state, "zero_optimizer: offload of the optimizer state to the ",
                   offload::name_of(options_.offload->where()), " tier needs ZeRO stage 1, 2 or 3 (stage ", stage,
                   " keeps every state on every rank)");
    offload::store_request r;
    if constexpr (has_master) r.fields.push_back(mem_category::parameters);
    for (std::size_t s = 0; s < Opt::state_count; ++s) r.fields.push_back(mem_category::optimizer_state);
    for (std::size_t b = 0; b < layout_.buckets().size(); ++b) r.pieces.push_back({layout_.buckets()[b].shard_begin, layout_.piece_size(b)});
    r.tensors.resize(layout_.buckets().size());
    for (std::size_t i = 0; i < layout_.tensors(); ++i) r.tensors[layout_.at_index(i).bucket].push_back(layout_.name_at(i));
    r.total = layout_.shard_size();
    r.rank = rank_;
    r.for_device = !space::host_accessible;
    store_ = options_.offload->make(r);
    pass_order_.resize(layout_.buckets().size());
    for (std::size_t b = 0; b < pass_order_.size(); ++b) pass_order_[b] = b;
    if constexpr (!space::host_accessible) {
      // A device optimizer's pieces pass through pinned host memory: two of each, so that one
      // bucket's gradients come down while the one before is updated.
      std::size_t largest = 0;
      for (std::size_t b = 0; b < layout_.buckets().size(); ++b) largest = std::max(largest, layout_.piece_size(b));
      for (auto& g : grad_stage_) g = buffer<half_type, pinned_host_space>(largest, mem_category::communication);
      for (auto& w : work_stage_) w = buffer<half_type, pinned_host_space>(largest, mem_category::communication);
    }
  }

  // Calls f(fields of bucket b's piece) outside a step: the whole copy handed out by
  // state_fields() when there is one, else the store's piece (written back if `modified`).
  template <class F>
  void with_piece(std::size_t b, bool modified, F&& f) {
    std::vector<float*> fields(master_fields + Opt::state_count);
    const std::size_t at = layout_.buckets()[b].shard_begin;
    if (!whole_.empty() || store_->resident(0) != nullptr) {
      for (std::size_t i = 0; i < fields.size(); ++i) fields[i] = field_data(i) + at;
      f(fields.data());
      return;
    }
    const std::size_t order[] = {b};
    store_->begin_pass(order);
    float* const* piece = store_->acquire(b);
    f(piece);
    store_->release(b, modified);
    store_->end_pass();
  }

  // Field i of the state, whole, in this optimizer's memory: in place, or, when the tier keeps
  // it in files, a copy of every field read on first use and written back at the next step
  // (state_fields() hands these to checkpoints, which read or fill them in place).
  float* field_data(std::size_t i) {
    if (!offloaded()) return is_master_field(i) ? master_or_working_buffer().data() : states_[i - master_fields].data();
    if (float* p = store_->resident(i)) return p;
    if (whole_.empty()) {
      const std::size_t n = master_fields + Opt::state_count;
      for (std::size_t j = 0; j < n; ++j)
        whole_.emplace_back(layout_.shard_size(), is_master_field(j) ? mem_category::parameters : mem_category::optimizer_state);
      store_->begin_pass(pass_order_);
      for (std::size_t b : pass_order_) {
        float* const* piece = store_->acquire(b);
        const std::size_t at = layout_.buckets()[b].shard_begin, len = layout_.piece_size(b);
        for (std::size_t j = 0; j < n; ++j) std::copy(piece[j], piece[j] + len, whole_[j].data() + at);
        store_->release(b, false);
      }
      store_->end_pass();
    }
    return whole_[i].data();
  }

  // Bucket b's piece of the state from the store (with what state_fields() handed out since
  // the last step written over it: that copy is the truth).
  float* const* acquire_piece(std::size_t b) {
    float* const* f = store_->acquire(b);
    if (!whole_.empty()) {
      const std::size_t at = layout_.buckets()[b].shard_begin, len = layout_.piece_size(b);
      for (std::size_t j = 0; j < master_fields + Opt::state_count; ++j) std::copy(whole_[j].data() + at, whole_[j].data() + at + len, f[j]);
    }
    return f;
  }

  // One pass over the store: bucket b's piece is updated while the store brings in the next
  // and writes back the last. The arithmetic is update()'s, on the host.
  void offloaded_update(float multiplier) {
    if (!whole_.empty()) store_->begin_pass(pass_order_);  // else step() began it
    if constexpr (space::host_accessible) {
      host_offloaded_update(multiplier);
    } else {
      device_offloaded_update(multiplier);
    }
    store_->end_pass();
    whole_.clear();
  }

  void host_offloaded_update(float multiplier) {
    for (std::size_t b : pass_order_) {
      const auto& k = layout_.buckets()[b];
      const std::size_t len = layout_.piece_size(b);
      const std::size_t working_at = !policy::shards_parameters ? layout_.piece_begin(b, rank_) : k.shard_begin;
      float* const* f = acquire_piece(b);
      std::array<float*, Opt::state_count> state;
      for (std::size_t s = 0; s < Opt::state_count; ++s) state[s] = f[master_fields + s];
      half_type* working = nullptr;
      float* params;
      if constexpr (has_master) {
        params = f[0];
        working = working_.data() + working_at;
      } else {
        params = working_.data() + working_at;
      }
      engine<space>::step(*comm_, opt_, params, grad_piece(b), state, len, step_count_, multiplier, working);
      store_->release(b, true);
    }
  }

  // A device optimizer (ZeRO-Offload): bucket b's reduced gradient piece comes down to pinned
  // memory on the communicator's stream, the host step updates the fp32 state in the store and
  // writes the new half parameters to pinned memory, which go back up on the same stream, in
  // order with the all-gather or gathers that read them. Without master weights the device's
  // fp32 parameters themselves come down with the gradients and go back up.
  //
  // Two staging buffers each, and the host waits only for the piece it updates next: the
  // stream runs down(0) down(1) up(0) down(2) up(1) ..., so while the host updates piece i the
  // stream carries up(i-1) and down(i+1), and waiting for down(i) also covers up(i-2), the last
  // reader of the staging buffer that piece i's update writes. down(i+1) overwrites buffers
  // whose last host reader (piece i-1's update) has returned and whose upload is ahead of it on
  // the stream.
  void device_offloaded_update(float multiplier) {
    using device = engine<space>;
    const std::size_t n = pass_order_.size();
    auto working_at = [&](std::size_t b) {
      return !policy::shards_parameters ? layout_.piece_begin(b, rank_) : layout_.buckets()[b].shard_begin;
    };
    std::array<typename device::marker, 2> down_done;
    auto down = [&](std::size_t i) {
      const std::size_t b = pass_order_[i], len = layout_.piece_size(b);
      device::copy(*comm_, grad_stage_[i % 2].data(), grad_piece(b), len * sizeof(half_type));
      if constexpr (!has_master)
        device::copy(*comm_, work_stage_[i % 2].data(), working_.data() + working_at(b), len * sizeof(half_type));
      device::mark(*comm_, down_done[i % 2]);
    };
    if (n != 0) down(0);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t b = pass_order_[i], len = layout_.piece_size(b);
      device::wait_for(down_done[i % 2]);
      if (i + 1 < n) down(i + 1);
      float* const* f = acquire_piece(b);
      std::array<float*, Opt::state_count> state;
      for (std::size_t s = 0; s < Opt::state_count; ++s) state[s] = f[master_fields + s];
      half_type* stage = work_stage_[i % 2].data();
      float* params;
      half_type* working = nullptr;
      if constexpr (has_master) {
        params = f[0];
        working = stage;
      } else {
        params = stage;  // half_type is float without master weights
      }
      engine<host_space>::step(*comm_, opt_, params, grad_stage_[i % 2].data(), state, len, step_count_, multiplier, working);
      store_->release(b, true);
      device::copy(*comm_, working_.data() + working_at(b), stage, len * sizeof(half_type));
    }
  }

  // The fp32 values the optimizer updates: the master copy, or the working weights themselves.
  buffer<float, space>& master_or_working_buffer() {
    if constexpr (has_master) return master_;
    else return working_;
  }
  // This rank's piece of the reduced gradients of bucket b.
  half_type* grad_piece(std::size_t b) {
    if constexpr (!policy::shards_gradients) return grads_.data() + layout_.piece_begin(b, rank_);
    else return grads_.data() + layout_.buckets()[b].shard_begin;
  }

  // The optimizer's update over what this rank owns, in buckets' order: the whole model (stage
  // 0) or each bucket's piece. f(param_at, grads, state_at, n, working_at) as update() takes them.
  template <class F>
  void update_pieces(F&& f) {
    if constexpr (!policy::shards_optimizer_state) {
      f(0, grads_.data(), 0, layout_.full_size(), 0);
    } else {
      for (std::size_t b = 0; b < layout_.buckets().size(); ++b) {
        const auto& k = layout_.buckets()[b];
        const std::size_t working_at = !policy::shards_parameters ? layout_.piece_begin(b, rank_) : k.shard_begin;
        f(has_master ? k.shard_begin : working_at, grad_piece(b), k.shard_begin, layout_.piece_size(b), working_at);
      }
    }
  }

  // Stages 1-2: everyone's new parameters, bucket by bucket, in place.
  void gather_parameters() {
    if constexpr (policy::shards_optimizer_state && !policy::shards_parameters) {
      for (std::size_t b = 0; b < layout_.buckets().size(); ++b) {
        const auto& k = layout_.buckets()[b];
        const std::size_t piece = layout_.piece_size(b);
        space_span<half_type, space> whole(working_.data() + k.begin, k.size);
        comm_->all_gather(space_span<const half_type, space>(working_.data() + layout_.piece_begin(b, rank_), piece), whole);
      }
    }
  }

  void check_every_layer_ready(const char* call) const {
    for (std::size_t b = 0; b < layout_.buckets().size(); ++b) {
      const auto& k = layout_.buckets()[b];
      if (!launched_[b] && waiting_[b] != with_tensors_[b])
        for (int l = k.first_layer; l <= k.last_layer; ++l)
          TRIDENT_EXPECT(!layer_ready_[static_cast<std::size_t>(l)], call, ": layer ", l, " was marked ready but other layers of its bucket (bucket ",
                         b, ", layers ", k.first_layer, "..", k.last_layer, ") were not (call grad_ready for every layer)");
      TRIDENT_EXPECT(synced_[b], call, ": the gradients of layers ", k.first_layer, "..", k.last_layer, " were not reduced: every layer must be "
                     "marked ready (grad_ready) in the last micro-batch, with gradient sync on");
    }
  }

  // Overflow and norm over this rank's pieces, summed in bucket order (the same sum on every
  // stage) into this rank's report where it stands, queued on the communicator's stream.
  // Returns the unscale factor the statistics used.
  float queue_report() {
    const float unscale = static_cast<float>(1.0 / scaler_.scale());
    for (std::size_t i = 0; i < stat_ranges_.size(); ++i) {
      const auto& r = stat_ranges_[i];
      engine<space>::stats_into(*comm_, grad_piece(r.bucket) + r.offset, r.length, unscale, bucket_sums_.data() + i,
                                stats_scratch_.data(), stats_scratch_.size());
    }
    engine<space>::total_into(*comm_, bucket_sums_.data(), bucket_sums_.size(), report_of_this_rank());
    return unscale;
  }

  // What step_async() cannot do without deciding on the host, named.
  void check_deferrable(const char* call) const {
    auto refuse = [&](const char* what) {
      throw usage_error(detail::concat(call, " on rank ", rank_, ": ", what, "; use step(), which decides on the host"));
    };
    if constexpr (!std::is_same_v<scaler_type, static_loss_scaler>)
      refuse("the loss scaler changes its scale (a dynamic scaler: backward multiplies by scale(), read on the host)");
    if (model_parallel_ != nullptr) refuse("a model-parallel group agrees on the overflow and the norm on the host");
    if (store_ || offloaded()) refuse("an offloaded optimizer streams its states through the host");
    if (options_.check_usage) refuse("checked mode (zero_options::check_usage) compares fingerprints on the host");
    if (reducer_) refuse("a gradient reducer (reduce_gradients_with) counts its steps on the host");
    // While the stream is captured, waiting for a reduction or gather in flight (an event query)
    // or reading a bucket back would break the capture with an unhelpful CUDA error: say it here.
    if (engine<space>::capturing(*comm_)) {
      bool in_flight = !pending_reduce_.empty();
      for (const auto& g : pending_gather_) in_flight = in_flight || g.has_value();
      if (in_flight)
        throw usage_error(detail::concat(call, " on rank ", rank_, ": the stream is being captured with reductions or "
                                         "gathers still in flight, which the step would wait for; call finish() before "
                                         "beginning the capture"));
      for (std::size_t b = 0; b < bucket_live_.size(); ++b)
        if (bucket_live_[b])
          throw usage_error(detail::concat(call, " on rank ", rank_, ": the stream is being captured and ", describe_bucket(b),
                                           " began a micro-batch (gradients()) that was never reduced (grad_ready)"));
    }
  }

  // The report's fields after the sum of squares and the overflow flag.
  std::array<double, 4> known_report_fields() const {
    // Integers below 2^53 travel exactly in doubles.
    return {static_cast<double>(collectives_), static_cast<double>(digest_ & ((std::uint64_t{1} << 52) - 1)),
            static_cast<double>(problem_ ? static_cast<int>(problem_->kind) : 0),
            static_cast<double>(problem_ ? problem_->bucket : 0)};
  }

  // A deferred step skipped for a misuse (the reports kept by decide_step): the message step()
  // would have given, without its exchange of the recorded sequences (gone by now).
  [[noreturn]] void throw_deferred_misuse(const std::vector<double>& reports) const {
    const std::size_t n = static_cast<std::size_t>(comm_->size());
    auto field = [&](std::size_t r, std::size_t f) { return reports[r * report_fields + f]; };
    for (std::size_t r = 0; r < n; ++r) {
      const auto kind = static_cast<misuse>(static_cast<int>(field(r, 4)));
      if (kind == misuse::none) continue;
      throw usage_error(detail::concat(
          "last_step: a step_async() was skipped on every rank because on rank ", r, ", gradients of ",
          describe_bucket(static_cast<std::size_t>(field(r, 5))),
          kind == misuse::written_after_ready ? " were written after grad_ready() marked its layers ready"
                                              : " were written after the bucket's last reduction and never reduced",
          ". Nothing was applied"));
    }
    for (std::size_t r = 1; r < n; ++r)
      if (field(r, 2) != field(0, 2) || field(r, 3) != field(0, 3))
        throw usage_error(detail::concat(
            "last_step: a step_async() was skipped on every rank because the ranks issued their bucket collectives in "
            "different orders (rank 0: ", field(0, 2), " collectives, digest ", field(0, 3), "; rank ", r, ": ", field(r, 2),
            ", digest ", field(r, 3), "), so data of one bucket went into another. Nothing was applied"));
    throw usage_error("last_step: a step_async() was skipped on every rank for a misuse its reports no longer show");
  }

  // One optimizer update of n elements: parameters at `param_at` of the master (or working)
  // buffer, states at `state_at`, the half copy written at `working_at` when there is a master.
  void update(std::size_t param_at, const half_type* grads, std::size_t state_at, std::size_t n, float multiplier,
              std::size_t working_at) {
    std::array<float*, Opt::state_count> state;
    for (std::size_t s = 0; s < Opt::state_count; ++s) state[s] = states_[s].data() + state_at;
    half_type* working = nullptr;
    if constexpr (has_master) working = working_.data() + working_at;
    engine<space>::step(*comm_, opt_, master_or_working_buffer().data() + param_at, grads, state, n, step_count_, multiplier,
                        working);
  }

  // ---- layers and buckets -------------------------------------------------------------------

  std::string describe_bucket(std::size_t b) const {
    const auto& k = layout_.buckets()[b];
    return detail::concat("bucket ", b, " of ", layout_.buckets().size(), " (layers ", k.first_layer, "..", k.last_layer, ")");
  }

  std::string already_ready(int layer, std::size_t b) const {
    const std::string head = detail::concat("grad_ready(", layer, "): layer ", layer, " was already marked ready");
    if (!launched_[b]) {
      int missing = -1;
      const auto& k = layout_.buckets()[b];
      for (int l = k.first_layer; l <= k.last_layer && missing < 0; ++l)
        if (layout_.layer_elements(l) > 0 && !layer_ready_[static_cast<std::size_t>(l)]) missing = l;
      return detail::concat(head, " in this micro-batch; its ", describe_bucket(b), " still waits for layer ", missing,
                            ". Expected each layer once per micro-batch");
    }
    if constexpr (!policy::shards_gradients) {
      return detail::concat(head, ", and its ", describe_bucket(b), " reduced, since the last step(). Expected each layer once "
                            "per micro-batch, and stages 0-1 reduce a bucket once per step: call set_gradient_sync(false) "
                            "before every micro-batch but the last");
    } else {
      return detail::concat(head, " in this micro-batch, and the reduction of its ", describe_bucket(b), " is in flight. "
                            "Expected each layer once per micro-batch: the bucket's next micro-batch starts when gradients() "
                            "is asked for one of its tensors");
    }
  }

  // The bucket's micro-batch is over: its layers may be marked ready again.
  void reset_bucket(std::size_t b) {
    const auto& k = layout_.buckets()[b];
    for (int l = k.first_layer; l <= k.last_layer; ++l) layer_ready_[static_cast<std::size_t>(l)] = false;
    waiting_[b] = with_tensors_[b];
    launched_[b] = false;
  }

  // Stages 2-3: the bucket's gradient buffer for the current micro-batch, zeroed on first use.
  buffer<half_type, space>& live_bucket(std::size_t b) {
    auto& g = bucket_grads_[b];
    if (bucket_live_[b]) return g;
    if (stale_fingerprint_[b] && fingerprint(g.data(), g.size()) != *stale_fingerprint_[b])
      note(misuse::written_after_ready, b);  // through a span of an earlier micro-batch
    stale_fingerprint_[b].reset();
    if (g.size() == 0) g = take_buffer(layout_.buckets()[b].size);
    clear(g);
    bucket_live_[b] = true;
    return g;
  }

  // ---- reductions ---------------------------------------------------------------------------

  void launch_reduction(std::size_t b) {
    const auto& k = layout_.buckets()[b];
    const reduce_op op = options_.average ? reduce_op::avg : reduce_op::sum;
    // The user's gradients: stages 0-1 the bucket's region of the gradient buffer (reduced in
    // place), stages 2-3 its communication buffer (reduce-scattered in place into this rank's
    // chunk). Checked mode reduces a private copy instead, so that the user's memory is neither
    // read by the communicator while a late write lands nor overwritten, and can be compared.
    half_type* user = nullptr;
    if constexpr (!policy::shards_gradients) user = grads_.data() + k.begin;
    else user = live_bucket(b).data();
    buffer<half_type, space> copy;
    std::uint64_t print = 0;
    half_type* data = user;
    if (options_.check_usage) {
      copy = buffer<half_type, space>(k.size, mem_category::communication);
      copy_within(copy.data(), user, k.size);
      print = fingerprint(user, k.size);
      data = copy.data();
    }
    space_span<half_type, space> whole(data, k.size);
    if (reducer_) {
      // Every stage reduces the whole bucket through it; stages 2-3 then keep their piece.
      // Its own refusals (options that do not fit the model) are not a disagreement between
      // ranks: every rank refuses alike, so they are passed on with the bucket named.
      try {
        reducer_(*comm_, {b, whole, bucket_tensors_[b], op, step_count_ + 1});
      } catch (const usage_error& e) {
        throw usage_error(detail::concat("grad_ready on rank ", rank_, ": the gradient reducer refused bucket ", b, " of ",
                                         layout_.buckets().size(), ": ", e.message()),
                          e.operation(), e.where());
      }
      pending_reduce_.push_back({b, std::move(copy), print, std::nullopt});
    } else if constexpr (!policy::shards_gradients) {
      auto request = bucket_collective(b, false, true, [&] { return comm_->all_reduce_async(whole, op); });
      pending_reduce_.push_back({b, std::move(copy), print, std::move(request)});
    } else {
      const std::size_t piece = layout_.piece_size(b);
      space_span<half_type, space> mine(data + static_cast<std::size_t>(rank_) * piece, piece);
      auto request = bucket_collective(b, false, true, [&] { return comm_->reduce_scatter_async(whole, mine, op); });
      pending_reduce_.push_back({b, std::move(copy), print, std::move(request)});
    }
    record(b, false);
  }

  void finish_reductions() {
    // An entry leaves the list once waited for; after a failure the rest stay for finish() or
    // the destructor to wait for.
    std::size_t done = 0;
    try {
      for (; done < pending_reduce_.size(); ++done) {
        auto& p = pending_reduce_[done];
        bucket_collective(p.bucket, false, false, [&] {
          if (p.request) p.request->wait();
          complete_reduction(p);
        });
      }
    } catch (...) {
      pending_reduce_.erase(pending_reduce_.begin(), pending_reduce_.begin() + static_cast<std::ptrdiff_t>(done + 1));
      throw;
    }
    pending_reduce_.clear();
  }

  void complete_reduction(pending& p) {
    const std::size_t b = p.bucket;
    const auto& k = layout_.buckets()[b];
    const bool checked = options_.check_usage;
    if constexpr (!policy::shards_gradients) {
      half_type* user = grads_.data() + k.begin;
      if (checked) {
        if (fingerprint(user, k.size) != p.fingerprint) note(misuse::written_after_ready, b);
        copy_within(user, p.copy.data(), k.size);
        reduced_fingerprint_[b] = fingerprint(user, k.size);  // step() checks nobody wrote after this
      }
      // The layers stay marked ready until step(): a bucket is reduced once per step.
    } else {
      // Accumulate this rank's reduced piece into the gradient shard.
      const std::size_t piece = layout_.piece_size(b);
      auto& g = bucket_grads_[b];
      const half_type* reduced = (checked ? p.copy.data() : g.data()) + static_cast<std::size_t>(rank_) * piece;
      engine<space>::accumulate(*comm_, grads_.data() + k.shard_begin, reduced, piece);
      // No host wait: the buffer goes back to the pool, and whatever takes it next (a bucket's
      // gradients, a stage-3 gather) clears or fills it on the communicator's stream, after
      // this accumulation (see "Streams" at the top for work on other streams).
      bucket_live_[b] = false;
      if (checked) {
        // Kept, so that spans into it stay valid memory; a write through one is caught later.
        const auto now = fingerprint(g.data(), g.size());
        if (now != p.fingerprint) note(misuse::written_after_ready, b);
        stale_fingerprint_[b] = now;
      } else {
        give_buffer(g);
      }
      reset_bucket(b);  // the bucket's next micro-batch may begin
    }
    p.copy = buffer<half_type, space>();
  }

  // step(): gradients nobody may have touched since they were reduced.
  void check_gradients_untouched() {
    for (std::size_t b = 0; b < layout_.buckets().size(); ++b) {
      const auto& k = layout_.buckets()[b];
      if constexpr (!policy::shards_gradients) {
        if (reduced_fingerprint_[b] && fingerprint(grads_.data() + k.begin, k.size) != *reduced_fingerprint_[b])
          note(misuse::written_after_ready, b);
      } else {
        auto& g = bucket_grads_[b];
        // gradients() began a micro-batch for the bucket that was never reduced: cheap to catch
        // in any mode, since no bucket is live here unless that happened.
        if (bucket_live_[b] && !all_zero(g)) note(misuse::written_not_reduced, b);
        if (stale_fingerprint_[b] && fingerprint(g.data(), g.size()) != *stale_fingerprint_[b]) note(misuse::written_after_ready, b);
      }
    }
  }

  void note(misuse kind, std::size_t bucket) {
    if (!problem_) problem_ = problem{kind, bucket};
  }

  // ---- checked mode: fingerprints and poison -------------------------------------------------

  // 64 bits that change with any change of the bytes (not cryptographic: it catches mistakes).
  static std::uint64_t fingerprint_bytes(const void* data, std::size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    std::uint64_t h = 0x9E3779B97F4A7C15ull ^ bytes;
    std::size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * 0xFF51AFD7ED558CCDull;
      h ^= h >> 32;
    }
    for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
  }
  // Device memory is copied to the host first, after the communicator's stream: checked mode
  // pays for it.
  std::vector<half_type> host_copy(const half_type* data, std::size_t n) {
    comm_->synchronize();
    std::vector<half_type> host(n);
    detail::copy_bytes(host.data(), true, data, space::host_accessible, n * sizeof(half_type));
    return host;
  }
  std::uint64_t fingerprint(const half_type* data, std::size_t n) {
    if constexpr (space::host_accessible) return fingerprint_bytes(data, n * sizeof(half_type));
    else return fingerprint_bytes(host_copy(data, n).data(), n * sizeof(half_type));
  }
  bool all_zero(const buffer<half_type, space>& g) {
    const auto bytes = [](const half_type* d, std::size_t n) {
      const auto* p = reinterpret_cast<const unsigned char*>(d);
      return std::all_of(p, p + n * sizeof(half_type), [](unsigned char c) { return c == 0; });
    };
    if constexpr (space::host_accessible) return bytes(g.data(), g.size());
    else return bytes(host_copy(g.data(), g.size()).data(), g.size());
  }
  void poison(buffer<half_type, space>& b) {
    const std::vector<half_type> nan(b.size(), std::numeric_limits<half_type>::quiet_NaN());
    upload(b, 0, nan.data(), nan.size());
  }

  // ---- model parallelism: what counts in the norm, and the grid's decision --------------------

  // A run of this rank's piece of a bucket whose gradients count in the global norm.
  struct stat_range {
    std::size_t bucket;
    std::size_t offset;  // from the start of the piece
    std::size_t length;
  };

  // The whole piece of every bucket, except, on model-parallel ranks other than 0 (or where
  // options.count_replicas says), the replicas (the same gradients as another rank's, which
  // counts them): one range per bucket without
  // model parallelism, so the sums are bitwise those of a plain data-parallel run.
  std::vector<stat_range> counted_ranges(const model_spec& spec) const {
    const bool skip_replicas =
        model_parallel_ != nullptr && !options_.count_replicas.value_or(model_parallel_->rank() == 0);
    std::vector<stat_range> ranges;
    for (std::size_t b = 0; b < layout_.buckets().size(); ++b) {
      const std::size_t begin = layout_.piece_begin(b, rank_), piece = layout_.piece_size(b);
      std::vector<std::pair<std::size_t, std::size_t>> skipped;  // [lo, hi) in flat coordinates
      if (skip_replicas)
        for (const auto& t : spec.tensors()) {
          if (t.copy != model_copy::replica) continue;
          const auto& p = layout_.find(t.name);
          const std::size_t lo = std::max(p.offset, begin), hi = std::min(p.offset + p.numel, begin + piece);
          if (p.bucket == b && lo < hi) skipped.emplace_back(lo, hi);
        }
      std::sort(skipped.begin(), skipped.end());
      std::size_t at = begin;
      for (const auto& [lo, hi] : skipped) {
        if (lo > at) ranges.push_back({b, at - begin, lo - at});
        at = std::max(at, hi);
      }
      if (at < begin + piece) ranges.push_back({b, at - begin, begin + piece - at});
    }
    return ranges;
  }

  // The model-parallel group must cut across the data-parallel groups, as a process_grid's
  // tensor axis does: its ranks hold the same data-parallel position. Passing the data axis (or
  // the world) instead would count each gradient several times and apply the decision of the
  // wrong ranks, silently; one all-reduce at construction says so on every rank.
  void check_model_parallel_group() {
    const double mine[4] = {static_cast<double>(comm_->rank()), -static_cast<double>(comm_->rank()),
                            static_cast<double>(comm_->size()), -static_cast<double>(comm_->size())};
    upload(model_report_, 0, mine, 4);
    // The upload is ordered on the data-parallel communicator's stream, the all-reduce on the
    // model-parallel one's: on a device, the first must be done before the second starts.
    if constexpr (!space::host_accessible) comm_->synchronize();
    model_parallel_->all_reduce(model_report_, reduce_op::max);
    model_parallel_->synchronize();
    const auto all = to_vector(model_report_);
    TRIDENT_EXPECT(all[0] == -all[1] && all[2] == -all[3], "zero_optimizer on rank ", rank_, ": the model-parallel group (",
                   model_parallel_->size(), " ranks) holds ranks at data-parallel positions ", -all[1], "..", all[0],
                   " of groups of ", -all[3], "..", all[2], " ranks; expected every rank of it at the same position, as the "
                   "tensor axis of the process_grid whose data axis is the first communicator (grid.data(), grid.tensor())");
  }

  // Sums the norm and ORs the overflow over the model-parallel group, so every rank of the grid
  // takes the same decision; and since a misuse is named only by the data-parallel group that
  // made it, the others learn of it here and throw too, so that no rank goes on alone.
  void agree_across_model(const std::vector<double>& reports, double& norm_squared, bool& overflow) {
    const std::size_t n = static_cast<std::size_t>(comm_->size());
    bool problem = false;
    for (std::size_t r = 0; r < n; ++r)
      problem = problem || reports[r * report_fields + 4] != 0 || reports[r * report_fields + 2] != reports[2] ||
                reports[r * report_fields + 3] != reports[3];
    const double mine[3] = {norm_squared, overflow ? 1.0 : 0.0, problem ? 1.0 : 0.0};
    upload(model_report_, 0, mine, 3);
    if constexpr (!space::host_accessible) comm_->synchronize();  // see check_model_parallel_group
    guarded("step", [&] {
      model_parallel_->all_reduce(model_report_, reduce_op::sum);
      model_parallel_->synchronize();
    });
    const auto all = to_vector(model_report_);
    if (!problem && all[2] != 0) {
      discard_step();
      throw usage_error(detail::concat("step on rank ", rank_, ": the data-parallel group of another model-parallel rank "
                                       "found a misuse (its ranks' errors name it), so this step is skipped on every rank "
                                       "of the grid. Nothing was applied"));
    }
    norm_squared = all[0];
    overflow = all[1] != 0;
  }

  // ---- ranks agree: step()'s all-gather of reports -------------------------------------------

  // Every bucket collective (reduction or stage-3 gather) this rank queued since the last step,
  // in order: ranks must agree, since collectives are matched by position.
  void record(std::size_t b, bool gather) {
    const std::uint64_t code = 2 * static_cast<std::uint64_t>(b) + (gather ? 1 : 0);
    digest_ = (digest_ ^ code) * 1099511628211ull;  // FNV-1a
    if (sequence_.size() < recorded_collectives) sequence_.push_back(code);
    ++collectives_;
  }

  // All-gathered rather than all-reduced: every rank sees every report, so every rank can name
  // the rank that differs, and sums the norm in the same (rank) order. The buffer is kept for
  // the optimizer's life (allocating one per step would be a cudaMalloc/cudaFree, and a
  // device-wide synchronisation, on every step of the CUDA path).
  double* report_of_this_rank() { return reports_.data() + static_cast<std::size_t>(rank_) * report_fields; }

  // The report's first two fields (sum of squares, non-finite) are in place already (step()'s
  // total_into, or zero and finite: `blank`); the rest are known here.
  std::vector<double> exchange_reports(bool blank = false) {
    const std::size_t at = static_cast<std::size_t>(rank_) * report_fields;
    if (blank) {
      const double clean[2] = {0.0, 0.0};
      upload(reports_, at, clean, 2);
    }
    const auto known = known_report_fields();
    upload(reports_, at + 2, known.data(), report_fields - 2);
    bucket_collective(no_bucket, false, false, [&] {
      comm_->all_gather(space_span<const double, space>(reports_.data() + at, report_fields), reports_);
      comm_->synchronize();
    });
    return to_vector(reports_);
  }

  // Every rank holds every report, so every rank throws the same error; the step is discarded
  // first so the optimizer can go on.
  void check_reports(const std::vector<double>& reports) {
    const std::size_t n = static_cast<std::size_t>(comm_->size());
    auto field = [&](std::size_t r, std::size_t f) { return reports[r * report_fields + f]; };
    for (std::size_t r = 0; r < n; ++r) {
      const auto kind = static_cast<misuse>(static_cast<int>(field(r, 4)));
      if (kind == misuse::none) continue;
      const auto b = static_cast<std::size_t>(field(r, 5));
      discard_step();
      if (kind == misuse::written_after_ready)
        throw usage_error(detail::concat(
            "step: on rank ", r, ", gradients of ", describe_bucket(b), " were written after grad_ready() marked its layers "
            "ready; the reduction had already taken them, so ranks would apply different gradients. Expected every write "
            "to a layer's gradients before grad_ready(layer) (a gradients() span serves one micro-batch). Nothing was applied"));
      throw usage_error(detail::concat(
          "step: on rank ", r, ", gradients of ", describe_bucket(b), " were written after the bucket's last reduction and "
          "never reduced: gradients() began a new micro-batch for it, but its layers were not marked ready (grad_ready) "
          "again before step(). Nothing was applied"));
    }
    for (std::size_t r = 1; r < n; ++r)
      if (field(r, 2) != field(0, 2) || field(r, 3) != field(0, 3))
        throw_order_mismatch(reports, "step", "so data of one bucket went into another");
    collectives_ = 0;
    digest_ = fnv_basis;
    sequence_.clear();
  }

  void discard_step() {
    zero_grad();
    invalidate_gathered();  // stage 3: a bucket gathered out of order may hold another bucket's values
    last_gathered_.reset();
    collectives_ = 0;
    digest_ = fnv_basis;
    sequence_.clear();
  }

  // The ranks' bucket collectives differ: exchange the recorded sequences (error path only) and
  // name the first position where they part.
  // `head` starts the message (the call), `consequence` says what the mismatch did.
  [[noreturn]] void throw_order_mismatch(const std::vector<double>& reports, const std::string& head, const std::string& consequence) {
    const std::size_t n = static_cast<std::size_t>(comm_->size());
    std::size_t longest = 0;
    for (std::size_t r = 0; r < n; ++r) longest = std::max(longest, static_cast<std::size_t>(reports[r * report_fields + 2]));
    const std::size_t len = std::max<std::size_t>(1, std::min(longest, recorded_collectives));  // the same on every rank
    std::vector<double> mine(len, -1.0);
    for (std::size_t i = 0; i < std::min(len, sequence_.size()); ++i) mine[i] = static_cast<double>(sequence_[i]);
    buffer<double, space> all(len * n, mem_category::communication);
    upload(all, static_cast<std::size_t>(rank_) * len, mine.data(), len);
    comm_->all_gather(space_span<const double, space>(all.data() + static_cast<std::size_t>(rank_) * len, len), all);
    comm_->synchronize();
    const auto seq = to_vector(all);
    discard_step();
    auto what = [&](std::size_t r, double code) {
      if (code < 0)
        return detail::concat("nothing (rank ", r, " issued ", static_cast<std::size_t>(reports[r * report_fields + 2]), ")");
      const auto c = static_cast<std::uint64_t>(code);
      return detail::concat(c % 2 ? "the all-gather of " : (!policy::shards_gradients ? "the all-reduce of " : "the reduce-scatter of "),
                            describe_bucket(static_cast<std::size_t>(c / 2)));
    };
    for (std::size_t i = 0; i < len; ++i)
      for (std::size_t r = 1; r < n; ++r)
        if (seq[r * len + i] != seq[i])
          throw usage_error(detail::concat(
              head, ": the ranks issued their bucket collectives in different orders, and collectives are matched by "
              "position, not by bucket: since the last step, collective ", i + 1, " was ", what(0, seq[i]), " on rank 0 but ",
              what(r, seq[r * len + i]), " on rank ", r, ", ", consequence, ". Expected every rank to touch its layers "
              "(parameters() in stage 3, grad_ready()) in the same order", prefetch_note(), ". Nothing was applied"));
    throw usage_error(detail::concat(head, ": the ranks issued their bucket collectives in different orders (beyond the first ",
                                     recorded_collectives, " since the last step), and collectives are matched by position, "
                                     "not by bucket (", consequence, "). Expected every rank to touch its layers in the same "
                                     "order", prefetch_note(), ". Nothing was applied"));
  }

  std::string prefetch_note() const {
    if (!policy::shards_parameters || !options_.prefetch) return {};
    return " (with prefetch, parameters() also gathers the bucket after it in the direction of travel, so the order of "
           "the parameters() calls decides which buckets are gathered)";
  }

  // ---- ranks out of step: a bucket collective the communicator refused -----------------------
  //
  // When ranks issue different bucket collectives at one position, the communicator may see it
  // before step() does: an all-gather against a reduce-scatter (stage 3 with prefetch), or
  // buckets of different sizes. The thread backend and MPI's argument check raise a usage_error
  // on every rank then (the thread backend fails what each rank queued behind it, too, so the
  // ranks stay matched: comm/local.hpp). Every rank turns it into the message step() would
  // give: it waits for what it has in flight, exchanges the sequences of bucket collectives
  // (two all-gathers, on this error path only) and names the first position where they part,
  // with both buckets. The exchange is matched because every rank stopped at the same
  // collective; a rank reaches it from whichever call waited for (or started) the refused
  // collective.

  static constexpr std::size_t no_bucket = static_cast<std::size_t>(-1);
  struct refusal {
    std::string message;  // the communicator's
    std::size_t bucket;   // no_bucket: step()'s exchange of reports
    bool gather;
  };

  // Runs one communicator call for a bucket collective: start (`starting`: recorded even when
  // refused, so that the ranks' sequences show it), wait, or step()'s report exchange.
  template <class F>
  decltype(auto) bucket_collective(std::size_t b, bool gather, bool starting, F&& f) {
    try {
      return f();
    } catch (const usage_error& e) {
      if (!refused_) {
        refused_ = refusal{e.message(), b, gather};
        if (starting) record(b, gather);
      }
      throw;
    }
  }

  // The public calls that reach the communicator: the outermost one turns a refusal into the
  // ranks' common message.
  template <class F>
  decltype(auto) guarded(const char* call, F&& f) {
    if (call_) return f();
    call_ = call;
    try {
      if constexpr (std::is_void_v<decltype(f())>) {
        f();
        call_ = nullptr;
      } else {
        decltype(auto) result = f();
        call_ = nullptr;
        return result;
      }
    } catch (const usage_error&) {
      call_ = nullptr;
      if (refused_) out_of_step(call);
      throw;
    } catch (...) {
      call_ = nullptr;
      throw;
    }
  }

  [[noreturn]] void out_of_step(const char* call) {
    const refusal r = std::move(*refused_);
    // Calls made here neither recover again nor leave a refusal behind.
    struct scope {
      zero_optimizer& z;
      ~scope() {
        z.refused_.reset();
        z.call_ = nullptr;
      }
    } restore{*this};
    refused_.reset();
    call_ = call;
    // What is in flight: on the thread backend, what was queued after the refused collective
    // fails at once without taking part; elsewhere it was started (and matched) before it.
    for (auto& p : pending_reduce_) {
      try {
        if (p.request) p.request->wait();
      } catch (...) {
      }
    }
    pending_reduce_.clear();
    for (auto& g : pending_gather_) {
      if (!g) continue;
      try {
        g->wait();
      } catch (...) {
      }
      g.reset();
    }
    try {
      comm_->synchronize();  // the thread backend: a refusal nothing has waited for
    } catch (...) {
    }
    const std::string head = detail::concat(call, " on rank ", rank_);
    const std::string refused =
        r.bucket == no_bucket
            ? detail::concat("the communicator refused step()'s exchange of reports (", r.message, ")")
            : detail::concat("the communicator refused ", r.gather ? "the all-gather of " : (!policy::shards_gradients ? "the all-reduce of " : "the reduce-scatter of "),
                             describe_bucket(r.bucket), " (", r.message, ")");
    std::vector<double> reports;
    try {
      reports = exchange_reports(true);
    } catch (const error& e) {
      discard_step();
      throw usage_error(detail::concat(head, ": ", refused, ", and the ranks could not compare their bucket collectives (",
                                       e.message(), "). Expected every rank to issue the same collectives in the same order, "
                                       "touching its layers (parameters() in stage 3, grad_ready()) in the same order",
                                       prefetch_note(), ". Nothing was applied"));
    }
    const std::size_t n = static_cast<std::size_t>(comm_->size());
    for (std::size_t q = 1; q < n; ++q)
      if (reports[q * report_fields + 2] != reports[2] || reports[q * report_fields + 3] != reports[3])
        throw_order_mismatch(reports, head, "so the communicator met collectives that do not match (here: " + r.message + ")");
    discard_step();
    throw usage_error(detail::concat(head, ": ", refused, ", although the ranks issued the same bucket collectives since the "
                                     "last step: another collective on this communicator must have come between them on some "
                                     "rank. Expected every rank to issue the same collectives in the same order. Nothing was "
                                     "applied"));
  }

  // ---- communication buffers ----------------------------------------------------------------
  // Bucket buffers (stages 2-3: gradients while a bucket is written and reduced; stage 3: the
  // gathered parameters) come from a pool of spares keyed by size instead of being allocated and
  // freed per micro-batch: on CUDA each allocation is a cudaMalloc and each free an implicit
  // device synchronisation. After the first step, when every size has met its peak concurrency,
  // steps allocate nothing (zero.local counts it with the ledger). The spares stay charged to the
  // ledger as communication memory, which they are.
  buffer<half_type, space> take_buffer(std::size_t n) {
    if (auto it = spare_.find(n); it != spare_.end()) {
      buffer<half_type, space> b = std::move(it->second);
      spare_.erase(it);
      return b;
    }
    return buffer<half_type, space>(n, mem_category::communication);
  }
  void give_buffer(buffer<half_type, space>& b) {
    if (b.size() != 0) spare_.emplace(b.size(), std::move(b));
    b = buffer<half_type, space>();
  }

  // ---- stage 3 gathering --------------------------------------------------------------------
  bool persistent(std::size_t b) const { return layout_.buckets()[b].used < options_.persistence_threshold; }

  void start_gather(std::size_t b) {
    if constexpr (policy::shards_parameters) {
      if (is_gathered_[b]) return;  // gathered, or being gathered
      const auto& k = layout_.buckets()[b];
      const std::size_t piece = layout_.piece_size(b);
      // Checked mode gathers into the buffer it poisoned on release, so a stale span sees
      // either NaN or this bucket's values, never another bucket's.
      if (gathered_[b].size() == 0) gathered_[b] = take_buffer(k.size);
      half_type* mine = gathered_[b].data() + static_cast<std::size_t>(rank_) * piece;
      copy_within(mine, working_.data() + k.shard_begin, piece);
      pending_gather_[b].emplace(bucket_collective(b, true, true, [&] {
        return comm_->all_gather_async(space_span<const half_type, space>(mine, piece), gathered_[b]);
      }));
      is_gathered_[b] = true;
      // A new gather: every layer of the bucket needs releasing again before it goes.
      released_[b] = 0;
      for (int l = k.first_layer; l <= k.last_layer; ++l) layer_released_[static_cast<std::size_t>(l)] = false;
      record(b, true);
    } else {
      (void)b;
    }
  }
  void wait_gather(std::size_t b) {
    if (!pending_gather_[b]) return;
    auto r = std::move(*pending_gather_[b]);
    pending_gather_[b].reset();
    bucket_collective(b, true, false, [&] { r.wait(); });
  }
  void gather(std::size_t b) {
    start_gather(b);
    wait_gather(b);
  }
  void prefetch_after(std::size_t b) {
    const bool forward = !last_gathered_ || *last_gathered_ <= b;
    last_gathered_ = b;
    if (!options_.prefetch) return;
    if (forward && b + 1 < layout_.buckets().size()) start_gather(b + 1);
    if (!forward && b > 0) start_gather(b - 1);
  }
  // The bucket's gathered parameters are no longer valid. A gather still in flight writes into
  // the buffer, so it is waited for first.
  void drop_gathered(std::size_t b) {
    wait_gather(b);
    is_gathered_[b] = false;
    if (options_.check_usage) poison(gathered_[b]);
    else give_buffer(gathered_[b]);
  }
  void invalidate_gathered() {
    if constexpr (policy::shards_parameters)
      for (std::size_t b = 0; b < gathered_.size(); ++b)
        if (is_gathered_[b]) drop_gathered(b);
  }

  // ---- destruction --------------------------------------------------------------------------
  void wait_in_destructor(request_type& r) noexcept {
    try {
      r.wait();
    } catch (const std::exception& e) {
      report_lost(e.what());
    } catch (...) {
      report_lost("an exception not derived from std::exception");
    }
  }
  void report_lost(const char* what) noexcept {
    try {
      const std::string message = detail::concat("zero_optimizer destroyed with communication in flight, which failed: ", what,
                                                 " (call finish() before destruction to get this as an exception)");
      if (options_.on_destructor_error) {
        options_.on_destructor_error(message);
        return;
      }
      std::fprintf(stderr, "trident: %s\n", message.c_str());
    } catch (...) {
      std::fprintf(stderr, "trident: zero_optimizer destroyed with communication in flight, which failed: %s\n", what);
    }
  }

  Comm* comm_;
  Comm* model_parallel_ = nullptr;  // the ranks holding the other parts of the model, if any
  Opt opt_;
  zero_options options_;
  scaler_type scaler_;
  flat_layout layout_;
  int rank_;
  std::int64_t step_count_ = 0;
  std::vector<std::shared_future<void>> holds_;  // hold_state()
  void await_holds() noexcept {
    for (auto& h : holds_) h.wait();
    holds_.clear();
  }
  bool sync_ = true;

  buffer<half_type, space> working_;  // full (stages 0-2) or shard (stage 3)
  buffer<float, space> master_;       // fp32 master weights: full (stage 0) or shard; empty without mixed precision
  buffer<half_type, space> grads_;    // full (stages 0-1) or shard (stages 2-3)
  std::array<buffer<float, space>, Opt::state_count> states_;  // full (stage 0) or shard
  std::unique_ptr<offload::state_store> store_;  // the master weights and states instead, when offloaded
  std::vector<std::size_t> pass_order_;          // the buckets, in the order a step updates them
  std::vector<buffer<float, host_space>> whole_;   // the state whole, while state_fields() has handed it out (nvme)
  std::array<buffer<half_type, pinned_host_space>, 2> grad_stage_, work_stage_;  // a device optimizer's pieces on the host

  // Readiness: per layer, marked in this micro-batch; per bucket, layers with tensors (those
  // that must be marked) and how many are still to come.
  std::vector<bool> layer_ready_;
  std::vector<std::size_t> with_tensors_, waiting_;
  std::vector<bool> launched_;  // the bucket's reduction was started: its layers stay marked (see grad_ready)
  std::vector<bool> synced_;    // reduced since the last step

  std::vector<buffer<half_type, space>> bucket_grads_;  // stages 2-3: per-bucket gradient buffers, while in use
  std::vector<bool> bucket_live_;                       // stages 2-3: the buffer holds this micro-batch's gradients
  std::vector<pending> pending_reduce_;
  std::function<void(Comm&, const compress::bucket_view<half_type, space>&)> reducer_;  // empty: the plain reduction
  std::function<void(Comm&)> reducer_skipped_;  // the reducer's step_skipped, if it has one
  std::vector<std::vector<compress::tensor_part>> bucket_tensors_;                       // for the reducer, per bucket
  std::vector<buffer<half_type, space>> gathered_;  // stage 3: full buckets, while gathered (checked mode: for good)
  std::vector<bool> is_gathered_;                   // gathered or being gathered (pending_gather_)
  std::multimap<std::size_t, buffer<half_type, space>> spare_;  // pooled bucket buffers by size
  std::vector<bool> layer_released_;                // per layer: released since its bucket was gathered
  std::vector<std::size_t> released_;               // per bucket: its layers with tensors released so far
  std::vector<std::optional<request_type>> pending_gather_;
  std::optional<std::size_t> last_gathered_;  // this step's last gathered bucket: the direction of prefetching

  std::optional<refusal> refused_;  // the first bucket collective the communicator refused (see out_of_step)
  const char* call_ = nullptr;      // the public call in progress (guarded)

  // Checked mode: fingerprints of gradients that nobody may change any more.
  std::vector<std::optional<std::uint64_t>> stale_fingerprint_;    // stages 2-3: a finished bucket's kept buffer
  std::vector<std::optional<std::uint64_t>> reduced_fingerprint_;  // stages 0-1: a reduced bucket's region
  std::optional<problem> problem_;                                  // the first misuse seen since the last step

  std::uint64_t collectives_ = 0, digest_ = fnv_basis;  // bucket collectives since the last step
  std::vector<std::uint64_t> sequence_;                 // the first recorded_collectives of them
  buffer<double, space> reports_;                        // step()'s all-gather: report_fields per rank
  std::vector<stat_range> stat_ranges_;                  // step(): what counts in the norm
  buffer<double, space> bucket_sums_;                    // step(): each counted range's sum of squares
  buffer<double, space> model_report_;                   // step(): norm, overflow, misuse over the model group
  buffer<double, space> stats_scratch_;                  // step(): the engine's scratch for them
  buffer<double, space> deferred_state_;                 // step_async(): see deferred_* and detail::decide_step
  bool async_pending_ = false;                           // a step_async() not yet read by last_step()
  bool device_count_stale_ = false;                      // step_count_ moved on the host since the device's
};

}  // namespace trident::zero
