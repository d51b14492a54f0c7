// The CUDA reference layers against the host ones on random data: cuBLAS GEMMs within float
// tolerance of nn::gemm, the bias gradient and the MSE gradient bitwise (same order, no FMA),
// activations within a few ulp (tanhf), losses within double-sum rounding; accumulation
// semantics on the device; cuBLAS errors thrown as cublas_error. Skipped without a device.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/random.hpp"
#include "trident/core/buffer.hpp"
#include "trident/nn/activation.hpp"
#include "trident/nn/cuda/cublas.hpp"
#include "trident/nn/cuda/layers.cuh"
#include "trident/nn/linear.hpp"
#include "trident/nn/loss.hpp"

namespace nn = trident::nn;
using trident::buffer;
using trident::cuda_space;

namespace {

using test_support::random_vector;

template <class T>
buffer<T, cuda_space> to_device(const std::vector<T>& v) {
  buffer<T, cuda_space> d(v.size());
  trident::copy(std::span<const T>{v}, d);
  return d;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                 const std::string& what) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  std::size_t where = 0;
  bool ok = true;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::abs(static_cast<double>(want[i])))) ok = false;
    if (!(err <= worst)) {
      worst = err;
      where = i;
    }
  }
  INFO(what, ": worst error ", worst, " at ", where);
  CHECK(ok);
}

}  // namespace

TEST_CASE("cuda::gemm matches nn::gemm for every op pair") {
  nn::cublas_handle blas;
  cudaStream_t stream = nullptr;
  TRIDENT_CUDA_CHECK(cudaStreamCreate(&stream));
  const std::size_t m = 37, n = 21, k = 300;
  for (const nn::op op_a : {nn::op::n, nn::op::t})
    for (const nn::op op_b : {nn::op::n, nn::op::t}) {
      const std::size_t lda = op_a == nn::op::n ? k : m, ldb = op_b == nn::op::n ? n : k;
      const auto a = random_vector(m * k, 1), b = random_vector(k * n, 2), c = random_vector(m * n, 3);
      auto host = c;
      nn::gemm(op_a, op_b, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, host.data(), n);
      auto da = to_device(a), db = to_device(b), dc = to_device(c);
      nn::cuda::gemm(blas, stream, op_a, op_b, m, n, k, 0.5f, da.data(), lda, db.data(), ldb, 1.0f, dc.data(), n);
      TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream));
      check_close(trident::to_vector(dc), host, 2e-5, 1e-5, "gemm");
    }
  TRIDENT_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST_CASE("cuda::linear matches nn::linear, accumulating dW and db like the host") {
  nn::cublas_handle blas;
  cudaStream_t stream = nullptr;
  TRIDENT_CUDA_CHECK(cudaStreamCreate(&stream));
  const std::size_t batch = 33, in = 70, out = 19;
  const nn::linear host_fc{.in_features = in, .out_features = out};
  const nn::cuda::linear fc{.in_features = in, .out_features = out};
  const auto x = random_vector(batch * in, 11), w = random_vector(out * in, 12), b = random_vector(out, 13);
  const auto dy = random_vector(batch * out, 14), dw0 = random_vector(out * in, 15), db0 = random_vector(out, 16);

  std::vector<float> y(batch * out), dx(batch * in);
  auto dw = dw0, db = db0;
  host_fc.forward(batch, x, w, b, y);
  host_fc.backward(batch, x, w, dy, dx, dw, db);

  auto d_x = to_device(x), d_w = to_device(w), d_b = to_device(b), d_dy = to_device(dy);
  auto d_dw = to_device(dw0), d_db = to_device(db0);
  buffer<float, cuda_space> d_y(batch * out), d_dx(batch * in);
  fc.forward(blas, stream, batch, d_x.device_handle(), d_w.device_handle(), d_b.device_handle(), d_y.device_handle());
  fc.backward(blas, stream, batch, d_x.device_handle(), d_w.device_handle(), d_dy.device_handle(),
              d_dx.device_handle(), d_dw.device_handle(), d_db.device_handle());
  TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream));
  check_close(trident::to_vector(d_y), y, 2e-5, 1e-5, "y");
  check_close(trident::to_vector(d_dx), dx, 2e-5, 1e-5, "dx");
  check_close(trident::to_vector(d_dw), dw, 2e-5, 1e-5, "dW");
  CHECK(trident::to_vector(d_db) == db);  // same order, no FMA: bitwise

  // A second micro-batch accumulates again; no dx, no bias.
  fc.backward(blas, stream, batch, d_x.device_handle(), d_w.device_handle(), d_dy.device_handle(), {},
              d_dw.device_handle(), {});
  host_fc.backward(batch, x, w, dy, {}, dw, {});
  TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream));
  check_close(trident::to_vector(d_dw), dw, 4e-5, 1e-5, "dW after two micro-batches");

  CHECK_THROWS_AS(fc.forward(blas, stream, batch + 1, d_x.device_handle(), d_w.device_handle(), d_b.device_handle(),
                             d_y.device_handle()),
                  trident::usage_error);
  TRIDENT_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST_CASE("cuda activations match the host's") {
  const auto x = random_vector(10007, 21, -6.0f, 6.0f), dy = random_vector(10007, 22);
  auto d_x = to_device(x), d_dy = to_device(dy);
  buffer<float, cuda_space> d_y(x.size()), d_dx(x.size());
  std::vector<float> y(x.size()), dx(x.size());

  nn::relu::forward(x, y);
  nn::relu::backward(x, dy, dx);
  nn::cuda::activation_forward<nn::relu>(d_x.device_handle(), d_y.device_handle());
  nn::cuda::activation_backward<nn::relu>(d_x.device_handle(), d_dy.device_handle(), d_dx.device_handle());
  CHECK(trident::to_vector(d_y) == y);
  CHECK(trident::to_vector(d_dx) == dx);

  nn::gelu::forward(x, y);
  nn::gelu::backward(x, dy, dx);
  nn::cuda::activation_forward<nn::gelu>(d_x.device_handle(), d_y.device_handle());
  nn::cuda::activation_backward<nn::gelu>(d_x.device_handle(), d_dy.device_handle(), d_dx.device_handle());
  check_close(trident::to_vector(d_y), y, 1e-6, 1e-6, "gelu");
  check_close(trident::to_vector(d_dx), dx, 1e-6, 1e-6, "gelu backward");
}

