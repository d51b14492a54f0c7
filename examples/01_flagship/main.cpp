// trident's flagship: a GPT-2-style model trained from trident's parts (gpt.hpp, trainer.hpp) on
// a (data, tensor, pipeline) process grid with ZeRO on the data axis, on thread ranks of this
// process (the default: no GPU, no launcher) or on MPI ranks.
//
//   ./flagship                                  4 thread ranks: (d, t, p) = (1, 2, 2), ZeRO-1,
//                                               the KJV shards of scripts/prepare_data.py
//   ./flagship --ranks 8 --tensor 2 --pipeline 2 --zero 3 --steps 300
//   mpirun -np 4 ./flagship --backend mpi --tensor 2
//   mpirun -np 4 ./flagship --backend nccl --tensor 2 --pipeline 2   one GPU per rank (gpt_cuda.cuh:
//                                                                     fp32 or bf16; 1, 2 or 4 stages)
//   ./flagship --help
//
// It prints each rank's memory by category after the first step, a progress line per step
// (loss, learning rate, tokens/s, MFU against this machine's measured GEMM rate, loss scale,
// gradient norm, time left) and a validation loss every --eval-every steps, and writes the loss
// curve as CSV and SVG and one step's timeline as a Chrome trace (--out). A run whose training
// loss stops being finite ends there with an error (exit status 1). Under MPI every rank must be
// started with the same options, and an error is printed by the rank that met it.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ds_config.hpp"
#include "report.hpp"
#include "train_instances.hpp"  // the trainer, compiled in train_<precision>.cpp
#include "trainer.hpp"
#include "trident/comm/local.hpp"
#include "trident/core/config.hpp"
#include "trident/core/memory_ledger.hpp"
#ifndef FLAGSHIP_HAS_CUDA
#define FLAGSHIP_HAS_CUDA 0
#endif
#if TRIDENT_HAS_MPI
#include "trident/comm/mpi.hpp"
#endif
#if FLAGSHIP_HAS_CUDA
#include "train_cuda.hpp"
#include "trident/core/cuda_runtime.hpp"
#endif

namespace {

struct settings {
  std::string backend = "local";
  int ranks = 4;
  std::string config;                   // a DeepSpeed-style JSON file (ds_config.hpp)
  std::string data = "build/data/kjv";  // PREFIX_train.bin, PREFIX_val.bin
  std::string train_file, val_file;     // from a config: the shards themselves
  std::string out = "build/flagship";   // loss.csv, loss.svg, trace.json
  std::string loss_csv, loss_svg;       // from a config, else in `out`
  flagship::train_options train;
  std::string precision = "fp32";  // fp32, bf16, fp16
  std::string attention = "auto";  // --attention, trident.attention (flagship::resolve_attention)
  long warmup = 20;
  double min_lr_ratio = 0.1;
  std::string schedule;  // the learning rate's schedule, as the banner names it
  std::vector<std::string> ignored;  // DeepSpeed keys of the config that trident does not use
  std::string trace;                 // from a config, else DIR/trace.json
};

constexpr const char* usage = R"(usage: flagship [options]
  --backend local|mpi|nccl   thread ranks of this process (default), MPI ranks (under mpirun), or
                         NCCL ranks on GPUs (under mpirun; one GPU per rank, fp32 or bf16, 1, 2
                         or 4 pipeline stages)
  --share-gpu            nccl: every rank on GPU 0 (NCCL over sockets: for checking, not speed)
  --ranks N              thread ranks (default 4)
  --config FILE          a DeepSpeed config with a "trident" section (examples/01_flagship/configs);
                         the options below override it
  --tensor T --pipeline P --virtual V --schedule gpipe|1f1b|interleaved --zero 0..3
  --precision fp32|bf16|fp16   working weights and gradients (fp32 master weights otherwise)
  --gemm fp32|tf32|bf16  nccl: the GEMMs' math (default: fp32 for fp32, tf32 tensor cores for
                         bf16; fp32 is the host's arithmetic; bf16 rounds the operands to bf16
                         for bf16 tensor cores, float results, as PyTorch's autocast)
  --attention auto|standard|flash|flash_bf16   attention's core: the [seq, seq] probabilities
                         kept (standard), or (nccl) tiles keeping one value per row, on TF32
                         tensor cores (flash) or bf16 ones with the scores in registers
                         (flash_bf16: 15% faster in bf16 on an H200); head_dim 32 or 64, compute
                         capability 8.0+. auto (the default): flash_bf16 for bf16 on nccl where
                         head_dim is 32 or 64, else standard
  --steps N --micro-batch B --accumulation M --lr LR --warmup N --clip NORM --seed S
  --layers L --hidden H --heads A --seq T --sequence-parallel
  --recompute none|selective|full   activations kept for backward: all; all but attention's
                         probabilities (recomputed); each block's input only (its forward rerun)
  --data PREFIX          shards PREFIX_train.bin and PREFIX_val.bin (default build/data/kjv,
                         made by: python3 scripts/prepare_data.py --out build/data)
  --eval-every N         validation loss every N steps (default 50; 0: never)
  --trace-step N         write step N's timeline (Chrome trace) to DIR/trace.json (default 2; 0: none)
  --out DIR              loss.csv, loss.svg and trace.json (default build/flagship)
  --save DIR --save-every N --keep K
                         a checkpoint every N steps into DIR (asynchronous; the newest K kept,
                         default all); docs/checkpoint_format.md
  --resume               continue from the newest good checkpoint in DIR (--save's; saved in any
                         grid layout and ZeRO stage, with the same global batch) up to --steps;
                         says which newer ones it went past and why, or that there was none

A training loss that is not finite (the model diverged) ends the run with an error.
)";

