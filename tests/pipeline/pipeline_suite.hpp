#pragma once
// The pipeline executor, one test body per behaviour for every host backend (thread ranks in
// test_pipeline_local.cpp, MPI in test_pipeline_mpi.cpp). The oracle is gradient accumulation
// of the same micro-batches through all layers on one rank, which every rank computes for
// itself: the layers' weights come from the layer index and a seed, whatever the split.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/random.hpp"
#include "trident/comm/communicator.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/memory_ledger.hpp"
#include "trident/parallel/pipeline/partition.hpp"
#include "trident/parallel/pipeline/pipeline.hpp"
#include "trident/parallel/pipeline/schedule.hpp"
#include "trident/parallel/pipeline/simulator.hpp"

namespace pipeline_suite {

namespace pp = trident::pipeline;

//! n values in [-scale, scale) from a seed (splitmix64): the same on every rank.
inline std::vector<float> random(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  return test_support::splitmix_vector(n, seed, scale);
}

//! Layers [first, last) of a stack of y = tanh(x W^T + b), `width` features, `rows` rows per
//! micro-batch. A split stage: backward_input keeps dz for backward_weight. What it keeps per
//! micro-batch (each layer's input and output) is charged to the ledger as activations.
class dense_stack {
 public:
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;

  dense_stack(std::size_t first, std::size_t last, std::size_t width, std::size_t rows, std::uint64_t seed)
      : first_(first), width_(width), rows_(rows) {
    for (std::size_t l = first; l < last; ++l) {
      w_.push_back(random(width * width, seed + 2 * l, 0.5f));
      b_.push_back(random(width, seed + 2 * l + 1, 0.1f));
      dw_.emplace_back(width * width, 0.0f);
      db_.emplace_back(width, 0.0f);
    }
  }

  std::size_t input_numel() const { return rows_ * width_; }
  std::size_t output_numel() const { return rows_ * width_; }
  std::size_t layers() const { return w_.size(); }
  std::size_t first() const { return first_; }

  std::vector<float> forward(const std::vector<float>& x, int mb) {
    auto& keep = saved_[mb];
    std::vector<float> in = x;
    for (std::size_t l = 0; l < layers(); ++l) {
      trident::buffer<float> xin(in.size(), trident::mem_category::activations);
      std::copy(in.begin(), in.end(), xin.data());
      std::vector<float> out(rows_ * width_);
      for (std::size_t r = 0; r < rows_; ++r)
        for (std::size_t o = 0; o < width_; ++o) {
          float z = b_[l][o];
          for (std::size_t i = 0; i < width_; ++i) z += in[r * width_ + i] * w_[l][o * width_ + i];
          out[r * width_ + o] = std::tanh(z);
        }
      trident::buffer<float> yout(out.size(), trident::mem_category::activations);
      std::copy(out.begin(), out.end(), yout.data());
      keep.push_back({std::move(xin), std::move(yout), {}});
      in = std::move(out);
    }
    return in;
  }
  std::vector<float> backward(const std::vector<float>& dy, int mb) {
    auto dx = backward_input(dy, mb);
    backward_weight(mb);
    return dx;
  }
  std::vector<float> backward_input(const std::vector<float>& dy, int mb) {
    auto& keep = saved_.at(mb);
    std::vector<float> g = dy;
    for (std::size_t l = layers(); l-- > 0;) {
      auto& k = keep[l];
      k.dz.assign(rows_ * width_, 0.0f);
      for (std::size_t e = 0; e < k.dz.size(); ++e) k.dz[e] = g[e] * (1.0f - k.y.data()[e] * k.y.data()[e]);
      std::vector<float> next(rows_ * width_, 0.0f);
      for (std::size_t r = 0; r < rows_; ++r)
        for (std::size_t o = 0; o < width_; ++o)
          for (std::size_t i = 0; i < width_; ++i) next[r * width_ + i] += k.dz[r * width_ + o] * w_[l][o * width_ + i];
      g = std::move(next);
    }
    return g;
  }
  void backward_weight(int mb) {
    auto node = saved_.extract(mb);
    REQUIRE(!node.empty());
    for (std::size_t l = layers(); l-- > 0;) {
      const auto& k = node.mapped()[l];
      for (std::size_t r = 0; r < rows_; ++r)
        for (std::size_t o = 0; o < width_; ++o) {
          const float d = k.dz[r * width_ + o];
          db_[l][o] += d;
          for (std::size_t i = 0; i < width_; ++i) dw_[l][o * width_ + i] += d * k.x.data()[r * width_ + i];
        }
    }
  }

