#pragma once
// What the checkpoint tests share on every backend: a toy model whose gradients depend on its
// parameters (so any state a resume loses shows), trained on a global batch split over the
// ranks, with steps whose gradients overflow (skipped; the fp16 loss scale moves), and
// "20 steps straight" against "10 steps, save, load, 10 steps".
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include "trident/checkpoint/zero.hpp"
#include "trident/comm/local.hpp"
#include "trident/optim/optimizers.hpp"

namespace resume_suite {

namespace fs = std::filesystem;

constexpr int global_batch = 12;  // samples per step, split over the data-parallel ranks (1, 2, 3, 4 or 6)

trident::model_spec toy_spec() {
  trident::model_spec spec;
  spec.add("embed", {37, 8}, 0).add("w1", {8, 24}, 1).add("b1", {24}, 1).add("w2", {24, 8}, 2).add("ln", {8}, 3);
  return spec;
}

trident::zero::zero_options options() {
  trident::zero::zero_options o;
  o.bucket_bytes = 200 * 4;  // several buckets, each split over the ranks
  o.first_bucket_bytes = 40 * 4;
  o.persistence_threshold = 0;  // stage 3 really gathers and releases
  o.max_grad_norm = 4.0f;       // clipping on: the global norm must be right after a resume
  return o;
}

trident::optim::adamw adamw() {
  trident::optim::adamw o;
  o.opt.lr = 1e-2f;
  return o;
}

// A reproducible value in [-1, 1) for (step, sample, tensor, element).
float noise(std::uint64_t step, std::uint64_t sample, std::uint64_t tensor, std::uint64_t i) {
  std::uint64_t x = step * 0x9E3779B97F4A7C15ull ^ (sample + 1) * 0xC2B2AE3D27D4EB4Full ^ (tensor + 7) * 0x165667B19E3779F9ull ^ i;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) / static_cast<float>(1ull << 23) - 1.0f;
}

// Steps whose gradients overflow (rank 0 writes an inf): skipped, and the loss scale moves.
bool overflows(int step) { return step == 4 || step == 13 || step == 14; }

template <class Precision>
typename Precision::scaler_type make_scaler() {
  if constexpr (std::is_same_v<typename Precision::scaler_type, trident::dynamic_loss_scaler>)
    return trident::dynamic_loss_scaler({.initial_scale = 1024.0, .window = 3, .hysteresis = 2});
  else
    return {};
}

template <int Stage, class Precision, class Comm = trident::local_comm>
using optimizer_t = trident::zero::zero_optimizer<Stage, trident::optim::adamw, Comm, Precision>;

// Host access to the spans the optimizer hands out, in any memory space: on a device, after the
// communicator's queued work, and a write lands before the optimizer's next work (a one-element
// copy back on the same legacy stream returns only after the first copy's DMA).
template <class Comm, class T, trident::memory_space Space>
std::vector<std::remove_const_t<T>> read_span(Comm& comm, trident::space_span<T, Space> s) {
  using V = std::remove_const_t<T>;
  if constexpr (!Space::host_accessible) comm.synchronize();
  std::vector<V> out(s.size());
  trident::copy(trident::space_span<const V, Space>(s), trident::space_span<V, trident::host_space>(out));
  return out;
}
template <class T, trident::memory_space Space>
void write_span(trident::space_span<T, Space> s, const std::vector<T>& values) {
  trident::copy(trident::space_span<const T, trident::host_space>(values), s);
  if constexpr (!Space::host_accessible)
    if (!s.empty()) {
      T probe{};
      trident::copy(s.subspan(0, 1), trident::space_span<T, trident::host_space>(&probe, 1));
    }
}

template <class Z>
void initialise(Z& z) {
  const auto spec = toy_spec();
  for (std::size_t t = 0; t < spec.tensors().size(); ++t) {
    std::vector<float> v(spec.tensors()[t].numel);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * noise(0, 999, t, i);
    z.set_parameter(spec.tensors()[t].name, v);
  }
}

// Steps [from, to) of a training whose gradient depends on the parameters (so any state lost
// in a resume shows), the global batch split over the ranks.
template <class Comm, class Z>
void train(Comm& comm, Z& z, int from, int to) {
  using half = typename Z::half_type;
  const auto spec = toy_spec();
  const int per_rank = global_batch / comm.size();
  for (int step = from; step < to; ++step) {
    for (int layer = spec.layers() - 1; layer >= 0; --layer) {
      for (std::size_t t = 0; t < spec.tensors().size(); ++t) {
        if (spec.tensors()[t].layer != layer) continue;
        const auto h = z.handle(spec.tensors()[t].name);
        const auto p = read_span(comm, z.parameters(h));
        auto gs = z.gradients(h);
        auto g = read_span(comm, gs);
        for (std::size_t i = 0; i < g.size(); ++i) {
          float sum = 0;
          for (int s = comm.rank() * per_rank; s < (comm.rank() + 1) * per_rank; ++s)
            sum += 0.3f * static_cast<float>(p[i]) * static_cast<float>(1 + s % 3) + noise(static_cast<std::uint64_t>(step) + 1, s, t, i);
          g[i] = static_cast<half>(static_cast<float>(g[i]) + sum / static_cast<float>(per_rank) * z.loss_scale());
        }
        if (overflows(step) && comm.rank() == 0 && t == 0) g[0] = static_cast<half>(std::numeric_limits<float>::infinity());
        write_span(gs, g);
      }
      z.release(layer);
      z.grad_ready(layer);
    }
    z.step();
  }
}

