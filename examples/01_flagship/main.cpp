// trident's flagship: a GPT-2-style model trained from trident's parts (gpt.hpp, trainer.hpp) on
// a (data, tensor, pipeline) process grid with ZeRO on the data axis, on thread ranks of this
// process (the default: no GPU, no launcher) or on MPI ranks.
//
//   ./flagship                                  4 thread ranks: (d, t, p) = (1, 2, 2), ZeRO-1,
//                                               the KJV shards of scripts/prepare_data.py
//   ./flagship --ranks 8 --tensor 2 --pipeline 2 --zero 3 --steps 300
//   mpirun -np 4 ./flagship --backend mpi --tensor 2
//   ./flagship --help
//
// It prints each rank's memory by category after the first step, a progress line per step
// (loss, learning rate, tokens/s, MFU against this machine's measured GEMM rate, loss scale,
// gradient norm, time left) and a validation loss every --eval-every steps, and writes the loss
// curve as CSV and SVG (--out).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "report.hpp"
#include "trainer.hpp"
#include "trident/comm/local.hpp"
#include "trident/core/config.hpp"
#include "trident/core/memory_ledger.hpp"
#if TRIDENT_HAS_MPI
#include "trident/comm/mpi.hpp"
#endif

namespace {

struct settings {
  std::string backend = "local";
  int ranks = 4;
  std::string data = "build/data/kjv";  // PREFIX_train.bin, PREFIX_val.bin
  std::string out = "build/flagship";   // loss.csv, loss.svg
  flagship::train_options train;
  long warmup = 20;
  double min_lr_ratio = 0.1;
};

constexpr const char* usage = R"(usage: flagship [options]
  --backend local|mpi    thread ranks of this process (default) or MPI ranks (under mpirun)
  --ranks N              thread ranks (default 4)
  --tensor T --pipeline P --virtual V --schedule gpipe|1f1b|interleaved --zero 0..3
  --steps N --micro-batch B --accumulation M --lr LR --warmup N --clip NORM --seed S
  --layers L --hidden H --heads A --seq T --sequence-parallel
  --data PREFIX          shards PREFIX_train.bin and PREFIX_val.bin (default build/data/kjv,
                         made by: python3 scripts/prepare_data.py --out build/data)
  --eval-every N         validation loss every N steps (default 50; 0: never)
  --out DIR              loss.csv and loss.svg (default build/flagship)
)";

settings parse(int argc, char** argv) {
  settings s;
  auto& o = s.train;
  // The default: small enough to learn visibly in a minute or two on two cores, with tensor and
  // pipeline parallelism both active.
  o.model = {.vocab = 256, .seq = 64, .hidden = 128, .heads = 4, .layers = 4, .ffn = 0};
  o.tensor = 2;
  o.pipeline = 2;
  o.zero_stage = 1;
  o.micro_batch = 8;
  o.accumulation = 4;
  o.steps = 150;
  o.max_grad_norm = 1.0f;
  o.adamw = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  o.eval_every = 50;
  o.eval_batches = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      TRIDENT_EXPECT(i + 1 < argc, "flagship: ", a, " expects a value");
      return argv[++i];
    };
    auto number = [&]() -> long {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      TRIDENT_EXPECT(!v.empty() && *end == '\0', "flagship: ", a, " expects an integer, got '", v, "'");
      return n;
    };
    if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    } else if (a == "--backend") s.backend = value();
    else if (a == "--ranks") s.ranks = static_cast<int>(number());
    else if (a == "--tensor") o.tensor = static_cast<int>(number());
    else if (a == "--pipeline") o.pipeline = static_cast<int>(number());
    else if (a == "--virtual") o.virtual_stages = static_cast<int>(number());
    else if (a == "--schedule") o.schedule = value();
    else if (a == "--zero") o.zero_stage = static_cast<int>(number());
    else if (a == "--steps") o.steps = number();
    else if (a == "--micro-batch") o.micro_batch = static_cast<std::size_t>(number());
    else if (a == "--accumulation") o.accumulation = static_cast<int>(number());
    else if (a == "--lr") o.adamw.lr = std::stof(value());
    else if (a == "--warmup") s.warmup = number();
    else if (a == "--clip") o.max_grad_norm = std::stof(value());
    else if (a == "--seed") o.seed = static_cast<std::uint64_t>(number());
    else if (a == "--layers") o.model.layers = static_cast<std::size_t>(number());
    else if (a == "--hidden") o.model.hidden = static_cast<std::size_t>(number());
    else if (a == "--heads") o.model.heads = static_cast<std::size_t>(number());
    else if (a == "--seq") o.model.seq = static_cast<std::size_t>(number());
    else if (a == "--sequence-parallel") o.model.sequence_parallel = true;
    else if (a == "--data") s.data = value();
    else if (a == "--eval-every") o.eval_every = number();
    else if (a == "--out") s.out = value();
    else throw trident::usage_error("flagship: unknown option '" + a + "' (see --help)");
  }
  return s;
}