  void sgd(float lr) {
    for (std::size_t l = 0; l < layers(); ++l) {
      for (std::size_t e = 0; e < w_[l].size(); ++e) w_[l][e] -= lr * dw_[l][e];
      for (std::size_t e = 0; e < b_[l].size(); ++e) b_[l][e] -= lr * db_[l][e];
      std::fill(dw_[l].begin(), dw_[l].end(), 0.0f);
      std::fill(db_[l].begin(), db_[l].end(), 0.0f);
    }
  }
  const std::vector<float>& weight(std::size_t l) const { return w_[l]; }
  const std::vector<float>& bias(std::size_t l) const { return b_[l]; }
  const std::vector<float>& weight_grad(std::size_t l) const { return dw_[l]; }

 private:
  struct kept {
    trident::buffer<float> x, y;
    std::vector<float> dz;
  };
  std::size_t first_, width_, rows_;
  std::vector<std::vector<float>> w_, b_, dw_, db_;
  std::map<int, std::vector<kept>> saved_;
};
static_assert(pp::split_stage<dense_stack>);

//! The model and data of one equivalence run.
struct problem {
  std::size_t layers = 8, width = 6, rows = 3;
  int micro_batches = 4;
  std::uint64_t seed = 11;
  std::vector<float> input(int mb) const { return random(rows * width, 1000 + seed + static_cast<std::uint64_t>(mb)); }
  std::vector<float> target(int mb) const { return random(rows * width, 2000 + seed + static_cast<std::uint64_t>(mb), 0.8f); }
  // 0.5 * mean squared error over the global batch: dy = (y - t) / (m * rows).
  double loss(const std::vector<float>& y, int mb, std::vector<float>& dy) const {
    const auto t = target(mb);
    const float scale = 1.0f / static_cast<float>(static_cast<std::size_t>(micro_batches) * rows);
    double l = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      const float d = y[i] - t[i];
      dy[i] = d * scale;
      l += 0.5 * static_cast<double>(d) * d * scale;
    }
    return l;
  }
};

//! Serial gradient accumulation of all micro-batches through all layers, `steps` SGD steps:
//! the weights and losses every schedule must reproduce.
struct serial_result {
  std::vector<std::vector<float>> weights, biases;
  std::vector<double> last_losses;
};
inline serial_result serial(const problem& pb, int steps, float lr) {
  dense_stack all(0, pb.layers, pb.width, pb.rows, pb.seed);
  serial_result out;
  for (int s = 0; s < steps; ++s) {
    out.last_losses.clear();
    for (int mb = 0; mb < pb.micro_batches; ++mb) {
      auto y = all.forward(pb.input(mb), mb);
      std::vector<float> dy(y.size());
      out.last_losses.push_back(pb.loss(y, mb, dy));
      all.backward(dy, mb);
    }
    all.sgd(lr);
  }
  for (std::size_t l = 0; l < pb.layers; ++l) {
    out.weights.push_back(all.weight(l));
    out.biases.push_back(all.bias(l));
  }
  return out;
}

//! Calls f.template operator()<N>() for a run-time N in 1..8.
template <class F>
void with_stages(int n, F&& f) {
  switch (n) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    case 4: f.template operator()<4>(); break;
    case 6: f.template operator()<6>(); break;
    case 8: f.template operator()<8>(); break;
    default: FAIL("no pipeline instantiated for ", n, " stages");
  }
}

//! Whether every stage's weight gradients are summed over the micro-batches in order (then the
//! result is bitwise the serial one).
inline bool weights_in_order(const pp::schedule& s) {
  for (const auto& list : s.actions) {
    std::map<int, int> last;
    for (const auto& a : list)
      if (a.kind == pp::action_kind::backward || a.kind == pp::action_kind::backward_weight) {
        if (last.contains(a.stage) && last[a.stage] > a.micro_batch) return false;
        last[a.stage] = a.micro_batch;
      }
  }
  return true;
}

