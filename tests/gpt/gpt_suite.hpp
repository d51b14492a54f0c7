#pragma once
// The flagship GPT (examples/01_flagship) against itself on one rank: every (d, t, p) grid and
// ZeRO stage trains, step for step, to the losses and gradient norms of one rank that runs the
// whole global batch by gradient accumulation (fp32). One body for every backend.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "01_flagship/train_instances.hpp"  // compiled once, in train_<precision>.cpp
#include "01_flagship/trainer.hpp"
#include "trident/comm/communicator.hpp"
#include "trident/comm/local.hpp"
#include "trident/data/token_shards.hpp"

namespace gpt_suite {

//! A shard of `count` tokens in [0, vocab) with structure a model learns in a few steps (nine
//! tokens in ten follow from the one before).
//! The file is this process's own (MPI ranks and concurrent tests each write theirs) and is
//! removed when the process ends.
inline std::string synthetic_shard(const std::string& name, std::size_t count, std::uint32_t vocab, std::uint64_t seed) {
  struct remover {
    std::vector<std::string> paths;
    ~remover() {
      for (const auto& p : paths) std::filesystem::remove(p);
    }
  };
  static remover made;
  const auto path = (std::filesystem::temp_directory_path() /
                     ("trident_gpt_" + name + "_" + std::to_string(::getpid()) + ".bin")).string();
  made.paths.push_back(path);
  std::vector<std::uint32_t> tokens(count);
  std::uint64_t z = seed;
  for (std::size_t i = 0; i < count; ++i) {
    z = trident::detail::splitmix64(z);
    const std::uint32_t noise = static_cast<std::uint32_t>(z % vocab);
    tokens[i] = i == 0 || z % 10 == 0 ? noise : (tokens[i - 1] * 5 + 3) % vocab;
  }
  trident::data::write_shard(path, tokens);
  return path;
}

//! A small model: every axis splits (heads, vocabulary and ffn by 2; layers by up to 8 stages).
inline flagship::train_options small_options() {
  flagship::train_options o;
  o.model = {.vocab = 32, .seq = 8, .hidden = 16, .heads = 4, .layers = 4, .ffn = 32};
  o.micro_batch = 2;
  o.accumulation = 2;
  o.steps = 20;
  o.max_grad_norm = 0.5f;  // active on most steps
  o.adamw = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  o.lr = [](std::int64_t step) { return 1e-2 * std::min<double>(1.0, static_cast<double>(step) / 5.0); };
  o.bucket_elements = 600;  // several buckets per chunk
  o.first_bucket_elements = 300;
  o.persistence_threshold = 0;
  o.train_files = {synthetic_shard("train", 20000, 32, 7)};
  return o;
}

inline double relative(double a, double b) { return std::abs(a - b) / std::max(1.0, std::abs(b)); }

//! On a world of d x t x p ranks: the grid's run against one rank's (each rank runs the serial
//! run itself, alone, with d x accumulation micro-batches per step).
template <class Comm>
struct serial_and_grid {
  std::vector<flagship::step_report> want, got;  // one rank's run, the grid's
  serial_and_grid(Comm& world, const flagship::train_options& o) {
    const int d = world.size() / (o.tensor * o.pipeline);
    auto alone = world.split(world.rank(), 0);
    flagship::train_options serial = o;
    serial.tensor = serial.pipeline = serial.virtual_stages = 1;
    serial.schedule = "1f1b";
    serial.zero_stage = 0;
    serial.model.sequence_parallel = false;
    serial.accumulation = o.accumulation * d;
    want = flagship::train(alone, serial);
    got = flagship::train(world, o);
    REQUIRE(got.size() == want.size());
    REQUIRE(want.size() == static_cast<std::size_t>(o.steps));
  }
};

template <class Comm>
void equals_serial(Comm& world, flagship::train_options o, double tolerance = 1e-5) {
  const int d = world.size() / (o.tensor * o.pipeline);
  const serial_and_grid<Comm> runs(world, o);
  const auto& want = runs.want;
  const auto& got = runs.got;
  int clipped = 0;
  for (std::size_t s = 0; s < got.size(); ++s) {
    INFO("(d, t, p) = (", d, ", ", o.tensor, ", ", o.pipeline, "), v = ", o.virtual_stages, ", ", o.schedule, ", ZeRO-", o.zero_stage,
         std::string(o.model.sequence_parallel ? ", sequence parallel" : ""), ", world rank ", world.rank(), ", step ", s + 1);
    CHECK(std::isfinite(got[s].loss));
    CHECK(relative(got[s].loss, want[s].loss) <= tolerance);
    CHECK(relative(got[s].grad_norm, want[s].grad_norm) <= tolerance);
    clipped += want[s].grad_norm > o.max_grad_norm;
  }
  CHECK(clipped > 0);  // clipping was active, so the global norm mattered
  // And the model learned: the last steps' loss is well below the first's (log 32 = 3.47).
  CHECK(want.back().loss < want.front().loss - 0.5);
}

}  // namespace gpt_suite