using arguments = std::vector<std::pair<std::string, std::string>>;  // (option, value)

// The options and their values, checked for names and arity; applied later, once the world
// size is known (a config's batch sizes depend on it).
arguments collect(int argc, char** argv) {
  static const std::vector<std::string> flags{"--sequence-parallel", "--resume", "--share-gpu"};
  static const std::vector<std::string> valued{"--backend", "--ranks", "--config", "--tensor", "--pipeline", "--virtual", "--schedule",
                                               "--zero", "--steps", "--micro-batch", "--accumulation", "--lr", "--warmup", "--clip",
                                               "--seed", "--precision", "--layers", "--hidden", "--heads", "--seq", "--data", "--eval-every",
                                               "--trace-step", "--out", "--save", "--save-every", "--keep", "--recompute", "--gemm",
                                               "--attention"};
  arguments out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (std::find(flags.begin(), flags.end(), a) != flags.end()) {
      out.emplace_back(a, "");
    } else if (std::find(valued.begin(), valued.end(), a) != valued.end()) {
      TRIDENT_EXPECT(i + 1 < argc, "flagship: ", a, " expects a value");
      out.emplace_back(a, argv[++i]);
    } else {
      throw trident::usage_error("flagship: unknown option '" + a + "' (see --help)");
    }
  }
  return out;
}

std::string option(const arguments& args, const std::string& name, std::string fallback) {
  for (const auto& [k, v] : args)
    if (k == name) fallback = v;
  return fallback;
}

// An integer option's value in [lo, hi]. Out of range is an error naming the option: a negative
// size once wrapped to a huge one (--layers -2 allocated until it ran out of memory), and values
// beyond the field's type were cut silently (--tensor 4294967298 ran as 2).
long integer(const std::string& option, const std::string& v, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v.c_str(), &end, 10);
  TRIDENT_EXPECT(!v.empty() && *end == '\0', "flagship: ", option, " expects an integer, got '", v, "'");
  TRIDENT_EXPECT(errno != ERANGE && n >= lo && n <= hi, "flagship: ", option, " ", v, " is out of range; expected an integer in [",
                 lo, ", ", hi, "]");
  return n;
}
constexpr long int_max = std::numeric_limits<int>::max(), long_max = std::numeric_limits<long>::max();
// Model and batch dimensions: bounds far above any model a machine holds, so that a typo is named
// instead of attempted (and products of them cannot wrap).
constexpr long dim_max = long{1} << 24;
// Grid sizes (t, p, virtual stages): their products stay within int.
constexpr long grid_max = long{1} << 15;
float real(const std::string& option, const std::string& v) {
  char* end = nullptr;
  const float x = std::strtof(v.c_str(), &end);
  TRIDENT_EXPECT(!v.empty() && *end == '\0', "flagship: ", option, " expects a number, got '", v, "'");
  return x;
}