//! The pipeline trains the model to the serial run's weights over `steps` steps of schedule
//! `s` (bitwise where the summation order is the serial one, else within 1e-6 relative).
template <class Comm>
void equals_serial(Comm& comm, const pp::schedule& s, const problem& pb, int steps = 2) {
  REQUIRE(s.ranks == comm.size());
  const float lr = 0.1f;
  const auto ref = serial(pb, steps, lr);
  const auto part = pp::even(std::vector<double>(pb.layers, 1.0), s.stages);
  with_stages(s.stages, [&]<std::size_t N>() {
    pp::uniform_pipeline<dense_stack, N> pipe(comm, [&](auto k) {
      return dense_stack(part.bounds[k], part.bounds[k + 1], pb.width, pb.rows, pb.seed);
    });
    std::vector<int> ready;
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) {
      ready.clear();
      auto out = pipe.run(
          comm, s, [&](int mb) { return pb.input(mb); },
          [&](const std::vector<float>& y, int mb, std::vector<float>& dy) { return pb.loss(y, mb, dy); },
          [&](int k) { ready.push_back(k); });
      losses = out.losses;
      for (int k = 0; k < s.stages; ++k)
        if (pipe.owns(k)) pipe.visit(k, [&](dense_stack& st) { st.sgd(lr); });
    }
    // Every owned stage reported its gradients ready once per step.
    int owned = 0;
    for (int k = 0; k < s.stages; ++k) owned += pipe.owns(k) ? 1 : 0;
    CHECK(static_cast<int>(ready.size()) == owned);
    const bool exact = weights_in_order(s);
    double worst = 0;
    int mismatched = 0;
    for (int k = 0; k < s.stages; ++k) {
      if (!pipe.owns(k)) continue;
      pipe.visit(k, [&](dense_stack& st) {
        for (std::size_t l = 0; l < st.layers(); ++l) {
          const auto& w = st.weight(l);
          const auto& want = ref.weights[st.first() + l];
          for (std::size_t e = 0; e < w.size(); ++e) {
            worst = std::max(worst, std::abs(static_cast<double>(w[e]) - want[e]));
            mismatched += w[e] != want[e] ? 1 : 0;
          }
          const auto& b = st.bias(l);
          for (std::size_t e = 0; e < b.size(); ++e) mismatched += b[e] != ref.biases[st.first() + l][e] ? 1 : 0;
        }
      });
    }
    INFO("schedule ", s.name, ", p = ", s.ranks, ", stages = ", s.stages, ", m = ", s.micro_batches, ", rank ", comm.rank());
    if (exact) CHECK(mismatched == 0);
    CHECK(worst <= 1e-6);
    if (pipe.owns(s.stages - 1)) {
      REQUIRE(losses.size() == ref.last_losses.size());
      for (std::size_t i = 0; i < losses.size(); ++i) CHECK(losses[i] == ref.last_losses[i]);
    } else {
      CHECK(losses.empty());
    }
  });
}

//! 1F1B with every backward split into backward_input and backward_weight right after it.
inline pp::schedule split_backward(pp::schedule s) {
  for (auto& list : s.actions) {
    std::vector<pp::action> out;
    for (const auto& a : list) {
      if (a.kind != pp::action_kind::backward) {
        out.push_back(a);
        continue;
      }
      out.push_back({pp::action_kind::backward_input, a.micro_batch, a.stage});
      out.push_back({pp::action_kind::backward_weight, a.micro_batch, a.stage});
    }
    list = std::move(out);
  }
  s.name += "-split";
  return s;
}

//! Every schedule this suite runs for p ranks and m micro-batches.
//! Interleaved 1F1B needs m to be a multiple of p (Megatron's rule) and 8 layers to spread
//! over v p stages, so it runs with v = 2 where both hold.
inline std::vector<pp::schedule> schedules(int p, int m) {
  std::vector<pp::schedule> out{pp::gpipe(p, m), pp::one_f_one_b(p, m), split_backward(pp::one_f_one_b(p, m)),
                                pp::zb_h1(p, m), pp::zb_h2(p, m)};
  if (m % p == 0 && 2 * p <= 8) out.push_back(pp::interleaved_one_f_one_b(p, m, 2));
  // A user's own list: each rank's computes in an order of their choosing (here 1F1B's with
  // the backward split), the sends and receives inserted by from_compute_order.
  std::vector<std::vector<pp::action>> compute(static_cast<std::size_t>(p));
  const auto order = split_backward(pp::one_f_one_b(p, m));
  for (int r = 0; r < p; ++r)
    for (const auto& a : order.actions[static_cast<std::size_t>(r)])
      if (!pp::detail::is_p2p(a.kind)) compute[static_cast<std::size_t>(r)].push_back({a.kind, a.micro_batch, a.stage});
  out.push_back(pp::from_compute_order("user-1f1b-split", p, p, m, compute));
  return out;
}

//! Equivalence for every schedule and m = 1..8 on this communicator's p ranks.
template <class Comm>
void all_schedules_equal_serial(Comm& comm) {
  const int p = comm.size();
  for (int m = 1; m <= 8; ++m)
    for (const auto& s : schedules(p, m)) {
      problem pb;
      pb.micro_batches = m;
      pb.seed = 11 + static_cast<std::uint64_t>(m);
      equals_serial(comm, s, pb);
    }
}

