// One tensor-parallel transformer block's step (forward + backward) on thread ranks: t = 1 and
// t = 2, with the input gradient's all-reduce overlapped with the weight-gradient GEMM and
// without, in one run, printed as a table (fmt). Ranks are threads of this process, so on a
// machine with fewer cores than ranks they share cores; the figures say what the host layers
// and the thread backend cost, not what a GPU would.
// A second table gives what recomputation costs (issue 14): the same step keeping everything,
// with selective recomputation (attention probabilities recomputed) and full recomputation
// (nn::checkpointed: the input kept, the forward run again), with the activation bytes each
// keeps per block (and per micro-batch in flight) and its one workspace, from the ledger.
//   ./tensor_block [seq] [batch] [hidden] [heads] [repeats]     (defaults 128 2 256 8 7)
#include <fmt/core.h>

#include <algorithm>
#include <utility>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "trident/comm/local.hpp"
#include "trident/core/memory_ledger.hpp"
#include "trident/nn/recompute.hpp"
#include "trident/parallel/tensor/block.hpp"

namespace {

std::vector<float> filled(std::size_t n, std::uint64_t seed, float scale) {
  std::vector<float> v(n);
  std::uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = scale * (static_cast<float>(s >> 40) / static_cast<float>(1 << 24) - 0.5f);
  }
  return v;
}

// A block's weights, gradients, input and output gradient (the same on every run), and where
// its output and input gradient go.
struct block_data {
  std::vector<std::vector<float>> w, g;
  std::vector<float> x, dy, y, dx;
  block_data(const trident::tensor::transformer_block& block, std::size_t hidden) {
    std::uint64_t seed = 1;
    for (const auto& p : block.parameters()) {
      w.push_back(filled(p.split.local_numel(), ++seed, 0.1f));
      g.emplace_back(p.split.local_numel(), 0.0f);
    }
    const std::size_t n = block.rows() * hidden;
    x = filled(n, 100, 1.0f);
    dy = filled(n, 101, 1.0f);
    y.resize(n);
    dx.resize(n);
  }
  // repeats + 1 forward + backward steps of `layer` (a block, or a checkpointed one), the first
  // a warm-up; rank 0's times between barriers go to `times`.
  template <class Layer, class Saved>
  void time(trident::local_comm& tp, const Layer& layer, Saved& saved, int repeats, std::vector<double>& times) {
    const auto weights = trident::tensor::block_tensors<const float>::over(w);
    const auto grads = trident::tensor::block_tensors<float>::over(g);
    for (int r = 0; r < repeats + 1; ++r) {
      tp.barrier();
      const auto start = std::chrono::steady_clock::now();
      layer.forward(tp, weights, x, y, saved);
      layer.backward(tp, weights, saved, dy, dx, grads);
      tp.barrier();
      const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
      if (tp.rank() == 0 && r > 0) times.push_back(took.count());
    }
  }
};

double median(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Median milliseconds of one forward + backward, measured on rank 0 between barriers.
double step_ms(int t, const trident::tensor::block_config& c, bool overlap, int repeats) {
  std::vector<double> times;
  trident::local_world::run(t, [&](trident::local_comm& tp) {
    trident::tensor::transformer_block block(tp, c, "b");
    block_data data(block, c.hidden);
    auto saved = block.make_activations();
    block.set_overlap(overlap);
    data.time(tp, block, saved, repeats, times);
  });
  return median(times);
}

enum class recompute { none, selective, full };
struct recompute_figures {
  double ms = 0;
  std::size_t kept = 0, workspace = 0;  // activation bytes: per block and micro-batch; once
};

// The step with a recomputation mode; bytes from rank 0's ledger.
recompute_figures recompute_step(int t, trident::tensor::block_config c, recompute mode, int repeats) {
  using ckpt = trident::nn::checkpointed<trident::tensor::transformer_block>;
  c.selective_recompute = mode == recompute::selective;
  recompute_figures out;
  std::vector<double> times;
  trident::local_world::run(t, [&](trident::local_comm& tp) {
    const auto ledger = trident::current_ledger();
    auto held = [&] { return ledger->bytes(trident::space_kind::host, trident::mem_category::activations); };
    trident::tensor::transformer_block block(tp, c, "b");
    block_data data(block, c.hidden);
    const std::size_t start = held();
    if (mode == recompute::full) {
      const ckpt layer(block);
      const std::size_t after_workspace = held();
      auto saved = layer.make_activations();
      if (tp.rank() == 0) out = {0, held() - after_workspace, after_workspace - start};
      data.time(tp, layer, saved, repeats, times);
    } else {
      auto saved = block.make_activations();
      const std::size_t kept = held() - start;
      data.time(tp, block, saved, repeats, times);  // the selective workspace is made at the first forward
      if (tp.rank() == 0) out = {0, kept, held() - start - kept};
    }
  });
  out.ms = median(times);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, long fallback) { return argc > i ? std::atol(argv[i]) : fallback; };
  trident::tensor::block_config c;
  c.seq = static_cast<std::size_t>(arg(1, 128));
  c.batch = static_cast<std::size_t>(arg(2, 2));
  c.hidden = static_cast<std::size_t>(arg(3, 256));
  c.heads = static_cast<std::size_t>(arg(4, 8));
  const int repeats = static_cast<int>(arg(5, 7));
  fmt::print("# transformer block step (forward + backward) on thread ranks: seq {} batch {} hidden {} heads {} ffn {}, "
             "median of {}\n",
             c.seq, c.batch, c.hidden, c.heads, 4 * c.hidden, repeats);
  fmt::print("{:>3} {:>9} {:>12} {:>10}\n", "t", "overlap", "step (ms)", "vs t=1");
  const double base = step_ms(1, c, true, repeats);
  for (int t : {1, 2})
    for (bool overlap : {true, false}) {
      const double ms = t == 1 && overlap ? base : step_ms(t, c, overlap, repeats);
      fmt::print("{:>3} {:>9} {:>12.2f} {:>9.2f}x\n", t, overlap ? "on" : "off", ms, base / ms);
    }
  fmt::print("\n# recomputation: the same step; activation bytes kept per block and micro-batch, and the one workspace\n");
  fmt::print("{:>3} {:>10} {:>12} {:>10} {:>14} {:>14}\n", "t", "recompute", "step (ms)", "vs none", "kept (KiB)", "workspace (KiB)");
  for (int t : {1, 2}) {
    double none_ms = 0;
    for (const auto& [mode, name] : {std::pair{recompute::none, "none"}, std::pair{recompute::selective, "selective"},
                                    std::pair{recompute::full, "full"}}) {
      const auto f = recompute_step(t, c, mode, repeats);
      if (mode == recompute::none) none_ms = f.ms;
      fmt::print("{:>3} {:>10} {:>12.2f} {:>9.2f}x {:>14.1f} {:>14.1f}\n", t, name, f.ms, f.ms / none_ms, static_cast<double>(f.kept) / 1024,
                 static_cast<double>(f.workspace) / 1024);
    }
  }
}
