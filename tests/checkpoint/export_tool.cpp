// The C++ side of the consolidated export and the import (checkpoint.safetensors_py runs it
// beside tests/checkpoint/export_check.py):
//
//   export_tool save   WORK        4 thread ranks as a (t = 2, d = 2) grid, ZeRO-3, bf16 mixed
//                                  precision: a model whose tensors are split along axis 0 (one
//                                  with padding), along axis 1 (strided parts) and replicated,
//                                  3 AdamW steps, a checkpoint in WORK/ckpt/step_00000003, and its
//                                  consolidated exports WORK/export_master.safetensors (fp32
//                                  master weights) and WORK/export_parameters.safetensors (bf16)
//   export_tool import FILE WORK   the same model on the same grid with ZeRO-1 in fp32 starts from
//                                  FILE's weights (import_safetensors), saves that as a checkpoint
//                                  in WORK/imported and exports it to WORK/reexport.safetensors;
//                                  prints the tensors of FILE the model does not have
//
// Python reads the checkpoint's rank files, assembles the tensors itself from index.json and
// compares them with the exports; for the import it compares the re-export with the values it
// wrote. Exit 0 on success, 1 with a message otherwise.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "trident/checkpoint/zero.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/process_grid.hpp"
#include "trident/model/sharding.hpp"
#include "trident/optim/optimizers.hpp"

namespace {

namespace fs = std::filesystem;
using trident::sharding;

// The global model, split over a tensor group of `t`.
std::vector<std::pair<std::string, sharding>> model(int t) {
  return {{"embed", sharding::split({37, 8}, 0, t)},             // 37 rows on 2 parts: padded
          {"w1", sharding::split_exact({8, 24}, 1, t, "w1")},   // columns: each part strided
          {"b1", sharding::split_exact({24}, 0, t, "b1")},
          {"w2", sharding::split_exact({24, 8}, 0, t, "w2")},
          {"ln", sharding::replicated({8})}};
}

trident::model_spec spec_for(int t, int part) {
  trident::model_spec spec;
  int layer = 0;
  for (const auto& [name, s] : model(t)) spec.add(name, s, part, layer++);
  return spec;
}

float value(std::uint64_t step, std::size_t tensor, std::size_t i) {
  std::uint64_t x = (step + 1) * 0x9E3779B97F4A7C15ull ^ (tensor + 3) * 0xC2B2AE3D27D4EB4Full ^ i;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) / static_cast<float>(1ull << 23) - 1.0f;
}

trident::zero::zero_options options() {
  trident::zero::zero_options o;
  o.bucket_bytes = 64 * 4;
  o.first_bucket_bytes = 32 * 4;
  o.persistence_threshold = 0;
  return o;
}

template <class Z>
void train(trident::local_comm& tp, Z& z, int steps) {
  using half = typename Z::half_type;
  const auto m = model(tp.size());
  for (int step = 0; step < steps; ++step) {
    for (int layer = static_cast<int>(m.size()) - 1; layer >= 0; --layer) {
      const auto& [name, s] = m[static_cast<std::size_t>(layer)];
      std::vector<float> global(s.numel()), local(s.local_numel());
      for (std::size_t i = 0; i < global.size(); ++i) global[i] = value(static_cast<std::uint64_t>(step) + 100, static_cast<std::size_t>(layer), i);
      trident::take_part<float>(s, tp.rank(), global, local);
      std::span<half> g = z.gradients(z.handle(name));
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<half>(local[i] * z.loss_scale());
      z.release(layer);
      z.grad_ready(layer);
    }
    z.step();
  }
}

int save(const fs::path& work) {
  const auto root = work / "ckpt";
  fs::remove_all(root);
  trident::local_world::run(4, [&](trident::local_comm& world) {
    trident::process_grid grid(world, 2, 1);
    trident::zero::zero_optimizer<3, trident::optim::adamw, trident::local_comm, trident::mixed_precision<trident::bf16>> z(
        grid.data(), grid.model(), spec_for(2, grid.tensor().rank()), trident::optim::adamw{}, options());
    const auto m = model(2);
    for (std::size_t t = 0; t < m.size(); ++t) {
      const auto& [name, s] = m[t];
      std::vector<float> global(s.numel()), local(s.local_numel());
      for (std::size_t i = 0; i < global.size(); ++i) global[i] = 0.5f * value(0, t, i);
      trident::take_part<float>(s, grid.tensor().rank(), global, local);
      z.set_parameter(name, local);
    }
    train(grid.tensor(), z, 3);
    trident::checkpoint::save(world, z, root, 3);
  });
  const auto dir = root / "step_00000003";
  trident::checkpoint::export_safetensors(dir, work / "export_master.safetensors");
  trident::checkpoint::export_safetensors(dir, work / "export_parameters.safetensors", "parameters");
  std::printf("saved %s and exported it\n", dir.c_str());
  return 0;
}

int import(const fs::path& file, const fs::path& work) {
  const auto root = work / "imported";
  fs::remove_all(root);
  std::vector<std::string> unused;
  trident::local_world::run(4, [&](trident::local_comm& world) {
    trident::process_grid grid(world, 2, 1);
    trident::zero::zero_optimizer<1, trident::optim::adamw, trident::local_comm> z(grid.data(), grid.model(),
                                                                                   spec_for(2, grid.tensor().rank()),
                                                                                   trident::optim::adamw{}, options());
    const auto r = trident::checkpoint::import_safetensors(world, z, file);
    if (world.rank() == 0) unused = r.unused;
    trident::checkpoint::save(world, z, root, 0);
  });
  trident::checkpoint::export_safetensors(root / "step_00000000", work / "reexport.safetensors");
  std::printf("imported %s; unused:", file.c_str());
  for (const auto& u : unused) std::printf(" %s", u.c_str());
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "save" && argc == 3) return save(argv[2]);
    if (mode == "import" && argc == 4) return import(argv[2], argv[3]);
    std::fprintf(stderr, "usage: export_tool save WORK | export_tool import FILE WORK\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "export_tool: %s\n", e.what());
    return 1;
  }
}