// The default run: small enough to learn visibly in a minute or two on two cores, with tensor
// and pipeline parallelism both active.
void defaults(settings& s) {
  auto& o = s.train;
  o.model = {.vocab = 256, .seq = 64, .hidden = 128, .heads = 4, .layers = 4, .ffn = 0};
  o.tensor = 2;
  o.pipeline = 2;
  o.zero_stage = 1;
  o.micro_batch = 8;
  o.accumulation = 4;
  o.steps = 500;
  o.max_grad_norm = 1.0f;
  o.adamw = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  o.eval_every = 50;
  o.eval_batches = 8;
  o.trace_step = 2;  // the first step allocates; the second is a typical one
}

// PyTorch-style: a linear warm-up, then a cosine down to min_lr_ratio x lr at the last step.
void default_schedule(settings& s) {
  auto& o = s.train;
  const double lr = o.adamw.lr, floor = s.min_lr_ratio * lr;
  const long warmup = std::max<long>(1, s.warmup), total = o.steps;
  s.schedule = trident::detail::concat("warm-up ", warmup, " then cosine to ", s.min_lr_ratio, " x lr");
  o.lr = [=](std::int64_t step) {
    if (step <= warmup) return lr * static_cast<double>(step) / static_cast<double>(warmup);
    const double t = static_cast<double>(step - warmup) / static_cast<double>(std::max<long>(1, total - warmup));
    return floor + (lr - floor) * 0.5 * (1.0 + std::cos(3.14159265358979323846 * std::min(1.0, t)));
  };
}

// A DeepSpeed config (with trident's section) as the trainer's options. The schedulers are
// DeepSpeed's own, as its engine steps them (optim/schedule.hpp, checked against DeepSpeed).
void from_config(settings& s, const std::string& path, int world_size) {
  const auto c = flagship::load_config(path, world_size);
  flagship::check_layout(c, world_size);
  TRIDENT_EXPECT(c.optimizer.decoupled_weight_decay || c.optimizer.weight_decay == 0.0f, "flagship: ", path,
                 " asks for Adam with L2 weight decay (adam_w_mode false); the trainer is compiled with AdamW");
  auto& o = s.train;
  const auto& t = c.trident;
  o.model = {.vocab = t.model.vocab_size, .seq = t.model.seq_len, .hidden = t.model.hidden, .heads = t.model.heads,
             .layers = t.model.layers, .ffn = t.model.ffn, .sequence_parallel = t.sequence_parallel,
             .recompute = flagship::parse_recompute(t.recompute)};
  s.attention = t.attention;
  o.tensor = t.tensor_parallel;
  o.pipeline = t.pipeline_parallel;
  o.virtual_stages = t.virtual_stages;
  o.schedule = t.schedule;
  o.zero_stage = c.zero.stage;
  o.micro_batch = static_cast<std::size_t>(c.micro_batch);
  o.accumulation = c.gradient_accumulation_steps;
  o.steps = static_cast<long>(t.steps);
  o.max_grad_norm = c.gradient_clipping;
  o.adamw = {.lr = static_cast<float>(c.optimizer.lr), .beta1 = c.optimizer.beta1, .beta2 = c.optimizer.beta2,
             .eps = c.optimizer.eps, .weight_decay = c.optimizer.weight_decay};
  o.bucket_elements = c.zero.reduce_bucket_size;
  o.first_bucket_elements = std::min<std::size_t>(c.zero.reduce_bucket_size, 1'000'000);
  o.persistence_threshold = c.zero.stage3_param_persistence_threshold;
  o.eval_every = static_cast<long>(t.eval_every);
  o.eval_batches = t.eval_batches;
  o.seed = t.seed;
  if (c.precision == flagship::precision_kind::bf16) s.precision = "bf16";
  if (c.precision == flagship::precision_kind::fp16) {
    s.precision = "fp16";
    auto& d = o.dynamic_scaler;
    if (c.fp16.loss_scale == 0) {
      d.initial_scale = std::ldexp(1.0, c.fp16.initial_scale_power);
      d.window = c.fp16.loss_scale_window;
      d.hysteresis = c.fp16.hysteresis;
      d.consecutive_hysteresis = c.fp16.consecutive_hysteresis;
      d.min_scale = c.fp16.min_loss_scale;
    } else {  // a fixed scale: it can neither grow nor shrink, and overflowing steps are skipped
      d.initial_scale = d.min_scale = d.max_scale = c.fp16.loss_scale;
      d.raise_error_at_min_scale = false;
    }
  }
  if (!t.trace.empty()) s.trace = t.trace;
  namespace optim = trident::optim;
  const auto& sc = c.scheduler;
  const auto kind = sc.warmup_type == "linear" ? optim::warmup_kind::linear : optim::warmup_kind::log;
  s.schedule = trident::detail::concat(sc.type.empty() ? std::string("a constant lr") : sc.type, " (", path, ")");
  if (sc.type == "WarmupLR") {
    const optim::warmup_lr f{.min_lr = sc.warmup_min_lr, .max_lr = sc.warmup_max_lr, .warmup_steps = sc.warmup_num_steps, .kind = kind};
    o.lr = f;
  } else if (sc.type == "WarmupDecayLR") {
    optim::warmup_decay_lr f;
    f.min_lr = sc.warmup_min_lr;
    f.max_lr = sc.warmup_max_lr;
    f.warmup_steps = sc.warmup_num_steps;
    f.kind = kind;
    f.total_steps = sc.total_num_steps;
    o.lr = f;
  } else if (sc.type == "WarmupCosineLR") {
    o.lr = optim::warmup_cosine_lr{.lr = c.optimizer.lr, .total_steps = sc.total_num_steps, .warmup_min_ratio = sc.warmup_min_ratio,
                                   .warmup_steps = sc.warmup_num_steps, .cos_min_ratio = sc.cos_min_ratio, .kind = kind};
  } else {
    const double lr = c.optimizer.lr;
    o.lr = [lr](std::int64_t) { return lr; };
  }
  s.train_file = t.train_data;
  s.val_file = t.val_data;
  s.loss_csv = t.loss_csv;
  s.loss_svg = t.loss_svg;
  s.ignored = c.ignored;
}

