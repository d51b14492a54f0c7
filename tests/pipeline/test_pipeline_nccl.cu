// The pipeline executor over NCCL (mpirun -np 2 or 4: ranks share GPU 0, told apart by
// NCCL_HOSTID): stages whose messages are device buffers, one stage per rank, GPipe and 1F1B
// for m = 1, 3, 8, against the same layers trained by gradient accumulation on the host.
// Skips (77) without a device, like the other NCCL tests.
//
// The contract these stages keep: forward and backward return with their output written
// (they synchronise their stream), so the communicator's stream may read it; what arrives is
// complete when the executor hands it over (a request's wait() blocks until NCCL is done).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "pipeline/pipeline_suite.hpp"
#include "support/nccl_mpi_main.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/parallel/pipeline/pipeline.hpp"

namespace {

std::optional<trident::nccl_comm> world;
namespace pp = trident::pipeline;
using dbuf = trident::buffer<float, trident::cuda_space>;

constexpr std::size_t rows = 5, width = 16;

dbuf on_device(const std::vector<float>& host) {
  dbuf b(host.size());
  trident::copy(std::span<const float>(host), b);
  return b;
}

// y = tanh(x * w + b), feature-wise.
__global__ void forward_kernel(const float* x, const float* w, const float* b, float* y, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = tanhf(x[i] * w[i % width] + b[i % width]);
}
// dz = dy (1 - y^2); dx = dz w.
__global__ void backward_kernel(const float* y, const float* w, const float* dy, float* dz, float* dx, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    dz[i] = dy[i] * (1.0f - y[i] * y[i]);
    dx[i] = dz[i] * w[i % width];
  }
}
// dw += sum over rows of dz x, db += sum of dz: one thread per feature, rows in order.
__global__ void weight_kernel(const float* x, const float* dz, float* dw, float* db) {
  const std::size_t f = threadIdx.x;
  if (f >= width) return;
  float gw = 0, gb = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    gw += dz[r * width + f] * x[r * width + f];
    gb += dz[r * width + f];
  }
  dw[f] += gw;
  db[f] += gb;
}

// The host's version of the same layer, for the oracle.
struct host_layer {
  std::vector<float> w, b, dw, db;
  std::map<int, std::pair<std::vector<float>, std::vector<float>>> saved;
  std::vector<float> forward(const std::vector<float>& x, int mb) {
    std::vector<float> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = std::tanh(x[i] * w[i % width] + b[i % width]);
    saved[mb] = {x, y};
    return y;
  }
  std::vector<float> backward(const std::vector<float>& dy, int mb) {
    auto [x, y] = saved.at(mb);
    saved.erase(mb);
    std::vector<float> dz(dy.size()), dx(dy.size());
    for (std::size_t i = 0; i < dy.size(); ++i) {
      dz[i] = dy[i] * (1.0f - y[i] * y[i]);
      dx[i] = dz[i] * w[i % width];
    }
    for (std::size_t f = 0; f < width; ++f) {
      float gw = 0, gb = 0;
      for (std::size_t r = 0; r < rows; ++r) {
        gw += dz[r * width + f] * x[r * width + f];
        gb += dz[r * width + f];
      }
      dw[f] += gw;
      db[f] += gb;
    }
    return dx;
  }
};

host_layer make_host_layer(std::size_t k) {
  return {pipeline_suite::random(width, 10 + 2 * k, 0.9f), pipeline_suite::random(width, 11 + 2 * k, 0.2f),
          std::vector<float>(width, 0.0f), std::vector<float>(width, 0.0f), {}};
}

class device_stage {
 public:
  using input_type = dbuf;
  using output_type = dbuf;
  explicit device_stage(std::size_t k) {
    const auto h = make_host_layer(k);
    w_ = on_device(h.w);
    b_ = on_device(h.b);
    dw_ = on_device(h.dw);
    db_ = on_device(h.db);
  }
  std::size_t input_numel() const { return rows * width; }
  std::size_t output_numel() const { return rows * width; }
  dbuf forward(const dbuf& x, int mb) {
    dbuf keep_x(x.size()), y(x.size());
    TRIDENT_CUDA_CHECK(cudaMemcpy(keep_x.data(), x.data(), x.size() * sizeof(float), cudaMemcpyDeviceToDevice));
    forward_kernel<<<1, 128>>>(x.data(), w_.data(), b_.data(), y.data(), x.size());
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    dbuf keep_y(y.size());
    TRIDENT_CUDA_CHECK(cudaMemcpy(keep_y.data(), y.data(), y.size() * sizeof(float), cudaMemcpyDeviceToDevice));
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    saved_.insert_or_assign(mb, std::pair<dbuf, dbuf>{std::move(keep_x), std::move(keep_y)});
    return y;
  }
  dbuf backward(const dbuf& dy, int mb) {
    auto node = saved_.extract(mb);
    REQUIRE(!node.empty());
    const auto& [x, y] = node.mapped();
    dbuf dz(dy.size()), dx(dy.size());
    backward_kernel<<<1, 128>>>(y.data(), w_.data(), dy.data(), dz.data(), dx.data(), dy.size());
    weight_kernel<<<1, 32>>>(x.data(), dz.data(), dw_.data(), db_.data());
    TRIDENT_CUDA_CHECK(cudaGetLastError());
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    return dx;
  }
  std::vector<float> weight_grad() const { return trident::to_vector(dw_); }
  std::vector<float> bias_grad() const { return trident::to_vector(db_); }