std::vector<char> bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}


struct outcome {
  std::vector<float> master;
  std::int64_t steps;
  double scale;
};

// 20 steps straight, or 10, save, a new optimizer, load, 10: both saved at step 20 too.
// The same fresh directory on every rank of a job whose ranks are processes: named after rank
// 0's pid (which the ranks share through the communicator, whatever its memory space).
template <class Comm>
fs::path shared_dir(Comm& comm, const std::string& name) {
  std::vector<std::uint64_t> id{static_cast<std::uint64_t>(::getpid())};
  trident::checkpoint::detail::broadcast_values(comm, id, 0);
  const auto dir = fs::temp_directory_path() / ("trident_ckpt_" + std::to_string(id[0])) / name;
  // Every rank must be done with the directory's last use (a slower rank may still be reading
  // the files a check compares) before rank 0 clears it: under load that read met the next
  // run's files, and the check failed.
  comm.barrier();
  if (comm.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  comm.barrier();
  return dir;
}

// This rank's part of "20 steps straight, saved at 20", or of "10 steps, saved, a new optimizer
// loads it, 10 steps, saved at 20": collective over comm; root is the same path on every rank.
template <int Stage, class Precision, class Comm>
outcome run_on(Comm& comm, const fs::path& root, bool resume) {
  if (!resume) {
    optimizer_t<Stage, Precision, Comm> z(comm, toy_spec(), adamw(), options(), make_scaler<Precision>());
    initialise(z);
    train(comm, z, 0, 20);
    trident::checkpoint::save(comm, z, root, 20);
    return {z.full_master(), z.steps_taken(), z.loss_scale()};
  }
  {
    optimizer_t<Stage, Precision, Comm> z(comm, toy_spec(), adamw(), options(), make_scaler<Precision>());
    initialise(z);
    train(comm, z, 0, 10);
    trident::checkpoint::save(comm, z, root, 10, {.metadata = {{"data.position", "80"}}, .keep = 0, .sync = true});
  }
  optimizer_t<Stage, Precision, Comm> z(comm, toy_spec(), adamw(), options(), make_scaler<Precision>());
  const auto r = trident::checkpoint::load(comm, z, root / "step_00000010");
  CHECK(r.step == 10);
  CHECK(r.metadata.at("data.position") == "80");
  train(comm, z, 10, 20);
  trident::checkpoint::save(comm, z, root, 20);
  return {z.full_master(), z.steps_taken(), z.loss_scale()};
}

// The two runs agree bit for bit: parameters, counters, and every saved file at step 20
// (working weights, master weights, optimizer states, loss scaler).
template <class Precision>
void check_same(const outcome& straight, const outcome& resumed, const fs::path& straight_dir, const fs::path& resumed_dir,
                int ranks) {
  CHECK(straight.steps == 17);  // three steps with an inf gradient skipped
  if constexpr (std::is_same_v<typename Precision::scaler_type, trident::dynamic_loss_scaler>) CHECK(straight.scale != 1024.0);
  CHECK(resumed.steps == straight.steps);
  CHECK(resumed.scale == straight.scale);
  REQUIRE(resumed.master.size() == straight.master.size());
  CHECK(std::memcmp(resumed.master.data(), straight.master.data(), straight.master.size() * sizeof(float)) == 0);
  for (int r = 0; r < ranks; ++r) {
    const std::string f = trident::checkpoint::detail::rank_file(r);
    CAPTURE(f);
    CHECK(bytes_of(straight_dir / "step_00000020" / f) == bytes_of(resumed_dir / "step_00000020" / f));
  }
}

//! Runs f.template operator()<Stage, Precision>(name) for ZeRO 0-3 x fp32, bf16, fp16.
//! The sanitizer build (TRIDENT_CHECKPOINT_FEW_INSTANCES) runs fp32 in every stage and fp16 in
//! stage 2 only: the same checkpoint code, a third of the compile time.
template <class F>
void for_each_stage_and_precision(F&& f) {
#if TRIDENT_CHECKPOINT_FEW_INSTANCES
  f.template operator()<0, trident::full_precision>("fp32");
  f.template operator()<1, trident::full_precision>("fp32");
  f.template operator()<2, trident::full_precision>("fp32");
  f.template operator()<3, trident::full_precision>("fp32");
  f.template operator()<2, trident::mixed_precision<trident::fp16>>("fp16");
#else
  auto stages = [&]<class P>(const char* name) {
    f.template operator()<0, P>(name);
    f.template operator()<1, P>(name);
    f.template operator()<2, P>(name);
    f.template operator()<3, P>(name);
  };
  stages.template operator()<trident::full_precision>("fp32");
  stages.template operator()<trident::mixed_precision<trident::bf16>>("bf16");
  stages.template operator()<trident::mixed_precision<trident::fp16>>("fp16");
#endif
}

}  // namespace resume_suite