// The precision named at run time, as the compiled instantiation of train.
template <class F>
void with_precision(const std::string& name, F&& f) {
  if (name == "bf16") f(trident::mixed_precision<trident::bf16>{});
  else if (name == "fp16") f(trident::mixed_precision<trident::fp16>{});
  else f(trident::full_precision{});
}

// flagship::train<Precision> as a callable for run().
template <class Precision>
struct trainer {
  template <class Comm, class OnStep>
  std::vector<flagship::step_report> operator()(Comm& world, const flagship::train_options& o, const OnStep& on_step) const {
    return flagship::train<Precision>(world, o, on_step);
  }
};

// Defaults, then the config, then the command line.
settings build(const arguments& args, int world_size) {
  settings s;
  defaults(s);
  s.backend = option(args, "--backend", s.backend);
  s.config = option(args, "--config", "");
  bool schedule_given = false;
  if (!s.config.empty()) {
    from_config(s, s.config, world_size);
    schedule_given = true;
  }
  auto& o = s.train;
  for (const auto& [a, v] : args) {
    if (a == "--tensor") o.tensor = static_cast<int>(integer(a, v, 1, grid_max));
    else if (a == "--pipeline") o.pipeline = static_cast<int>(integer(a, v, 1, grid_max));
    else if (a == "--virtual") o.virtual_stages = static_cast<int>(integer(a, v, 1, grid_max));
    else if (a == "--schedule") o.schedule = v;
    else if (a == "--zero") o.zero_stage = static_cast<int>(integer(a, v, 0, 3));
    else if (a == "--steps") o.steps = integer(a, v, 0, long_max);
    else if (a == "--micro-batch") o.micro_batch = static_cast<std::size_t>(integer(a, v, 1, dim_max));
    else if (a == "--accumulation") o.accumulation = static_cast<int>(integer(a, v, 1, dim_max));
    else if (a == "--lr") {
      o.adamw.lr = real(a, v);
      schedule_given = false;
    } else if (a == "--warmup") {
      s.warmup = integer(a, v, 0, long_max);
      schedule_given = false;
    } else if (a == "--clip") o.max_grad_norm = real(a, v);
    else if (a == "--seed") o.seed = static_cast<std::uint64_t>(integer(a, v, std::numeric_limits<long>::min(), long_max));  // any bits
    else if (a == "--precision") s.precision = v;
    else if (a == "--layers") o.model.layers = static_cast<std::size_t>(integer(a, v, 1, dim_max));
    else if (a == "--hidden") o.model.hidden = static_cast<std::size_t>(integer(a, v, 1, dim_max));
    else if (a == "--heads") o.model.heads = static_cast<std::size_t>(integer(a, v, 1, dim_max));
    else if (a == "--seq") o.model.seq = static_cast<std::size_t>(integer(a, v, 1, dim_max));
    else if (a == "--sequence-parallel") o.model.sequence_parallel = true;
    else if (a == "--recompute") o.model.recompute = flagship::parse_recompute(v);
    else if (a == "--data") {
      s.data = v;
      s.train_file.clear();
      s.val_file.clear();
    } else if (a == "--eval-every") o.eval_every = integer(a, v, 0, long_max);
    else if (a == "--trace-step") o.trace_step = integer(a, v, 0, long_max);
    else if (a == "--out") s.out = v;
    else if (a == "--save") o.checkpoint_dir = v;
    else if (a == "--save-every") o.save_every = integer(a, v, 0, long_max);
    else if (a == "--keep") o.keep_checkpoints = static_cast<int>(integer(a, v, 0, int_max));
    else if (a == "--resume") o.resume = true;
    else if (a == "--attention") s.attention = v;
    else if (a == "--gemm") {
      using trident::nn::gemm_math;
      TRIDENT_EXPECT(v == "fp32" || v == "tf32" || v == "bf16", "flagship: --gemm ", v, "; expected fp32, tf32 or bf16");
      o.gpu_gemm = v == "fp32" ? gemm_math::fp32 : v == "tf32" ? gemm_math::tf32 : gemm_math::bf16;
      o.model.bf16_gemm = v == "bf16";  // the head's GEMMs and the blocks' (gpt_config::bf16_gemm)
    }
  }
  if (!schedule_given) {
    const bool replaced = !s.config.empty();  // --lr or --warmup: the command line's schedule, not the config's
    default_schedule(s);
    if (replaced) s.schedule += " (--lr / --warmup replace the config's learning-rate schedule)";
  }
  TRIDENT_EXPECT(s.precision == "fp32" || s.precision == "bf16" || s.precision == "fp16",
                 "flagship: --precision ", s.precision, "; expected fp32, bf16 or fp16");
  // The command line's or the config's attention, auto resolved for this run.
  const auto attention = flagship::resolve_attention(s.attention, s.backend, s.precision, o.model.hidden, o.model.heads);
  o.model.flash_attention = attention.flash;
  o.model.flash_bf16 = attention.bf16;
  // Before the banner, which prints d = world / (t x p).
  TRIDENT_EXPECT(o.tensor >= 1 && o.pipeline >= 1 && world_size % (o.tensor * o.pipeline) == 0, "flagship: a world of ", world_size,
                 " ranks is not d x t x p for t = ", o.tensor, " and p = ", o.pipeline, "; expected a multiple of ",
                 o.tensor * o.pipeline, " ranks");
  return s;
}