//! Peak activation bytes per rank, from the ledger, against what the schedules' papers state,
//! in micro-batches (chunk-micro-batches for interleaved) of this rank's layers:
//!   GPipe        m on every rank (Huang et al. 2019)
//!   1F1B         min(p - r, m) on rank r (Narayanan et al. 2021)
//!   interleaved  min(2 (p - r - 1) + (v - 1) p + 1, v m), v m when m = p: Megatron-LM's warm-up
//!                forwards plus the one in the steady state (Narayanan et al. 2021)
//!   ZB-H1        min(p, m) on every rank: at most p micro-batches in flight until their W, the
//!                peak of 1F1B's first stage (Qi et al. 2023, section 2.2)
//!   ZB-H2        at most 2p - 1 in flight until their W; min(2p - 1, m) on the first stage
//! dense_stack keeps each layer's input and output until the micro-batch's W.
template <class Comm>
void activation_memory(Comm& comm, int m) {
  const int p = comm.size(), r = comm.rank(), v = 2;
  problem pb;
  pb.micro_batches = m;
  const std::size_t per_layer = 2 * pb.rows * pb.width * sizeof(float);  // input and output kept
  struct row {
    pp::schedule s;
    int formula;  // micro-batches (or chunk-micro-batches) of this rank's share
    bool at_most;  // the paper gives a bound for this rank, not the value
    std::string text;
  };
  std::vector<row> rows{{pp::gpipe(p, m), m, false, "m"},
                        {pp::one_f_one_b(p, m), std::min(p - r, m), false, "min(p - r, m)"},
                        {pp::zb_h1(p, m), std::min(p, m), false, "min(p, m)"},
                        {pp::zb_h2(p, m), std::min(2 * p - 1, m), r != 0, r == 0 ? "min(2p - 1, m)" : "at most min(2p - 1, m)"}};
  if (m % p == 0 && v * p <= static_cast<int>(pb.layers))
    rows.push_back({pp::interleaved_one_f_one_b(p, m, v), m == p ? v * m : std::min(2 * (p - r - 1) + (v - 1) * p + 1, v * m), false,
                    m == p ? "v m" : "min(2 (p - r - 1) + (v - 1) p + 1, v m)"});
  for (const auto& [s, formula, at_most, text] : rows) {
    const auto part = pp::even(std::vector<double>(pb.layers, 1.0), s.stages);
    with_stages(s.stages, [&]<std::size_t N>() {
      pp::uniform_pipeline<dense_stack, N> pipe(comm, [&](auto k) {
        return dense_stack(part.bounds[k], part.bounds[k + 1], pb.width, pb.rows, pb.seed);
      });
      // The stages of this rank have equally many layers (even split of 8 layers).
      const std::size_t per_unit = per_layer * (part.bounds[static_cast<std::size_t>(r) + 1] - part.bounds[static_cast<std::size_t>(r)]);
      auto ledger = trident::current_ledger();
      REQUIRE(ledger->bytes(trident::space_kind::host, trident::mem_category::activations) == 0);
      ledger->reset_peaks();
      pipe.run(
          comm, s, [&](int mb) { return pb.input(mb); },
          [&](const std::vector<float>& y, int mb, std::vector<float>& dy) { return pb.loss(y, mb, dy); });
      const std::size_t peak = ledger->peak(trident::space_kind::host, trident::mem_category::activations);
      const std::size_t expected = static_cast<std::size_t>(formula) * per_unit;
      MESSAGE(s.name, " p = ", p, " m = ", m, " rank ", r, ": peak activations ", peak, " bytes = ", peak / per_unit, " x ", per_unit,
              "; formula ", text, " = ", formula);
      if (at_most) CHECK(peak <= expected);
      else CHECK(peak == expected);
      CHECK(ledger->bytes(trident::space_kind::host, trident::mem_category::activations) == 0);
    });
  }
}

//! A stage that only sleeps: forward F, backward B + W (or B, then W), to measure bubbles
//! without depending on the core count. Records when this rank computed.
class sleeping_stage {
 public:
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  using clock = std::chrono::steady_clock;
  struct costs {
    std::chrono::microseconds forward, backward_input, backward_weight;
  };
  sleeping_stage(costs c, std::vector<std::pair<clock::time_point, clock::time_point>>* busy) : c_(c), busy_(busy) {}
  std::size_t input_numel() const { return 4; }
  std::size_t output_numel() const { return 4; }
  std::vector<float> forward(const std::vector<float>& x, int) {
    work(c_.forward);
    return x;
  }
  std::vector<float> backward(const std::vector<float>& dy, int) {
    work(c_.backward_input + c_.backward_weight);
    return dy;
  }
  std::vector<float> backward_input(const std::vector<float>& dy, int) {
    work(c_.backward_input);
    return dy;
  }
  void backward_weight(int) { work(c_.backward_weight); }

 private:
  void work(std::chrono::microseconds d) {
    const auto start = clock::now();
    std::this_thread::sleep_until(start + d);
    busy_->emplace_back(start, clock::now());
  }
  costs c_;
  std::vector<std::pair<clock::time_point, clock::time_point>>* busy_;
};
static_assert(pp::split_stage<sleeping_stage>);

}  // namespace pipeline_suite