 private:
  dbuf w_, b_, dw_, db_;
  std::map<int, std::pair<dbuf, dbuf>> saved_;
};
static_assert(pp::stage<device_stage>);

double max_relative(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, s = 1e-6;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
    s = std::max(s, std::abs(static_cast<double>(b[i])));
  }
  return d / s;
}

template <std::size_t N>
void equals_host(const pp::schedule& s) {
  auto& comm = *world;
  const int m = s.micro_batches, r = comm.rank();
  // The oracle: every layer on the host, gradient accumulation over the m micro-batches.
  std::vector<host_layer> layers;
  for (std::size_t k = 0; k < N; ++k) layers.push_back(make_host_layer(k));
  std::vector<double> host_losses;
  auto target = [](int mb) { return pipeline_suite::random(rows * width, 300 + static_cast<std::uint64_t>(mb), 0.8f); };
  auto input = [](int mb) { return pipeline_suite::random(rows * width, 200 + static_cast<std::uint64_t>(mb)); };
  for (int mb = 0; mb < m; ++mb) {
    auto y = input(mb);
    for (auto& l : layers) y = l.forward(y, mb);
    const auto t = target(mb);
    std::vector<float> dy(y.size());
    double loss = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      dy[i] = (y[i] - t[i]) / static_cast<float>(m);
      loss += 0.5 * static_cast<double>(y[i] - t[i]) * (y[i] - t[i]) / m;
    }
    host_losses.push_back(loss);
    for (std::size_t k = N; k-- > 0;) dy = layers[k].backward(dy, mb);
  }

  std::vector<dbuf> inputs;
  for (int mb = 0; mb < m; ++mb) inputs.push_back(on_device(input(mb)));
  pp::uniform_pipeline<device_stage, N> pipe(comm, [](auto k) { return device_stage(k); });
  auto out = pipe.run(
      comm, s, [&](int mb) -> const dbuf& { return inputs[static_cast<std::size_t>(mb)]; },
      [&](const dbuf& yd, int mb, dbuf& dyd) {
        const auto y = trident::to_vector(yd), t = target(mb);
        std::vector<float> dy(y.size());
        double loss = 0;
        for (std::size_t i = 0; i < y.size(); ++i) {
          dy[i] = (y[i] - t[i]) / static_cast<float>(m);
          loss += 0.5 * static_cast<double>(y[i] - t[i]) * (y[i] - t[i]) / m;
        }
        trident::copy(std::span<const float>(dy), dyd);
        return loss;
      });
  INFO("schedule ", s.name, ", p = ", N, ", m = ", m, ", NCCL rank ", r);
  pipe.visit(r, [&](device_stage& st) {
    CHECK(max_relative(st.weight_grad(), layers[static_cast<std::size_t>(r)].dw) <= 1e-5);
    CHECK(max_relative(st.bias_grad(), layers[static_cast<std::size_t>(r)].db) <= 1e-5);
  });
  if (pipe.owns(static_cast<int>(N) - 1)) {
    REQUIRE(out.losses.size() == host_losses.size());
    for (std::size_t i = 0; i < host_losses.size(); ++i) CHECK(std::abs(out.losses[i] - host_losses[i]) <= 1e-5 * std::abs(host_losses[i]) + 1e-7);
  }
}

}  // namespace

TEST_CASE("pipeline executor over NCCL: GPipe and 1F1B with device messages = gradient accumulation on the host") {
  const int p = world->size();
  for (int m : {1, 3, 8})
    for (const auto& s : {pp::gpipe(p, m), pp::one_f_one_b(p, m)}) {
      if (p == 2) equals_host<2>(s);
      else if (p == 4) equals_host<4>(s);
      else FAIL("run with 2 or 4 ranks");
    }
}

int main(int argc, char** argv) { return test_support::nccl_mpi_doctest_main(argc, argv, world); }