// writes_output: this process writes the loss curve and the trace (rank 0's), whose paths are
// checked here, before training, instead of failing after it.
void require_data(settings& s, bool writes_output) {
  auto& o = s.train;
  o.train_files = {s.train_file.empty() ? s.data + "_train.bin" : s.train_file};
  o.val_files = {s.val_file.empty() ? s.data + "_val.bin" : s.val_file};
  for (const auto& f : {o.train_files[0], o.val_files[0]})
    TRIDENT_EXPECT(std::filesystem::exists(f), "flagship: the data file '", f, "' does not exist; make it with "
                   "`python3 scripts/prepare_data.py --out build/data` or name your shards with --data PREFIX");
  std::filesystem::create_directories(s.out);
  o.trace_file = s.trace.empty() ? s.out + "/trace.json" : s.trace;
  if (s.loss_csv.empty()) s.loss_csv = s.out + "/loss.csv";
  if (s.loss_svg.empty()) s.loss_svg = s.out + "/loss.svg";
  if (!writes_output) return;
  std::vector<std::pair<std::string, const char*>> outputs{{s.loss_csv, "the loss curve's CSV"}, {s.loss_svg, "the loss curve's SVG"}};
  if (o.trace_step > 0) outputs.emplace_back(o.trace_file, "the trace");
  for (const auto& [path, what] : outputs) {
    const bool existed = std::filesystem::exists(path);
    const bool writable = std::ofstream(path, std::ios::app).good();
    if (!existed) std::filesystem::remove(path);
    TRIDENT_EXPECT(writable, "flagship: cannot write ", what, " to '", path, "'; expected a writable path (--out, or the config's)");
  }
}

