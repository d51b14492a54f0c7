#pragma once
// A small MLP shared by the examples and the ZeRO tests (in -> h -> h -> out, ReLU, mean-squared error) written against a zero_optimizer:
// forward reads zero.parameters(), backward accumulates into zero.gradients() and marks each
// layer ready in reverse order, as a trainer would. Plain loops, fixed summation order.
#include <cmath>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "trident/comm/communicator.hpp"

#include "trident/model/flat_layout.hpp"

namespace mlp {

struct dims {
  std::size_t in = 12, hidden = 24, out = 4;
};

inline trident::model_spec spec(const dims& d) {
  trident::model_spec s;
  s.add("l0.weight", {d.hidden, d.in}, 0).add("l0.bias", {d.hidden}, 0);
  s.add("l1.weight", {d.hidden, d.hidden}, 1).add("l1.bias", {d.hidden}, 1);
  s.add("l2.weight", {d.out, d.hidden}, 2).add("l2.bias", {d.out}, 2);
  return s;
}

// Deterministic initial weights (a hash of the name and index), scaled like 1/sqrt(fan_in).
inline std::vector<float> initial(const std::string& name, std::size_t n, std::size_t fan_in) {
  std::vector<float> v(n);
  std::size_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t x = (h + i * 2654435761ull) % 1000003;
    v[i] = (static_cast<float>(x) / 1000003.0f - 0.5f) * 2.0f / std::sqrt(static_cast<float>(fan_in));
  }
  return v;
}

template <class Zero>
void initialise(Zero& zero, const dims& d) {
  zero.set_parameter("l0.weight", initial("l0.weight", d.hidden * d.in, d.in));
  zero.set_parameter("l0.bias", initial("l0.bias", d.hidden, d.in));
  zero.set_parameter("l1.weight", initial("l1.weight", d.hidden * d.hidden, d.hidden));
  zero.set_parameter("l1.bias", initial("l1.bias", d.hidden, d.hidden));
  zero.set_parameter("l2.weight", initial("l2.weight", d.out * d.hidden, d.hidden));
  zero.set_parameter("l2.bias", initial("l2.bias", d.out, d.hidden));
}

//! Sample i of the data set: inputs and a smooth target.
inline void sample(const dims& d, std::size_t i, float* x, float* y) {
  for (std::size_t k = 0; k < d.in; ++k) x[k] = std::sin(0.37f * static_cast<float>(i) + 0.91f * static_cast<float>(k));
  // A smooth target plus noise no model can learn, so the loss settles at a floor (~0.03) and
  // precisions are compared on a loss that is not vanishing.
  for (std::size_t k = 0; k < d.out; ++k) {
    const std::size_t hsh = (i * 7919 + k * 104729) % 1009;
    const float noise = (static_cast<float>(hsh) / 1009.0f - 0.5f) * 0.6f;
    y[k] = std::cos(0.5f * x[k % d.in] + 0.25f * x[(k + 3) % d.in]) + noise;
  }
}

template <class H>
float f(H v) {
  return static_cast<float>(v);
}

