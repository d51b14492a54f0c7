#pragma once
// flagship::train: the training loop of the GPT model (gpt.hpp) on a (data, tensor, pipeline)
// process grid, ZeRO 0-3 on the data axis, AdamW with a learning-rate schedule, gradient
// accumulation, global-norm clipping, and a validation loss every k steps.
//
// Run-time choices dispatch to compiled instantiations: the ZeRO stage to gpt_rank<0..3, ...>
// (with the precision, train's template argument), the number of pipeline stages to
// uniform_pipeline<gpt_stage, N> for N in compiled_stage_counts. The loop sees the model through
// chunk_runner, so it compiles once per N, not once per (N, ZeRO stage, precision).
//
// Data: each data-parallel rank reads its slice of every global batch (data::shard_loader, llm.c's
// order), `accumulation` of them per step; all ranks of one data coordinate read the same slice
// (the first stage needs the tokens, the last the targets). The loss of a step is the mean over
// every token of the d x accumulation x micro_batch rows, as one rank training on the whole
// batch computes it, so a grid reproduces the serial run (tests/gpt).
//
//   flagship::train_options o;  o.model = {...};  o.tensor = 2;  o.pipeline = 2;  o.zero_stage = 1;
//   trident::local_world::run(8, [&](trident::local_comm& world) {
//     auto reports = flagship::train(world, o, [](const flagship::step_report& r) { ... });
//   });
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpt.hpp"
#include "trident/comm/communicator.hpp"
#include "trident/comm/process_grid.hpp"
#include "trident/core/error.hpp"
#include "trident/data/token_shards.hpp"
#include "trident/exec/trace.hpp"
#include "trident/nn/cuda/cublas.hpp"  // gemm_math alone without CUDA
#include "trident/optim/optimizers.hpp"
#include "trident/optim/schedule.hpp"
#include "trident/parallel/data/zero_optimizer.hpp"
#include "trident/parallel/pipeline/pipeline.hpp"
#include "trident/parallel/pipeline/schedule.hpp"
#include "trident/precision/loss_scaler.hpp"
#include "trident/precision/mixed_precision.hpp"