// Trains on `world` with `train(world, options, on_step)` (flagship::train<Precision>, or the GPU
// trainer); rank 0 prints the progress and writes the curve.
template <class Comm, class Train>
void run(Comm& world, const settings& s, double peak_flops, Train&& train) {
  const auto& o = s.train;
  const bool speaker = world.rank() == 0;
  const int d = world.size() / (o.tensor * o.pipeline);
  const long long micro_batches = static_cast<long long>(d) * o.accumulation;  // of B rows each, per step
  // The GPU path's GEMM math (run()'s default: fp32 for fp32, TF32 tensor cores for bf16).
  const std::string gemm = s.backend != "nccl" ? ""
                           : std::string(", GEMMs ") + trident::nn::name(o.gpu_gemm.value_or(
                                 s.precision == "bf16" ? trident::nn::gemm_math::tf32 : trident::nn::gemm_math::fp32));
  if (speaker)
    std::printf("trident %s flagship: GPT %zu layers, hidden %zu, %zu heads, seq %zu, vocab %zu = %.2fM parameters\n"
                "  %d %s ranks as (data, tensor, pipeline) = (%d, %d, %d)%s, %d stage%s, schedule %s, ZeRO-%d, %s%s%s%s%s\n"
                "  global batch %lld x %zu x %zu = %lld tokens (micro-batch %zu, accumulation %d); AdamW lr %.1e, %s, clip %.2f\n",
                trident::version_string, o.model.layers, o.model.hidden, o.model.heads, o.model.seq, o.model.vocab,
                static_cast<double>(o.model.parameters()) / 1e6, world.size(),
                s.backend == "mpi" ? "MPI" : s.backend == "nccl" ? "NCCL (GPU)" : "thread", d, o.tensor,
                o.pipeline, o.model.sequence_parallel ? " + sequence parallel" : "", o.pipeline * o.virtual_stages,
                o.pipeline * o.virtual_stages == 1 ? "" : "s", o.schedule.c_str(), o.zero_stage, s.precision.c_str(),
                o.model.recompute == flagship::recompute_mode::none ? "" : ", recompute ",
                o.model.recompute == flagship::recompute_mode::none ? "" : flagship::name_of(o.model.recompute),
                o.model.flash_bf16 ? ", flash attention (bf16 tiles)" : o.model.flash_attention ? ", flash attention" : "",
                gemm.c_str(), micro_batches, o.micro_batch, o.model.seq, micro_batches * static_cast<long long>(o.micro_batch * o.model.seq), o.micro_batch,
                o.accumulation,
                static_cast<double>(o.adamw.lr), s.schedule.c_str(), static_cast<double>(o.max_grad_norm));
  if (speaker && !s.ignored.empty()) {
    std::printf("  %s: DeepSpeed keys trident does not use (ignored):", s.config.c_str());
    for (const auto& k : s.ignored) std::printf(" %s", k.c_str());
    std::printf("\n");
  }
  flagship::progress bar{o.steps, o.model.flops_per_token(), peak_flops};
  const bool tty = isatty(STDOUT_FILENO) != 0;
  const bool scaled = s.precision.starts_with("fp16");
  bool first_step = true;
  const auto reports = train(world, o, [&](const flagship::step_report& r) {
    if (first_step) {  // memory by category once everything is allocated, rank after rank
      first_step = false;
      for (int k = 0; k < world.size(); ++k) {
        if (k == world.rank()) {
          std::printf("%s", trident::current_ledger()->report().c_str());
          std::fflush(stdout);
        }
        world.barrier();
      }
    }
    const bool finite = std::isfinite(r.loss);
    if (speaker) {
      if (scaled) {  // up to 2^127 with initial_scale_power 127: beyond long long
        char scale[32];
        std::snprintf(scale, sizeof scale, r.loss_scale < 1e15 ? "%.0f" : "%.3g", r.loss_scale);
        bar.loss_scale = scale;
      }
      const std::string line = bar.line(r);
      const bool keep = !tty || !finite || r.step == o.steps || r.validated || r.step % 25 == 0;
      std::printf(tty ? "\r\033[K%s%s" : "%s%s", line.c_str(), keep ? "\n" : "");
      std::fflush(stdout);
    }
    // A non-finite training loss does not come back: the run stops there (as Megatron-LM's
    // check for NaN in the loss does) instead of reporting NaN to the end and exiting 0. Every
    // rank sees the same loss, so every rank stops at the same step.
    if (!finite)
      throw trident::error(trident::detail::concat("flagship: step ", r.step, ": the training loss is ", r.loss,
                                                   "; the model diverged or its input is not finite (lr was ", r.lr,
                                                   " this step: a smaller --lr or the config's optimizer lr may help); "
                                                   "stopped here rather than train on it"));
  });
  if (!speaker) return;
  if (reports.empty()) {
    if (o.resume && o.steps > 0)
      std::printf("nothing to train: the checkpoint in %s is at step %ld or later (--steps)\n", o.checkpoint_dir.c_str(), o.steps);
    else
      std::printf("nothing to train: --steps %ld\n", o.steps);
    return;
  }
  if (reports.front().step > 1) std::printf("resumed from the checkpoint of step %ld in %s\n", reports.front().step - 1, o.checkpoint_dir.c_str());
  const auto& csv = s.loss_csv;
  const auto& svg = s.loss_svg;
  flagship::write_loss_csv(csv, reports);
  char title[160];
  std::snprintf(title, sizeof title, "GPT %zu x %zu on (d, t, p) = (%d, %d, %d), ZeRO-%d, %s", o.model.layers, o.model.hidden, d,
                o.tensor, o.pipeline, o.zero_stage, s.precision.c_str());
  flagship::write_loss_svg(svg, reports, title);
  std::printf("loss %.4f -> %.4f over steps %ld-%ld; curve in %s and %s", reports.front().loss, reports.back().loss,
              reports.front().step, reports.back().step, csv.c_str(), svg.c_str());
  if (o.trace_step >= reports.front().step && o.trace_step <= o.steps)  // a resumed run may start past it
    std::printf("; step %ld's timeline in %s (open it in https://ui.perfetto.dev)", o.trace_step, o.trace_file.c_str());
  std::printf("\n");
}