// PyTorch-style: a linear warm-up, then a cosine down to min_lr_ratio x lr at the last step.
void set_schedule(settings& s) {
  auto& o = s.train;
  const double lr = o.adamw.lr, floor = s.min_lr_ratio * lr;
  const long warmup = s.warmup, total = o.steps;
  o.lr = [=](std::int64_t step) {
    if (step <= warmup) return lr * static_cast<double>(step) / static_cast<double>(warmup);
    const double t = static_cast<double>(step - warmup) / static_cast<double>(std::max<long>(1, total - warmup));
    return floor + (lr - floor) * 0.5 * (1.0 + std::cos(3.14159265358979323846 * std::min(1.0, t)));
  };
}

void require_data(settings& s) {
  auto& o = s.train;
  o.train_files = {s.data + "_train.bin"};
  o.val_files = {s.data + "_val.bin"};
  for (const auto& f : {o.train_files[0], o.val_files[0]})
    TRIDENT_EXPECT(std::filesystem::exists(f), "flagship: the data file '", f, "' does not exist; make it with "
                   "`python3 scripts/prepare_data.py --out build/data` or name your shards with --data PREFIX");
}

// Trains on `world`; rank 0 prints the progress and writes the curve.
template <class Comm>
void run(Comm& world, const settings& s, double peak_flops) {
  const auto& o = s.train;
  const bool speaker = world.rank() == 0;
  const int d = world.size() / (o.tensor * o.pipeline);
  if (speaker)
    std::printf("trident %s flagship: GPT %zu layers, hidden %zu, %zu heads, seq %zu, vocab %zu = %.2fM parameters\n"
                "  %d %s ranks as (data, tensor, pipeline) = (%d, %d, %d)%s, %d stage%s, schedule %s, ZeRO-%d, fp32\n"
                "  global batch %d x %zu x %zu = %d tokens (micro-batch %zu, accumulation %d); AdamW lr %.1e, warm-up %ld, clip %.2f\n",
                trident::version_string, o.model.layers, o.model.hidden, o.model.heads, o.model.seq, o.model.vocab,
                static_cast<double>(o.model.parameters()) / 1e6, world.size(), s.backend == "mpi" ? "MPI" : "thread", d, o.tensor,
                o.pipeline, o.model.sequence_parallel ? " + sequence parallel" : "", o.pipeline * o.virtual_stages,
                o.pipeline * o.virtual_stages == 1 ? "" : "s", o.schedule.c_str(), o.zero_stage, d * o.accumulation, o.micro_batch,
                o.model.seq, d * o.accumulation * static_cast<int>(o.micro_batch * o.model.seq), o.micro_batch, o.accumulation,
                static_cast<double>(o.adamw.lr), s.warmup, static_cast<double>(o.max_grad_norm));
  flagship::progress bar{o.steps, o.model.flops_per_token(), peak_flops};
  const bool tty = isatty(STDOUT_FILENO) != 0;
  const auto reports = flagship::train(world, o, [&](const flagship::step_report& r) {
    if (r.step == 1) {  // memory by category once everything is allocated, rank after rank
      for (int k = 0; k < world.size(); ++k) {
        if (k == world.rank()) {
          std::printf("%s", trident::current_ledger()->report().c_str());
          std::fflush(stdout);
        }
        world.barrier();
      }
    }
    if (!speaker) return;
    const std::string line = bar.line(r);
    const bool keep = !tty || r.step == o.steps || !std::isnan(r.val_loss) || r.step % 25 == 0;
    std::printf(tty ? "\r\033[K%s%s" : "%s%s", line.c_str(), keep ? "\n" : "");
    std::fflush(stdout);
  });
  if (!speaker) return;
  std::filesystem::create_directories(s.out);
  const auto csv = s.out + "/loss.csv", svg = s.out + "/loss.svg";
  flagship::write_loss_csv(csv, reports);
  char title[160];
  std::snprintf(title, sizeof title, "GPT %zu x %zu on (d, t, p) = (%d, %d, %d), ZeRO-%d", o.model.layers, o.model.hidden, d, o.tensor,
                o.pipeline, o.zero_stage);
  flagship::write_loss_svg(svg, reports, title);
  std::printf("loss %.4f -> %.4f over %ld steps; curve in %s and %s\n", reports.front().loss, reports.back().loss, o.steps,
              csv.c_str(), svg.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto s = parse(argc, argv);
    set_schedule(s);
    require_data(s);
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    if (s.backend == "local") {
      TRIDENT_EXPECT(s.ranks >= 1, "flagship: expected at least one rank, got ", s.ranks);
      const double peak = flagship::measured_gemm_flops() * std::min<unsigned>(cores, static_cast<unsigned>(s.ranks));
      trident::local_world::run(s.ranks, [&](trident::local_comm& world) { run(world, s, peak); });
      return 0;
    }
#if TRIDENT_HAS_MPI
    if (s.backend == "mpi") {
      trident::mpi_environment env(argc, argv);
      auto world = trident::mpi_comm::world();
      const double peak = flagship::measured_gemm_flops() * std::min<unsigned>(cores, static_cast<unsigned>(world.size()));
      run(world, s, peak);
      return 0;
    }
#endif
    throw trident::usage_error("flagship: --backend " + s.backend + " is not available in this build (local" +
                               std::string(trident::has_mpi ? ", mpi" : "") + ")");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flagship: %s\n", e.what());
    return 1;
  }
}