namespace flagship {

//! A learning-rate schedule chosen at run time (optim::lr_schedule): what a config file names.
struct lr_function {
  std::function<double(std::int64_t)> f;
  double operator()(std::int64_t step) const { return f(step); }
};
using optimizer_type = trident::optim::scheduled<trident::optim::adamw, lr_function>;

//! The pipeline stage counts (p x virtual stages) compiled in.
inline constexpr std::array<int, 6> compiled_stage_counts{1, 2, 3, 4, 6, 8};
//! The schedules by name.
inline constexpr std::array<const char*, 5> schedule_names{"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"};

struct train_options {
  gpt_config model;
  int tensor = 1, pipeline = 1, virtual_stages = 1;
  std::string schedule = "1f1b";
  int zero_stage = 0;
  std::size_t micro_batch = 4;  // rows of seq tokens per micro-batch (train_micro_batch_size_per_gpu)
  int accumulation = 1;         // micro-batches per step and data-parallel rank
  long steps = 20;
  float max_grad_norm = 1.0f;   // 0: no clipping
  trident::optim::adamw::options adamw{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  std::function<double(std::int64_t)> lr;  // the lr of optimizer step k (1-based); empty: adamw.lr throughout
  std::size_t bucket_elements = 5'000'000, first_bucket_elements = 1'000'000;
  std::size_t persistence_threshold = 100'000;  // stage 3: buckets smaller than this stay gathered
  std::vector<std::string> train_files, val_files;
  //! The slice of each global batch this rank reads: (index, count) of the data ranks; unset:
  //! its data coordinate among the grid's d. Workers that train apart (DiLoCo: each worker a
  //! grid of its own) set it so that they read different data.
  std::optional<std::pair<int, int>> data_slice;
  long eval_every = 0;  // 0: no validation
  int eval_batches = 4;
  std::uint64_t seed = 1234;
  long trace_step = 0;      // this step's timeline goes to trace_file (Chrome trace); 0: none
  std::string trace_file;
  //! fp16's loss scaling (train<mixed_precision<fp16>>): DeepSpeed's dynamic scaler. A fixed
  //! scale S (DeepSpeed's "loss_scale": S) is the same scaler with initial, minimum and maximum S
  //! and no error at the minimum: overflowing steps are still skipped.
  trident::dynamic_loss_scaler::options dynamic_scaler;
  //! Checkpoints (trident/checkpoint/zero.hpp): every `save_every` steps into checkpoint_dir,
  //! asynchronously, keeping the newest `keep_checkpoints` (0: all). With `resume`, training
  //! continues from the newest good checkpoint there (saved in any grid layout and ZeRO stage;
  //! the global batch must be the same), up to `steps`; none there: from the start.
  std::string checkpoint_dir;
  long save_every = 0;
  int keep_checkpoints = 0;
  bool resume = false;
  //! The GPU path's GEMM math (nn/cuda/cublas.hpp): unset, the precision's own (fp32 for fp32,
  //! TF32 tensor cores for bf16). The host path computes its GEMMs in float (main.cpp's --gemm
  //! is refused there).
  std::optional<trident::nn::gemm_math> gpu_gemm;
};

struct step_report {
  long step = 0;                 // 1-based
  double loss = 0;               // mean over the step's tokens
  double lr = 0;
  double grad_norm = 0;          // before clipping
  bool applied = true;           // false: skipped (an overflow in fp16)
  double loss_scale = 1;         // the scale this step's gradients were computed with
  double seconds = 0;            // wall time of the step (data, forward, backward, step)
  double tokens = 0;             // tokens of the step, every rank's
  bool validated = false;        // a validation ran after this step: val_loss (which may be NaN)
  double val_loss = std::numeric_limits<double>::quiet_NaN();
};

namespace detail {

// Stage counts as compile-time constants.
template <class F>
void with_stage_count(int n, F&& f) {
  switch (n) {
    case 1: f(std::integral_constant<std::size_t, 1>{}); return;
    case 2: f(std::integral_constant<std::size_t, 2>{}); return;
    case 3: f(std::integral_constant<std::size_t, 3>{}); return;
    case 4: f(std::integral_constant<std::size_t, 4>{}); return;
    case 6: f(std::integral_constant<std::size_t, 6>{}); return;
    case 8: f(std::integral_constant<std::size_t, 8>{}); return;
    default: break;
  }
  throw trident::usage_error(trident::detail::concat("train: ", n, " pipeline stages (pipeline x virtual_stages) are not compiled "
                                                     "in; expected one of 1, 2, 3, 4, 6, 8"));
}

template <class F>
void with_zero_stage(int stage, F&& f) {
  switch (stage) {
    case 0: f(std::integral_constant<int, 0>{}); return;
    case 1: f(std::integral_constant<int, 1>{}); return;
    case 2: f(std::integral_constant<int, 2>{}); return;
    case 3: f(std::integral_constant<int, 3>{}); return;
    default: break;
  }
  throw trident::usage_error(trident::detail::concat("train: ZeRO stage ", stage, "; expected 0, 1, 2 or 3"));
}

inline trident::pipeline::schedule make_schedule(const std::string& name, int p, int m, int v) {
  namespace pp = trident::pipeline;
  const bool known = name == "gpipe" || name == "1f1b" || name == "interleaved" || name == "zb-h1" || name == "zb-h2";
  TRIDENT_EXPECT(known, "train: unknown pipeline schedule '", name, "'; expected one of gpipe, 1f1b, interleaved, zb-h1, zb-h2");
  TRIDENT_EXPECT(v == 1 || name == "interleaved", "train: ", v, " virtual stages per rank need the 'interleaved' schedule, not '",
                 name, "'");
  TRIDENT_EXPECT(name != "zb-h1" && name != "zb-h2", "train: the GPT's stages do not split their backward into input and weight "
                 "gradients yet, which the zero-bubble schedule '", name, "' needs; expected gpipe, 1f1b or interleaved");
  if (name == "gpipe") return pp::gpipe(p, m);
  if (name == "1f1b") return pp::one_f_one_b(p, m);
  return pp::interleaved_one_f_one_b(p, m, v);
}

// A collective on host values `v`, over a communicator of any memory space: a device one (NCCL)
// gets them staged through its own memory, and waited for before they are read back.
template <class Comm, class T, class F>
void on_host_values(Comm& world, std::vector<T>& v, F&& collective) {
  using space = typename Comm::space;
  if constexpr (space::host_accessible) {
    collective(trident::space_span<T, space>(v.data(), v.size()));
  } else {
    trident::buffer<T, space> staged(v.empty() ? 1 : v.size(), trident::mem_category::communication);
    if (!v.empty()) trident::copy(std::span<const T>(v), staged);  // synchronous
    collective(trident::space_span<T, space>(staged.data(), v.size()));
    world.synchronize();
    if (!v.empty()) trident::copy(staged, std::span<T>(v));
  }
}

// Every rank's spans of one step into one Chrome trace on world rank 0: times from the earliest
// span of any rank (steady_clock is shared by the threads and the processes of one machine),
// each rank's events (one track per recorder) sent to rank 0 as text.
template <class Comm>
void write_trace(Comm& world, std::span<const trident::trace_recorder* const> recs, const std::string& path) {
  using namespace std::chrono;
  auto first = steady_clock::time_point::max();
  for (const auto* r : recs) first = std::min(first, trident::earliest(*r));
  std::vector<std::int64_t> origin{first.time_since_epoch().count()};
  on_host_values(world, origin, [&](auto s) { world.all_reduce(s, trident::reduce_op::min); });
  std::string mine;
  for (const auto* r : recs) {
    if (!mine.empty()) mine += ",\n";
    mine += trident::chrome_trace_events(*r, steady_clock::time_point(steady_clock::duration(origin[0])));
  }
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(world.size()));
  std::vector<std::uint64_t> size{mine.size()};
  using space = typename Comm::space;
  if constexpr (space::host_accessible) {
    world.all_gather(size, sizes);
  } else {
    trident::buffer<std::uint64_t, space> one(1, trident::mem_category::communication), all(sizes.size(), trident::mem_category::communication);
    trident::copy(std::span<const std::uint64_t>(size), one);
    world.all_gather(one, all);
    world.synchronize();
    trident::copy(all, std::span<std::uint64_t>(sizes));
  }
  if (world.rank() != 0) {
    std::vector<std::uint8_t> bytes(mine.begin(), mine.end());
    on_host_values(world, bytes, [&](auto s) { world.send(trident::space_span<const std::uint8_t, space>(s), 0); });
    return;
  }
  std::vector<std::string> lists{mine};
  for (int r = 1; r < world.size(); ++r) {
    std::vector<std::uint8_t> bytes(sizes[static_cast<std::size_t>(r)]);
    on_host_values(world, bytes, [&](auto s) { world.recv(s, r); });
    lists.emplace_back(bytes.begin(), bytes.end());
  }
  std::ofstream f(path);
  TRIDENT_EXPECT(f.good(), "train: cannot write the trace to '", path, "'");
  trident::write_chrome_trace(f, std::span<const std::string>(lists));
  TRIDENT_EXPECT(f.good(), "train: writing the trace to '", path, "' failed");
}

// Tokens outside the vocabulary end the run on every rank together, at the same point, with the
// first offender's place: a rank that threw alone would abort its peers in the middle of their
// own collectives (one tiny all-reduce over the world per step).
// `what` names the batches in the message ("micro-batch", or "validation batch").
template <class Comm>
void check_tokens(Comm& world, const step_batches& b, std::size_t vocab, long step, const char* what = "micro-batch") {
  std::int64_t bad = -1;
  std::size_t where = 0, which = 0;
  for (std::size_t i = 0; i < b.inputs.size() && bad < 0; ++i)
    for (const auto* list : {&b.inputs[i], &b.targets[i]})
      for (std::size_t j = 0; j < list->size() && bad < 0; ++j)
        if ((*list)[j] < 0 || static_cast<std::size_t>((*list)[j]) >= vocab) {
          bad = (*list)[j];
          where = j;
          which = i;
        }
  std::vector<std::int64_t> first{bad >= 0 ? static_cast<std::int64_t>(world.rank()) : std::int64_t{world.size()}};
  world.all_reduce(first, trident::reduce_op::min);
  if (first[0] == world.size()) return;
  if (world.rank() == first[0])
    throw trident::usage_error(trident::detail::concat("train: step ", step, ", ", what, " ", which, ": token ", bad, " at position ",
                                                       where, " is outside the vocabulary [0, ", vocab, ") (rank ", world.rank(), ")"));
  trident::usage_error echo(trident::detail::concat("train: step ", step, ": rank ", first[0], " read a token outside the vocabulary [0, ",
                                                    vocab, ") in a ", what));
  echo.mark_echo();  // that rank raises the details
  throw echo;
}

// The value that the rank of the last stage holds, averaged over the data axis and given to
// every rank (one float each way).
template <class Comm>
double share_from_last_stage(trident::process_grid<Comm>& grid, double value, bool holder) {
  std::vector<double> v{holder ? value : 0.0};
  grid.data().all_reduce(v, trident::reduce_op::avg);
  grid.pipeline().broadcast(v, grid.pipeline().size() - 1);
  return v[0];
}

// Where the data of a resumed run continues: the position the checkpoint recorded, in units of
// this run's global batch (ranks x B x T tokens per loader step; a resharded run may cut the
// same step's batch into more or fewer loader steps).
// step_tokens: this run's tokens per optimizer step (data-parallel ranks x accumulation x B x T),
// which must be the checkpoint's (checkpoints from before it was recorded are not checked).
inline void resume_data(trident::data::shard_loader& train, const std::map<std::string, std::string>& meta, long step,
                        std::size_t step_tokens) {
  auto number = [&](const char* key) -> std::size_t {
    const auto it = meta.find(key);
    TRIDENT_EXPECT(it != meta.end(), "train: the checkpoint of step ", step, " has no data position ('", key, "')");
    const std::string& v = it->second;
    TRIDENT_EXPECT(!v.empty() && v.size() <= 18 && v.find_first_not_of("0123456789") == std::string::npos, "train: the checkpoint of step ",
                   step, " has '", key, "' = '", v, "'; expected a count");
    return static_cast<std::size_t>(std::stoull(v));
  };
  if (meta.contains("data.step_tokens")) {
    const std::size_t saved = number("data.step_tokens");
    TRIDENT_EXPECT(saved == step_tokens, "train: the checkpoint of step ", step, " was trained on global batches of ", saved,
                   " tokens per step, this run on ", step_tokens, " (data-parallel ranks x accumulation x micro-batch x seq); a "
                   "resumed run keeps the global batch (its grid may change)");
  }
  const std::size_t shard = number("data.shard"), batch = number("data.batch"), tokens = number("data.global_tokens");
  const std::size_t mine = train.global_tokens();
  TRIDENT_EXPECT(batch * tokens % mine == 0, "train: the checkpoint of step ", step, " stopped at batch ", batch, " of ", tokens,
                 " tokens in shard ", shard, ", which is not a whole number of this run's global batches of ", mine, " tokens");
  train.seek({shard, batch * tokens / mine});
}

// What a checkpoint records of the training data's position, for resume_data.
inline std::map<std::string, std::string> data_position(const trident::data::shard_loader& train, std::size_t step_tokens) {
  const auto at = train.position();
  return {{"data.shard", std::to_string(at.shard)},
          {"data.batch", std::to_string(at.batch)},
          {"data.global_tokens", std::to_string(train.global_tokens())},
          {"data.step_tokens", std::to_string(step_tokens)}};
}

// --resume: loads the newest checkpoint that loads (load(&skipped) returns it, or nullopt, and
// gives the faults this rank found) and returns the first step to train. Each rank says which
// newer checkpoints it went past and why; rank 0 when there was none: a resume that quietly
// starts over, or quietly takes an older step, looks like success.
template <class Load>
long resume(trident::data::shard_loader& train, const train_options& o, std::size_t step_tokens, int rank, Load&& load) {
  std::vector<std::string> skipped;
  const auto r = load(&skipped);
  for (const auto& why : skipped) std::fprintf(stderr, "train: rank %d: --resume went past a checkpoint: %s\n", rank, why.c_str());
  if (!r && rank == 0) std::fprintf(stderr, "train: no checkpoint to resume from in '%s'; training from step 1\n", o.checkpoint_dir.c_str());
  if (!r) return 1;
  resume_data(train, r->metadata, r->step, step_tokens);
  return r->step + 1;
}

// The options of traces and checkpoints, checked by every rank alone. `who` starts the messages.
inline void check_run_options(const train_options& o, const char* who) {
  TRIDENT_EXPECT(o.trace_step <= 0 || !o.trace_file.empty(), who, ": a trace of step ", o.trace_step, " needs a trace_file");
  TRIDENT_EXPECT((o.save_every <= 0 && !o.resume) || !o.checkpoint_dir.empty(), who, ": ",
                 o.resume ? "resuming" : "saving checkpoints", " needs a checkpoint_dir");
  TRIDENT_EXPECT(o.save_every >= 0 && o.keep_checkpoints >= 0, who, ": save_every ", o.save_every, ", keep_checkpoints ",
                 o.keep_checkpoints, "; expected 0 (off / keep all) or more");
}

// The model's shapes against the grid: t tensor-parallel ranks, `chunks` pipeline stages
// (checked by every rank alone, before anything collective). `who` starts the messages.
inline void check_model(const gpt_config& c, std::size_t t, std::size_t chunks, const char* who) {
  TRIDENT_EXPECT(c.heads >= 1 && c.hidden % c.heads == 0, who, ": hidden size ", c.hidden, " does not divide into ", c.heads, " heads");
  TRIDENT_EXPECT(c.heads % t == 0, who, ": ", c.heads, " attention heads do not divide over a tensor-parallel group of ", t,
                 "; expected the heads to be a multiple of t");
  TRIDENT_EXPECT(c.ffn_size() % t == 0, who, ": the MLP's ", c.ffn_size(), " features do not divide over a tensor-parallel group of ", t);
  TRIDENT_EXPECT(c.vocab % t == 0, who, ": the vocabulary of ", c.vocab, " tokens does not divide over a tensor-parallel group of ", t,
                 "; pad it to a multiple of t");
  TRIDENT_EXPECT(c.layers % chunks == 0, who, ": ", c.layers, " layers do not divide into ", chunks,
                 " pipeline stages (p x virtual stages); expected layers to be a multiple of it");
  TRIDENT_EXPECT(!c.sequence_parallel || c.seq % t == 0, who, ": sequence parallelism splits the ", c.seq,
                 " positions over a tensor-parallel group of ", t, "; expected a multiple of t");
}

// The training loop: compiled once per stage count N (the model behind chunk_runner).
template <std::size_t N, class Comm>
std::vector<step_report> loop(Comm& world, trident::process_grid<Comm>& grid, const train_options& o,
                              const std::function<void(const step_report&)>& on_step, chunk_runner& rank,
                              const optimizer_type& opt) {
  namespace pp = trident::pipeline;
  const int p = grid.pipeline().size(), d = grid.data().size(), m = o.accumulation;
  pp::uniform_pipeline<gpt_stage, N> pipe(grid.pipeline(), [&](auto k) { return gpt_stage(rank, static_cast<int>(k)); });
  const auto schedule = make_schedule(o.schedule, p, m, static_cast<int>(N) / p);

  const int slice = o.data_slice ? o.data_slice->first : grid.data().rank(), slices = o.data_slice ? o.data_slice->second : d;
  trident::data::shard_loader train(o.train_files, o.micro_batch, o.model.seq, slice, slices);
  std::optional<trident::data::shard_loader> val;
  if (o.eval_every > 0) {
    TRIDENT_EXPECT(!o.val_files.empty(), "train: a validation loss every ", o.eval_every, " steps needs validation shards");
    val.emplace(o.val_files, o.micro_batch, o.model.seq, grid.data().rank(), d);
  }
  trident::data::token_batch scratch;
  step_batches batches;
  const std::vector<float> unused(1, 0.0f);
  const bool last = grid.pipeline().rank() == p - 1;
  const double tokens = static_cast<double>(d) * m * static_cast<double>(o.micro_batch * o.model.seq);

  const auto coordinates = trident::detail::concat("rank ", world.rank(), " (d ", grid.coordinate(trident::grid_axis::data), ", t ",
                                                   grid.coordinate(trident::grid_axis::tensor), ", p ",
                                                   grid.coordinate(trident::grid_axis::pipeline), ")");
  const std::size_t step_tokens = static_cast<std::size_t>(d) * static_cast<std::size_t>(m) * o.micro_batch * o.model.seq;
  long first = 1;
  if (o.resume)
    first = resume(train, o, step_tokens, world.rank(), [&](std::vector<std::string>* skipped) {
      return rank.load_checkpoint(o.checkpoint_dir, skipped);
    });
  std::vector<step_report> reports;
  for (long s = first; s <= o.steps; ++s) {
    std::optional<trident::trace_recorder> recorder;
    if (s == o.trace_step) recorder.emplace(world.rank(), coordinates);
    trident::scoped_trace tracing(recorder ? &*recorder : nullptr);
    const auto start = std::chrono::steady_clock::now();
    std::optional<trident::trace_span> step_span;
    step_span.emplace("step", [&] { return "step " + std::to_string(s); });
    {
      const trident::trace_span span("data", "load batches");
      batches = {};
      for (int i = 0; i < m; ++i) append_batch(train, scratch, batches);
      check_tokens(world, batches, o.model.vocab, s);
    }
    rank.set_batches(&batches);
    // Each micro-batch's loss weighs 1 / m in the step, times fp16's loss scale.
    const float scale = rank.loss_scale();
    const auto r = pipe.run(grid.pipeline(), schedule, [&](int) -> const std::vector<float>& { return unused; },
                            [&](const std::vector<float>& y, int, std::vector<float>& dy) {
                              dy[0] = scale / static_cast<float>(m);
                              return static_cast<double>(y[0]);
                            });
    {
      const trident::trace_span span("comm", "tied embedding's gradient");
      rank.finish_backward();
    }
    const auto result = rank.step();
    step_span.reset();
    double sum = 0;
    for (double l : r.losses) sum += l;
    step_report rep;
    rep.step = s;
    rep.loss = share_from_last_stage(grid, last ? sum / m : 0.0, last);
    rep.lr = opt.schedule(s);
    rep.grad_norm = result.grad_norm;
    rep.applied = result.applied;
    rep.loss_scale = scale;
    rep.tokens = tokens;
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (val && s % o.eval_every == 0) {
      val->reset();
      double vsum = 0;
      for (int i = 0; i < o.eval_batches; ++i) {
        step_batches one;
        append_batch(*val, scratch, one);
        check_tokens(world, one, o.model.vocab, s, "validation batch");  // the same error on every rank
        rank.set_batches(&one);
        // Forward only, stage after stage: each rank runs its chunks in order and passes the
        // activations on (blocking: the data flows one way, so nothing waits in a cycle).
        std::vector<float> x = unused;
        for (int k = 0; k < static_cast<int>(N); ++k) {
          if (k % p != grid.pipeline().rank()) continue;
          if (k > 0 && (k - 1) % p != k % p) {
            x.assign(rank.input_numel(k), 0.0f);
            grid.pipeline().recv(std::span<float>(x), (k - 1) % p);
          }
          x = rank.evaluate(k, x, 0);
          if (k + 1 < static_cast<int>(N) && (k + 1) % p != k % p) grid.pipeline().send(std::span<const float>(x), (k + 1) % p);
        }
        if (last) vsum += x[0];
      }
      rep.val_loss = share_from_last_stage(grid, last ? vsum / o.eval_batches : 0.0, last);
      rep.validated = true;
    }
    // A step whose loss is not finite is not saved: its weights may be NaN already, and a save
    // would pass for good (and with keep_checkpoints push out an older good one).
    if (o.save_every > 0 && s % o.save_every == 0 && std::isfinite(rep.loss)) {
      const trident::trace_span span("checkpoint", "save (the copy to host memory)");  // in the traced step's trace
      rank.save_checkpoint(o.checkpoint_dir, s, data_position(train, step_tokens), o.keep_checkpoints);
    }
    if (recorder) {
      tracing.end();
      const trident::trace_recorder* const tracks[] = {&*recorder};
      write_trace(world, std::span<const trident::trace_recorder* const>(tracks), o.trace_file);
    }
    if (on_step) on_step(rep);
    reports.push_back(rep);
  }
  if (o.save_every > 0) rank.finish_saves();
  return reports;
}

// The model of a ZeRO stage and precision, then the loop for its stage count.
// The options' AdamW with its schedule, and ZeRO's options.
inline optimizer_type optimizer_of(const train_options& o) {
  optimizer_type opt;
  opt.opt = o.adamw;
  const double base_lr = o.adamw.lr;
  opt.schedule.f = o.lr ? o.lr : std::function<double(std::int64_t)>([base_lr](std::int64_t) { return base_lr; });
  return opt;
}
inline trident::zero::zero_options zero_options_of(const train_options& o) {
  trident::zero::zero_options zo;
  zo.bucket_bytes = o.bucket_elements * sizeof(float);
  zo.first_bucket_bytes = o.first_bucket_elements * sizeof(float);
  zo.persistence_threshold = o.persistence_threshold;
  zo.max_grad_norm = o.max_grad_norm;
  return zo;
}

template <int Stage, class Precision, class Comm>
std::vector<step_report> run(Comm& world, trident::process_grid<Comm>& grid, const train_options& o,
                             const std::function<void(const step_report&)>& on_step) {
  const optimizer_type opt = optimizer_of(o);
  const trident::zero::zero_options zo = zero_options_of(o);
  using scaler_type = typename Precision::scaler_type;
  scaler_type scaler = [&] {
    if constexpr (std::is_same_v<scaler_type, trident::dynamic_loss_scaler>) return scaler_type(o.dynamic_scaler);
    else return scaler_type{};
  }();
  const int chunks = o.pipeline * o.virtual_stages;
  gpt_rank<Stage, Comm, optimizer_type, Precision> rank(grid, o.model, chunks, o.accumulation, o.micro_batch, opt, zo, o.seed, scaler);
  std::vector<step_report> out;
  with_stage_count(chunks, [&](auto n) { out = loop<decltype(n)::value>(world, grid, o, on_step, rank, opt); });
  return out;
}

}  // namespace detail

//! Trains the model on `world` (collective: every rank calls it with the same options) and
//! returns every step's report (the same on every rank). on_step sees each report as it comes.
//! Precision: full_precision (fp32), or mixed_precision<bf16> / <fp16> (a type: each is its
//! own instantiation, so a program compiles the ones it offers).
template <class Precision = trident::full_precision, trident::communicator Comm>
std::vector<step_report> train(Comm& world, const train_options& o, const std::function<void(const step_report&)>& on_step = {}) {
  TRIDENT_EXPECT(o.tensor >= 1 && o.pipeline >= 1 && o.virtual_stages >= 1, "train: tensor ", o.tensor, ", pipeline ", o.pipeline,
                 ", virtual_stages ", o.virtual_stages, "; expected all at least 1");
  TRIDENT_EXPECT(world.size() % (o.tensor * o.pipeline) == 0, "train: a world of ", world.size(), " ranks is not d x t x p for t = ",
                 o.tensor, " and p = ", o.pipeline, "; expected a multiple of ", o.tensor * o.pipeline);
  detail::check_run_options(o, "train");
  TRIDENT_EXPECT(o.accumulation >= 1 && o.steps >= 0, "train: accumulation ", o.accumulation, ", steps ", o.steps,
                 "; expected at least 1 micro-batch per step and no negative step count");
  // Everything that can be checked alone is checked here, before the first collective, so that
  // every rank throws the same error at the same point (a rank throwing alone later would abort
  // peers in the middle of their collectives).
  (void)detail::make_schedule(o.schedule, o.pipeline, o.accumulation, o.virtual_stages);
  const auto& c = o.model;
  detail::check_model(c, static_cast<std::size_t>(o.tensor), static_cast<std::size_t>(o.pipeline * o.virtual_stages), "train");
  {
    // The shards: present, well-formed, and large enough for a global batch.
    const int d = world.size() / (o.tensor * o.pipeline);
    const trident::data::shard_loader check(o.train_files, o.micro_batch, c.seq, 0, d);
    if (o.eval_every > 0 && !o.val_files.empty()) (void)trident::data::shard_loader(o.val_files, o.micro_batch, c.seq, 0, d);
  }
  trident::process_grid grid(world, o.tensor, o.pipeline);
  std::vector<step_report> out;
  detail::with_zero_stage(o.zero_stage, [&](auto stage) {
    out = detail::run<decltype(stage)::value, Precision>(world, grid, o, on_step);
  });
  return out;
}

}  // namespace flagship