// An error already printed (by the rank that met it, under MPI).
struct reported {};

#if TRIDENT_HAS_MPI
// Every MPI rank must train with the same options: ranks started with different --steps once
// finished on some while the others waited in a collective, and a different --seed or
// --micro-batch trained on without a word. Paths may differ per node (--data, --out, --save,
// --config's path); the config's contents may not. Checked before anything else runs.
void require_same_options(const arguments& args, int rank, int size) {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a over the options, the values and the config's text
  const auto mix = [&](const std::string& text) {
    for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;  // a separator
  };
  std::string unreadable;  // named after the exchange: every rank joins it first
  for (const auto& [k, v] : args) {
    mix(k);
    if (k == "--config") {
      std::ifstream in(v, std::ios::binary);
      if (!in) unreadable = v;
      mix(in ? std::string{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()} : std::string("\x01unreadable"));
    } else if (k != "--data" && k != "--out" && k != "--save") {
      mix(v);
    }
  }
  std::vector<std::uint64_t> all(static_cast<std::size_t>(size));
  MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  TRIDENT_EXPECT(unreadable.empty(), "flagship: cannot open config file '", unreadable, "' on rank ", rank);
  std::string differ;
  for (int r = 1; r < size; ++r)
    if (all[static_cast<std::size_t>(r)] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  TRIDENT_EXPECT(differ.empty(), "flagship: ranks ", differ, " were started with other options or another config than rank 0 "
                 "(rank ", rank, " of ", size, "); every rank needs the same ones (paths to data, output and checkpoints may differ)");
}

// An MPI job's body: an error is printed here, by the rank that met it. When a rank fails alone,
// mpi_environment's destructor ends the job with MPI_Abort while the exception unwinds, so
// main's own handler would never print it; when every rank fails alike, they finalize and
// main returns 1.
template <class Body>
int on_mpi(int argc, char** argv, const arguments& args, Body&& body) {
  trident::mpi_environment env(argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  try {
    require_same_options(args, rank, size);
    body(rank, size);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flagship: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    throw reported{};  // still an exception for the environment's destructor; main prints nothing more
  }
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto args = collect(argc, argv);
    const std::string backend = option(args, "--backend", "local");
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    TRIDENT_EXPECT(backend == "nccl" || option(args, "--gemm", "").empty(), "flagship: --gemm is the GPU path's (--backend nccl); "
                   "the ", backend, " backend computes its GEMMs in float");
    // An unknown --attention, or a flash one off the GPU path, is named before anything starts
    // on every backend (build() resolves it again with the config's and the model's settings).
    (void)flagship::resolve_attention(option(args, "--attention", "auto"), backend, "", 0, 0);
    if (backend == "local") {
      const int ranks = static_cast<int>(integer("--ranks", option(args, "--ranks", "4"), 1, 4096));
      TRIDENT_EXPECT(ranks >= 1, "flagship: expected at least one rank, got ", ranks);
      auto s = build(args, ranks);
      require_data(s, true);
      const double peak = flagship::measured_gemm_flops() * std::min<unsigned>(cores, static_cast<unsigned>(ranks));
      with_precision(s.precision, [&](auto precision) {
        trident::local_world::run(ranks, [&](trident::local_comm& world) { run(world, s, peak, trainer<decltype(precision)>{}); });
      });
      return 0;
    }
#if TRIDENT_HAS_MPI
    if (backend == "mpi") {
      return on_mpi(argc, argv, args, [&](int rank, int) {
        auto world = trident::mpi_comm::world();
        auto s = build(args, world.size());
        require_data(s, rank == 0);
        const double peak = flagship::measured_gemm_flops() * std::min<unsigned>(cores, static_cast<unsigned>(world.size()));
        with_precision(s.precision, [&](auto precision) { run(world, s, peak, trainer<decltype(precision)>{}); });
      });
    }
#endif
#if FLAGSHIP_HAS_CUDA
    if (backend == "nccl") {
      return on_mpi(argc, argv, args, [&](int rank, int size) {
        auto s = build(args, size);
        TRIDENT_EXPECT(s.precision == "fp32" || s.precision == "bf16", "flagship: --precision ", s.precision,
                       " with --backend nccl: the GPU path trains in fp32 or bf16 for now (fp16 runs on thread and MPI ranks)");
        require_data(s, rank == 0);
        const bool share = std::any_of(args.begin(), args.end(), [](const auto& a) { return a.first == "--share-gpu"; });
        const int devices = trident::cuda_device_count();
        TRIDENT_EXPECT(devices > 0, "flagship: --backend nccl on rank ", rank, ": no CUDA device is visible (no GPU or no driver); "
                       "use --backend local or mpi here");
        const int device = share ? 0 : rank % devices;
        TRIDENT_CUDA_CHECK(cudaSetDevice(device));
        if (s.attention == "auto" && s.train.model.flash_bf16) {  // auto's tiles need bf16 tensor cores (8.0+)
          int major = 0;
          TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
          if (major < 8) s.train.model.flash_attention = s.train.model.flash_bf16 = false;
        }
        auto world = trident::nccl_comm::from_mpi(MPI_COMM_WORLD, {.host_id_per_rank = share});
        // MFU against the GPUs' measured GEMM rate in the run's math, summed over the ranks (ranks
        // sharing a GPU measure it at the same time, so their sum is about one GPU's).
        const auto math = s.train.gpu_gemm.value_or(s.precision == "bf16" ? trident::nn::gemm_math::tf32 : trident::nn::gemm_math::fp32);
        double peak = flagship::cuda::gpu_gemm_flops(math);
        MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        run(world, s, peak, [bf16 = s.precision == "bf16"](trident::nccl_comm& w, const flagship::train_options& o, const auto& on_step) {
          // bf16: bf16 working weights and gradients, GEMMs on TF32 tensor cores unless --gemm says
          // otherwise (gpt_cuda.cuh).
          return bf16 ? flagship::cuda::train_on_gpus<trident::mixed_precision<trident::bf16>>(w, o, on_step)
                      : flagship::cuda::train_on_gpus(w, o, on_step);
        });
      });
    }
#endif
    throw trident::usage_error("flagship: --backend " + backend + " is not available in this build (local" +
                               std::string(trident::has_mpi ? ", mpi" : "") + std::string(FLAGSHIP_HAS_CUDA ? ", nccl" : "") + ")");
  } catch (const reported&) {
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flagship: %s\n", e.what());
    return 1;
  }
}