//! Forward and backward over samples [first, first + rows) of a batch of `batch_rows` rows in
//! total (the loss is a mean over the global batch, so each rank scales by its share). Returns
//! this rank's contribution to the loss. Gradients are multiplied by `scale` (the loss scale).
template <class Zero>
double train_step(Zero& zero, const dims& d, std::size_t first, std::size_t rows, std::size_t batch_rows_per_rank,
                  float scale = 1.0f, bool inject_inf = false) {
  using H = typename Zero::half_type;
  std::vector<float> x(rows * d.in), y(rows * d.out);
  for (std::size_t r = 0; r < rows; ++r) sample(d, first + r, &x[r * d.in], &y[r * d.out]);

  auto linear = [&](const std::string& layer, const std::vector<float>& input, std::size_t n_in, std::size_t n_out,
                    bool relu) {
    auto w = zero.parameters(layer + ".weight");
    auto b = zero.parameters(layer + ".bias");
    std::vector<float> out(rows * n_out);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t o = 0; o < n_out; ++o) {
        float acc = f(b.data()[o]);
        for (std::size_t i = 0; i < n_in; ++i) acc += f(w.data()[o * n_in + i]) * input[r * n_in + i];
        out[r * n_out + o] = relu ? std::max(acc, 0.0f) : acc;
      }
    return out;
  };
  const auto h0 = linear("l0", x, d.in, d.hidden, true);
  zero.release(0);
  const auto h1 = linear("l1", h0, d.hidden, d.hidden, true);
  zero.release(1);
  const auto p = linear("l2", h1, d.hidden, d.out, false);
  zero.release(2);

  // Mean over this rank's rows x outputs: averaging over ranks gives the global mean.
  const float denom = static_cast<float>(batch_rows_per_rank * d.out);
  double loss = 0;
  std::vector<float> dp(rows * d.out);
  for (std::size_t k = 0; k < dp.size(); ++k) {
    const float e = p[k] - y[k];
    loss += static_cast<double>(e) * e / denom;
    dp[k] = 2.0f * e / denom * scale;
  }

  auto backward = [&](const std::string& layer, int index, const std::vector<float>& input, const std::vector<float>& output,
                      std::vector<float>& dout, std::size_t n_in, std::size_t n_out, bool relu, bool need_dx) {
    auto w = zero.parameters(layer + ".weight");
    if (relu)
      for (std::size_t k = 0; k < dout.size(); ++k)
        if (output[k] <= 0.0f) dout[k] = 0.0f;
    auto gw = zero.gradients(layer + ".weight");
    auto gb = zero.gradients(layer + ".bias");
    for (std::size_t o = 0; o < n_out; ++o) {
      float sb = 0;
      for (std::size_t r = 0; r < rows; ++r) sb += dout[r * n_out + o];
      gb.data()[o] = static_cast<H>(f(gb.data()[o]) + sb);
      for (std::size_t i = 0; i < n_in; ++i) {
        float sw = 0;
        for (std::size_t r = 0; r < rows; ++r) sw += dout[r * n_out + o] * input[r * n_in + i];
        gw.data()[o * n_in + i] = static_cast<H>(f(gw.data()[o * n_in + i]) + sw);
      }
    }
    std::vector<float> dx;
    if (need_dx) {
      dx.assign(rows * n_in, 0.0f);
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t i = 0; i < n_in; ++i) {
          float acc = 0;
          for (std::size_t o = 0; o < n_out; ++o) acc += dout[r * n_out + o] * f(w.data()[o * n_in + i]);
          dx[r * n_in + i] = acc;
        }
    }
    if (inject_inf && index == 0) gw.data()[0] = static_cast<H>(INFINITY);
    zero.release(index);
    zero.grad_ready(index);
    return dx;
  };
  auto d1 = backward("l2", 2, h1, p, dp, d.hidden, d.out, false, true);
  auto d0 = backward("l1", 1, h0, h1, d1, d.hidden, d.hidden, true, true);
  backward("l0", 0, x, h0, d0, d.in, d.hidden, true, false);
  return loss;
}

//! Presents a zero_optimizer on device memory to this host MLP: parameters are copied to the
//! host, gradients are staged on the host and copied into the device buffers when their layer is
//! marked ready. Slow, and fine for a model this small: what runs on the device is the optimizer.
template <class Zero>
struct host_staged {
  using half_type = typename Zero::half_type;
  Zero& z;
  std::map<std::string, std::vector<half_type>> params, grads;

  trident::space_span<const half_type, trident::host_space> parameters(const std::string& name) {
    auto d = z.parameters(name);
    auto& v = params[name];
    v.resize(d.size());
    trident::copy(d, trident::space_span<half_type, trident::host_space>(v));
    return {v.data(), v.size()};
  }
  trident::space_span<half_type, trident::host_space> gradients(const std::string& name) {
    auto d = z.gradients(name);
    auto& v = grads[name];
    v.resize(d.size());
    trident::copy(d, trident::space_span<half_type, trident::host_space>(v));
    return {v.data(), v.size()};
  }
  void release(int layer) { z.release(layer); }
  void grad_ready(int layer) {
    for (auto it = grads.begin(); it != grads.end();) {
      if (z.layout().find(it->first).layer != layer) {
        ++it;
        continue;
      }
      auto d = z.gradients(it->first);
      trident::copy(trident::space_span<const half_type, trident::host_space>(it->second), d);
      it = grads.erase(it);
    }
    z.grad_ready(layer);
  }
};

}  // namespace mlp