TEST_CASE("cuda losses match the host's") {
  const std::size_t batch = 300, classes = 1000;
  const auto pred = random_vector(4099, 31), target = random_vector(4099, 32);
  auto d_pred = to_device(pred), d_target = to_device(target);
  buffer<float, cuda_space> d_loss(1), d_grad(pred.size());
  nn::cuda::mse_loss_forward(d_pred.device_handle(), d_target.device_handle(), d_loss.device_handle());
  nn::cuda::mse_loss_backward(d_pred.device_handle(), d_target.device_handle(), d_grad.device_handle(), 0.5f);
  std::vector<float> grad(pred.size());
  nn::mse_loss::backward(pred, target, grad, 0.5f);
  CHECK(trident::to_vector(d_loss)[0] == doctest::Approx(nn::mse_loss::forward(pred, target)).epsilon(1e-6));
  CHECK(trident::to_vector(d_grad) == grad);

  const auto logits = random_vector(batch * classes, 33, -20.0f, 20.0f);
  std::vector<std::int32_t> targets(batch);
  for (std::size_t r = 0; r < batch; ++r) targets[r] = static_cast<std::int32_t>((r * 7919) % classes);
  auto d_logits = to_device(logits);
  auto d_targets = to_device(targets);
  buffer<float, cuda_space> d_dlogits(logits.size());
  nn::cuda::softmax_cross_entropy_forward(batch, classes, d_logits.device_handle(), d_targets.device_handle(),
                                          d_loss.device_handle());
  nn::cuda::softmax_cross_entropy_backward(batch, classes, d_logits.device_handle(), d_targets.device_handle(),
                                           d_dlogits.device_handle(), 2.0f);
  std::vector<float> dlogits(logits.size());
  nn::softmax_cross_entropy::backward(batch, classes, logits, targets, dlogits, 2.0f);
  CHECK(trident::to_vector(d_loss)[0] ==
        doctest::Approx(nn::softmax_cross_entropy::forward(batch, classes, logits, targets)).epsilon(1e-6));
  check_close(trident::to_vector(d_dlogits), dlogits, 1e-9, 1e-6, "cross-entropy backward");

  // A target out of range cannot throw from a kernel: the loss is NaN.
  targets[3] = static_cast<std::int32_t>(classes);
  auto d_bad = to_device(targets);
  nn::cuda::softmax_cross_entropy_forward(batch, classes, d_logits.device_handle(), d_bad.device_handle(),
                                          d_loss.device_handle());
  CHECK(std::isnan(trident::to_vector(d_loss)[0]));
}

TEST_CASE("a failing cuBLAS call throws cublas_error with its status") {
  nn::cublas_handle blas;
  float x = 0;
  try {
    TRIDENT_CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, -1, 1, 1, &x, &x, 1, &x, 1, &x, &x, 1));
    FAIL("no exception");
  } catch (const trident::cublas_error& e) {
    CHECK(e.status() == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(e.operation().find("cublasSgemm") != std::string::npos);
    CHECK(std::string(e.what()).find("CUBLAS_STATUS_INVALID_VALUE") != std::string::npos);
  }
  nn::cublas_handle moved = std::move(blas);
  CHECK(moved.get() != nullptr);
  CHECK(blas.get() == nullptr);
}
