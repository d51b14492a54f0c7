// The tensor-parallel linear layers on the GPU over NCCL (mpirun -np 2 or 4: ranks share GPU 0,
// told apart by NCCL_HOSTID): an MLP (column-parallel fc1 -> GELU -> row-parallel fc2) forward
// and backward on the device, against the unsharded MLP computed on the host by every rank.
// Skips (77) without a device, like the other NCCL tests.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <optional>
#include <vector>

#include "support/nccl_mpi_main.hpp"
#include "tensor/tensor_suite.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/exec/cuda/stream.hpp"
#include "trident/nn/cuda/cublas.hpp"
#include "trident/nn/cuda/layers.cuh"
#include "trident/parallel/tensor/cuda/linear.cuh"

namespace {

std::optional<trident::nccl_comm> world;

trident::buffer<float, trident::cuda_space> on_device(const std::vector<float>& host) {
  trident::buffer<float, trident::cuda_space> b(host.size());
  trident::copy(std::span<const float>(host), b);
  return b;
}
trident::buffer<float, trident::cuda_space> zeros(std::size_t n) {
  trident::buffer<float, trident::cuda_space> b(n);
  trident::fill_zero(b);
  return b;
}
std::vector<float> on_host(const trident::buffer<float, trident::cuda_space>& b) { return trident::to_vector(b); }

void mlp(bool overlap) {
  auto& tp = *world;
  const int r = tp.rank();
  const std::size_t batch = 6, hidden = 16, ffn = 64;
  const auto x = tensor_suite::random(batch * hidden, 7);
  const auto w1 = tensor_suite::random(ffn * hidden, 8, 0.3f), b1 = tensor_suite::random(ffn, 9, 0.1f);
  const auto w2 = tensor_suite::random(hidden * ffn, 10, 0.3f), b2 = tensor_suite::random(hidden, 11, 0.1f);
  const auto dy = tensor_suite::random(batch * hidden, 12);

  // The unsharded MLP on the host.
  const trident::nn::linear fc1{hidden, ffn}, fc2{ffn, hidden};
  std::vector<float> h(batch * ffn), a(batch * ffn), y(batch * hidden), da(batch * ffn), dh(batch * ffn), dx(batch * hidden);
  std::vector<float> dw1(w1.size()), db1(b1.size()), dw2(w2.size()), db2(b2.size());
  fc1.forward(batch, x, w1, b1, h);
  trident::nn::gelu::forward(h, a);
  fc2.forward(batch, a, w2, b2, y);
  fc2.backward(batch, a, w2, dy, da, dw2, db2);
  trident::nn::gelu::backward(h, da, dh);
  fc1.backward(batch, x, w1, dh, dx, dw1, db1);

  // The same on the GPU, each rank with its parts.
  trident::cuda_context ctx;
  trident::nn::cublas_handle blas;
  trident::tensor::cuda::column_parallel_linear pfc1(tp, hidden, ffn, "fc1");
  const trident::tensor::cuda::row_parallel_linear pfc2(tp, ffn, hidden, "fc2");
  pfc1.overlap = overlap;
  const auto& s1 = pfc1.shape();
  const auto& s2 = pfc2.shape();
  const std::size_t local = s1.local_out_features();
  auto d_x = on_device(x), d_dy = on_device(dy);
  auto d_w1 = on_device(tensor_suite::part_of(s1.weight_sharding(), r, w1));
  auto d_b1 = on_device(tensor_suite::part_of(s1.bias_sharding(), r, b1));
  auto d_w2 = on_device(tensor_suite::part_of(s2.weight_sharding(), r, w2)), d_b2 = on_device(b2);
  auto d_h = zeros(batch * local), d_a = zeros(batch * local), d_y = zeros(batch * hidden);
  auto d_da = zeros(batch * local), d_dh = zeros(batch * local), d_dx = zeros(batch * hidden);
  auto d_dw1 = zeros(d_w1.size()), d_db1 = zeros(d_b1.size()), d_dw2 = zeros(d_w2.size()), d_db2 = zeros(b2.size());
  // The uploads and clears above ran on the legacy stream; the layers run on ctx's and tp's.
  TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
  pfc1.forward(ctx, blas, tp, batch, d_x.device_handle(), d_w1.device_handle(), d_b1.device_handle(), d_h.device_handle());
  trident::nn::cuda::activation_forward<trident::nn::gelu>(d_h.device_handle(), d_a.device_handle(), ctx.stream());
  pfc2.forward(ctx, blas, tp, batch, d_a.device_handle(), d_w2.device_handle(), d_b2.device_handle(), d_y.device_handle());
  pfc2.backward(ctx, blas, tp, batch, d_a.device_handle(), d_w2.device_handle(), d_dy.device_handle(), d_da.device_handle(),
                d_dw2.device_handle(), d_db2.device_handle());
  trident::nn::cuda::activation_backward<trident::nn::gelu>(d_h.device_handle(), d_da.device_handle(), d_dh.device_handle(),
                                                            ctx.stream());
  pfc1.backward(ctx, blas, tp, batch, d_x.device_handle(), d_w1.device_handle(), d_dh.device_handle(), d_dx.device_handle(),
                d_dw1.device_handle(), d_db1.device_handle());
  ctx.synchronize();

  INFO("tensor-parallel MLP on NCCL rank ", r, " of ", tp.size(), overlap ? ", overlap" : "");
  CHECK(tensor_suite::relative_error(on_host(d_y), y) <= 1e-5);
  CHECK(tensor_suite::relative_error(on_host(d_dx), dx) <= 1e-5);
  CHECK(tensor_suite::relative_error(on_host(d_dw1), tensor_suite::part_of(s1.weight_sharding(), r, dw1)) <= 1e-5);
  CHECK(tensor_suite::relative_error(on_host(d_db1), tensor_suite::part_of(s1.bias_sharding(), r, db1)) <= 1e-5);
  CHECK(tensor_suite::relative_error(on_host(d_dw2), tensor_suite::part_of(s2.weight_sharding(), r, dw2)) <= 1e-5);
  CHECK(tensor_suite::relative_error(on_host(d_db2), db2) <= 1e-5);
}

}  // namespace

TEST_CASE("tensor-parallel MLP on NCCL = the unsharded MLP (overlap on and off)") {
  mlp(true);
  mlp(false);
}

TEST_CASE("tensor-parallel layers on NCCL: a layer built for another group size is named") {
  auto& tp = *world;
  auto alone = tp.split(tp.rank(), 0);
  const trident::tensor::cuda::row_parallel_linear fc(alone, 4, 4, "fc");
  trident::cuda_context ctx;
  trident::nn::cublas_handle blas;
  trident::device_span<float> none;
  if (tp.size() > 1)
    CHECK_THROWS_WITH_AS(fc.backward(ctx, blas, tp, 1, none, none, none, none, none, none),
                         doctest::Contains("fc.backward: the tensor-parallel communicator has"), trident::usage_error);
}

int main(int argc, char** argv) { return test_support::nccl_mpi_doctest_main(argc, argv, world); }
