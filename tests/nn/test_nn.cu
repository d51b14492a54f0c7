// The CUDA reference layers against the host ones on random data: cuBLAS GEMMs within float
// tolerance of nn::gemm (in TF32 math: of nn::gemm on TF32 operands), LayerNorm, RMSNorm, causal attention and the bias gradient within 1e-5, the MSE gradient bitwise (same order, no FMA),
// activations within a few ulp (tanhf), losses within double-sum rounding; accumulation
// semantics on the device; cuBLAS errors thrown as cublas_error. Skipped without a device.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "support/random.hpp"
#include "trident/core/buffer.hpp"
#include "trident/nn/activation.hpp"
#include "trident/nn/attention.hpp"
#include "trident/nn/flash_attention.hpp"
#include "trident/nn/flash_bf16.hpp"
#include "trident/nn/cuda/attention.cuh"
#include "trident/nn/cuda/cublas.hpp"
#include "trident/nn/cuda/flash_attention.cuh"
#include "trident/nn/cuda/flash_bf16.cuh"
#include "trident/nn/cuda/layers.cuh"
#include "trident/nn/cuda/norm.cuh"
#include "trident/nn/linear.hpp"
#include "trident/nn/loss.hpp"
#include "trident/nn/norm.hpp"

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

// Outputs start as NaN in the attention tests: an element the kernels never write fails the
// comparisons (normwise counts a non-finite element as infinitely far).
buffer<float, cuda_space> nans(std::size_t n) { return to_device(std::vector<float>(n, NAN)); }

// The largest difference over the largest element of want (infinite where got is not finite):
// the attention tests' measure, so one far-off element is not averaged away.
double normwise(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff = std::isfinite(got[i]) ? std::max(diff, std::abs(static_cast<double>(got[i]) - want[i])) : INFINITY;
    norm = std::max(norm, std::abs(static_cast<double>(want[i])));
  }
  return diff / norm;
}
// The largest absolute difference between two vectors of one size.
double largest_difference(const std::vector<float>& x, const std::vector<float>& y) {
  double w = 0;
  for (std::size_t i = 0; i < x.size(); ++i) w = std::max(w, std::abs(static_cast<double>(x[i]) - y[i]));
  return w;
}

// v rounded to TF32: at bit 13, ties away (a test's reference, not the tensor cores' rule).
float to_tf32(float v) {
  const auto bits = trident::detail::bit_cast<std::uint32_t>(v);
  return trident::detail::bit_cast<float>((bits + 0x1000u) & 0xffffe000u);
}

struct attention_case {
  std::size_t seq, batch, heads, head_dim;
};
// Partial tiles (37, 130), one tile exactly (64), GPT-2's head_dim at a longer seq (300); head_dim 32
// over one tile and over three.
const attention_case attention_cases[] = {{37, 1, 2, 32}, {130, 1, 2, 32}, {64, 2, 1, 64}, {130, 2, 3, 64}, {300, 1, 2, 64}};

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

TEST_CASE("cuda::gemm and gemm_strided_batched in tf32 math: tensor cores on TF32 operands, summed in float") {
  nn::cublas_handle blas;
  CHECK(blas.math() == nn::gemm_math::fp32);  // the default
  // The host's product of the operands as they are, and of them rounded to TF32 (10 mantissa
  // bits). On an H100 cuBLAS's TF32 product was 10x closer to the second than to the first
  // (5.9e-4 against 5.8e-3 here; not closer still: the tensor cores' own summation).
  auto product = [](const std::vector<float>& a, const std::vector<float>& b, std::size_t count, std::size_t m, std::size_t n,
                    std::size_t k, auto round) {
    std::vector<float> ra(a.size()), rb(b.size()), c(count * m * n, 0.0f);
    for (std::size_t i = 0; i < a.size(); ++i) ra[i] = round(a[i]);
    for (std::size_t i = 0; i < b.size(); ++i) rb[i] = round(b[i]);
    for (std::size_t p = 0; p < count; ++p)
      nn::gemm(nn::op::n, nn::op::n, m, n, k, 1.0f, ra.data() + p * m * k, k, rb.data() + p * k * n, n, 0.0f, c.data() + p * m * n, n);
    return c;
  };
  const auto as_is = [](float v) { return v; };
  const auto nearest = to_tf32;
  int major = 0;
  TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  const std::size_t count = 3, m = 64, n = 48, k = 320;
  const auto a = random_vector(count * m * k, 4), b = random_vector(count * k * n, 5);
  const auto exact = product(a, b, count, m, n, k, as_is), tf32 = product(a, b, count, m, n, k, nearest);
  auto da = to_device(a), db = to_device(b);
  for (const nn::gemm_math math : {nn::gemm_math::fp32, nn::gemm_math::tf32}) {
    blas.set_math(math);
    buffer<float, cuda_space> single(m * n), batched(count * m * n);
    nn::cuda::gemm(blas, 0, nn::op::n, nn::op::n, m, n, k, 1.0f, da.data(), k, db.data(), n, 0.0f, single.data(), n);
    nn::cuda::gemm_strided_batched(blas, 0, nn::op::n, nn::op::n, m, n, k, 1.0f, da.data(), k, m * k, db.data(), n, k * n, 0.0f,
                                   batched.data(), n, m * n, count);
    const auto one = trident::to_vector(single), all = trident::to_vector(batched);
    const auto first = [&](const std::vector<float>& v) { return std::vector<float>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m * n)); };
    MESSAGE(std::string(nn::name(math)), " math: largest difference from the exact product ", largest_difference(all, exact),
            ", from the TF32 operands' ", largest_difference(all, tf32));
    if (math == nn::gemm_math::fp32) {
      CHECK(largest_difference(one, first(exact)) <= 1e-4);
      CHECK(largest_difference(all, exact) <= 1e-4);
    } else if (major >= 8) {  // TF32 tensor cores (before sm_80 cuBLAS computes this in FP32)
      CHECK(largest_difference(all, exact) > 1e-3);                              // the operands were rounded
      CHECK(largest_difference(all, tf32) < largest_difference(all, exact) / 4);  // to TF32
      CHECK(largest_difference(one, first(tf32)) < largest_difference(one, first(exact)) / 4);
    }
  }
  // A raw handle is FP32 math; a cublas_handle carries its own.
  CHECK(nn::blas_ref(blas.get()).math == nn::gemm_math::fp32);
  CHECK(nn::blas_ref(blas).math == nn::gemm_math::tf32);
}

TEST_CASE("cuda::gemm in bf16 math: both operands rounded to bf16 as core/half.hpp rounds, bf16 tensor cores, float sums") {
  // Asking for bf16 without the rounding kernel is refused by name (cublas.hpp is host code).
  nn::cublas_handle blas;
  try {
    blas.set_math(nn::gemm_math::bf16);
    FAIL("expected set_math(bf16) without a rounding kernel to be refused");
  } catch (const trident::usage_error& e) {
    CHECK(std::string(e.what()).find("use_bf16_gemm") != std::string::npos);
  }
  CHECK(blas.math() == nn::gemm_math::fp32);

  // The rounding kernel: the host's bits for every value, on the 4-wide path (aligned, a tail of
  // 3) and the one-at-a-time one (an odd offset), specials included.
  std::vector<float> values = random_vector(4099, 21, -3.0f, 3.0f);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-42f, 3.3895314e38f, 1.00390625f,
                            1.01171875f, 1.0f + 1.0f / 256.0f + 1.0f / 65536.0f, std::numeric_limits<float>::max()};
  std::copy(std::begin(specials), std::end(specials), values.begin() + 100);
  auto d_values = to_device(values);
  buffer<trident::bf16, cuda_space> rounded(values.size());
  for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
    const std::size_t count = values.size() - offset;
    nn::cuda::round_to_bf16(d_values.data() + offset, rounded.data(), count, nullptr);
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = trident::to_vector(rounded);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const float v = values[i + offset];
      // A NaN stays a NaN; its payload may differ between host and device (core/half.hpp).
      if (std::isnan(v)) wrong += !std::isnan(static_cast<float>(got[i]));
      else wrong += got[i].bits() != trident::bf16(v).bits();
    }
    INFO("offset ", offset, ": ", wrong, " of ", count, " roundings differ from the host's");
    CHECK(wrong == 0);
  }

  // GEMMs: within float summation of the host's product of the rounded operands, and (sm_80+:
  // bf16 tensor cores) much further from the product of the operands as they are. Transposed
  // operands with padded leading dimensions round only the memory the matrices span.
  auto rounded_copy = [](std::vector<float> v) {
    for (auto& x : v) x = static_cast<float>(trident::bf16(x));
    return v;
  };
  int major = 0;
  TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 8) {  // bf16 tensor cores: cuBLAS may refuse bf16 operands before sm_80
    MESSAGE("compute capability ", major, ".x: the bf16 GEMMs are not checked here");
    return;
  }
  nn::cuda::use_bf16_gemm(blas);
  CHECK(blas.math() == nn::gemm_math::bf16);
  CHECK(nn::blas_ref(blas).math == nn::gemm_math::bf16);
  const std::size_t m = 64, n = 48, k = 320;
  for (const nn::op op_a : {nn::op::n, nn::op::t})
    for (const nn::op op_b : {nn::op::n, nn::op::t}) {
      // Stored shapes: A [m, k] or [k, m], B [k, n] or [n, k], each row padded by 3.
      const std::size_t a_rows = op_a == nn::op::n ? m : k, a_cols = op_a == nn::op::n ? k : m, lda = a_cols + 3;
      const std::size_t b_rows = op_b == nn::op::n ? k : n, b_cols = op_b == nn::op::n ? n : k, ldb = b_cols + 3;
      const auto a = random_vector(a_rows * lda, 22), b = random_vector(b_rows * ldb, 23), c0 = random_vector(m * n, 24);
      auto exact = c0, want = c0;
      nn::gemm(op_a, op_b, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, exact.data(), n);
      const auto ra = rounded_copy(a), rb = rounded_copy(b);
      nn::gemm(op_a, op_b, m, n, k, 0.5f, ra.data(), lda, rb.data(), ldb, 2.0f, want.data(), n);
      auto da = to_device(a), db = to_device(b), dc = to_device(c0);
      nn::cuda::gemm(blas, nullptr, op_a, op_b, m, n, k, 0.5f, da.data(), lda, db.data(), ldb, 2.0f, dc.data(), n);
      TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = trident::to_vector(dc);
      // Relative to the largest element (about 20 here): float sums of exact bf16 products.
      const double from_rounded = normwise(got, want), from_exact = normwise(got, exact);
      INFO("op_a ", std::string(op_a == nn::op::n ? "n" : "t"), ", op_b ", std::string(op_b == nn::op::n ? "n" : "t"),
           ": from the rounded operands' product ", from_rounded, ", from the exact one ", from_exact);
      CHECK(from_rounded <= 1e-5);
      CHECK(from_exact > 10 * from_rounded);
      // bf16 operands in memory directly: the same product.
      buffer<trident::bf16, cuda_space> a16(a.size()), b16(b.size());
      nn::cuda::round_to_bf16(da.data(), a16.data(), a.size(), nullptr);
      nn::cuda::round_to_bf16(db.data(), b16.data(), b.size(), nullptr);
      auto dc2 = to_device(c0);
      nn::cuda::gemm(blas, nullptr, op_a, op_b, m, n, k, 0.5f, a16.data(), lda, b16.data(), ldb, 2.0f, dc2.data(), n);
      TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(largest_difference(trident::to_vector(dc2), got) <= 1e-5);
    }
  // The scratch held both operands of the largest GEMM, as `other` memory; it does not grow again.
  const std::size_t scratch = blas.bf16_scratch_bytes();
  CHECK(scratch >= sizeof(trident::bf16) * ((k - 1) * (m + 3) + m + (k - 1) * (n + 3) + n));
  {
    const auto a = random_vector(m * k, 25), b = random_vector(k * n, 26);
    auto da = to_device(a), db = to_device(b);
    buffer<float, cuda_space> dc(m * n);
    nn::cuda::gemm(blas, nullptr, nn::op::n, nn::op::n, m, n, k, 1.0f, da.data(), k, db.data(), n, 0.0f, dc.data(), n);
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(blas.bf16_scratch_bytes() == scratch);
    // Sized up front: exactly that, the outgrown scratch let go.
    blas.reserve_bf16_scratch(std::size_t{1} << 20);
    CHECK(blas.bf16_scratch_bytes() == (std::size_t{1} << 20) * sizeof(trident::bf16));

    // A raw handle has no rounding kernel: bf16 math through it is refused by name; the fused
    // bias declines (gemm then says why).
    try {
      nn::cuda::gemm(nn::blas_ref{blas.get(), nn::gemm_math::bf16}, nullptr, nn::op::n, nn::op::n, m, n, k, 1.0f, da.data(), k,
                     db.data(), n, 0.0f, dc.data(), n);
      FAIL("expected bf16 math through a raw handle to be refused");
    } catch (const trident::usage_error& e) {
      CHECK(std::string(e.what()).find("raw cublasHandle_t") != std::string::npos);
    }
    nn::blas_ref no_scratch(blas);  // cuBLASLt, but no rounding kernel or scratch
    no_scratch.bf16 = nullptr;
    CHECK_FALSE(nn::cuda::gemm_bias(no_scratch, nullptr, m, n, k, da.data(), db.data(), da.data(), dc.data()));

    // Attention's strided batched products stay TF32 under bf16 math: closer to the TF32
    // operands' product than to the bf16 ones'.
    {
      std::vector<float> ta = a, tb = b, want_tf32(m * n, 0.0f), want_bf16(m * n, 0.0f);
      for (auto& x : ta) x = to_tf32(x);
      for (auto& x : tb) x = to_tf32(x);
      nn::gemm(nn::op::n, nn::op::n, m, n, k, 1.0f, ta.data(), k, tb.data(), n, 0.0f, want_tf32.data(), n);
      const auto ra = rounded_copy(a), rb = rounded_copy(b);
      nn::gemm(nn::op::n, nn::op::n, m, n, k, 1.0f, ra.data(), k, rb.data(), n, 0.0f, want_bf16.data(), n);
      nn::cuda::gemm_strided_batched(blas, nullptr, nn::op::n, nn::op::n, m, n, k, 1.0f, da.data(), k, m * k, db.data(), n, k * n,
                                     0.0f, dc.data(), n, m * n, 1);
      TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = trident::to_vector(dc);
      CHECK(largest_difference(got, want_tf32) < largest_difference(got, want_bf16) / 4);
    }
  }

  // A linear layer in bf16 math: forward (the bias fused in cuBLASLt's epilogue where it has an
  // algorithm), dx and dW against the host's layer on the rounded operands, db from float dy.
  const std::size_t batch = 40, in = 72, out = 24;
  const nn::linear host_fc{.in_features = in, .out_features = out};
  const nn::cuda::linear fc{.in_features = in, .out_features = out};
  const auto x = random_vector(batch * in, 27), w = random_vector(out * in, 28), bias = random_vector(out, 29);
  const auto dy = random_vector(batch * out, 30);
  std::vector<float> y(batch * out), dx(batch * in), dw(out * in, 0.0f), db(out, 0.0f);
  const auto rx = rounded_copy(x), rw = rounded_copy(w), rdy = rounded_copy(dy);
  host_fc.forward(batch, rx, rw, bias, y);
  host_fc.backward(batch, rx, rw, rdy, dx, dw, {});
  std::vector<float> unused(out * in, 0.0f);
  host_fc.backward(batch, x, w, dy, {}, unused, db);
  auto d_x = to_device(x), d_w = to_device(w), d_b = to_device(bias), d_dy = to_device(dy);
  auto d_dw = to_device(std::vector<float>(out * in, 0.0f)), d_db = to_device(std::vector<float>(out, 0.0f));
  buffer<float, cuda_space> d_y(batch * out), d_dx(batch * in);
  fc.forward(blas, nullptr, batch, d_x.device_handle(), d_w.device_handle(), d_b.device_handle(), d_y.device_handle());
  fc.backward(blas, nullptr, batch, d_x.device_handle(), d_w.device_handle(), d_dy.device_handle(), d_dx.device_handle(),
              d_dw.device_handle(), d_db.device_handle());
  TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
  check_close(trident::to_vector(d_y), y, 1e-4, 1e-5, "bf16 y");
  check_close(trident::to_vector(d_dx), dx, 1e-4, 1e-5, "bf16 dx");
  check_close(trident::to_vector(d_dw), dw, 1e-4, 1e-5, "bf16 dW");
  check_close(trident::to_vector(d_db), db, 2e-5, 1e-5, "db (float dy)");

  // x already in bf16 (a producer rounded it): the same bits as the float x that rounds to it,
  // forward with and without the bias, and backward; only gemm_math::bf16 takes it.
  {
    buffer<trident::bf16, cuda_space> x16(x.size());
    nn::cuda::round_to_bf16(d_x.data(), x16.data(), x.size(), nullptr);
    const trident::device_span<const trident::bf16> cx16 = x16.device_handle();
    auto d_dw16 = to_device(std::vector<float>(out * in, 0.0f)), d_db16 = to_device(std::vector<float>(out, 0.0f));
    auto d_dw32 = to_device(std::vector<float>(out * in, 0.0f)), d_db32 = to_device(std::vector<float>(out, 0.0f));
    buffer<float, cuda_space> y16(batch * out), y32(batch * out), dx16(batch * in), dx32(batch * in);
    for (const bool with_bias : {true, false}) {
      const auto b = with_bias ? d_b.device_handle() : trident::device_span<const float>{};
      fc.forward(blas, nullptr, batch, cx16, d_w.device_handle(), b, y16.device_handle());
      fc.forward(blas, nullptr, batch, d_x.device_handle(), d_w.device_handle(), b, y32.device_handle());
      TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
      INFO("forward on bf16 x", with_bias ? " with a bias" : "");
      CHECK(trident::to_vector(y16) == trident::to_vector(y32));
    }
    fc.backward(blas, nullptr, batch, cx16, d_w.device_handle(), d_dy.device_handle(), dx16.device_handle(),
                d_dw16.device_handle(), d_db16.device_handle());
    fc.backward(blas, nullptr, batch, d_x.device_handle(), d_w.device_handle(), d_dy.device_handle(), dx32.device_handle(),
                d_dw32.device_handle(), d_db32.device_handle());
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(trident::to_vector(dx16) == trident::to_vector(dx32));
    CHECK(trident::to_vector(d_dw16) == trident::to_vector(d_dw32));
    CHECK(trident::to_vector(d_db16) == trident::to_vector(d_db32));
    nn::cublas_handle tf32;
    tf32.set_math(nn::gemm_math::tf32);
    CHECK_THROWS_WITH_AS(fc.forward(tf32, nullptr, batch, cx16, d_w.device_handle(), d_b.device_handle(), y16.device_handle()),
                         doctest::Contains("x in bf16 needs gemm_math::bf16"), trident::usage_error);

    // Producers that write bf16: LayerNorm and GELU give the bits their float output rounds to
    // (GELU on its four-at-a-time path and, from an odd offset, one at a time).
    const std::size_t rows = 37, hidden = 96;
    const nn::cuda::layer_norm ln{hidden};
    auto lx = to_device(random_vector(rows * hidden, 32, -2.0f, 2.0f)), lg = to_device(random_vector(hidden, 33, 0.5f, 1.5f));
    auto lb = to_device(random_vector(hidden, 34));
    buffer<float, cuda_space> l32(rows * hidden), mean(rows), rstd(rows);
    buffer<trident::bf16, cuda_space> l16(rows * hidden);
    ln.forward(nullptr, rows, lx.device_handle(), lg.device_handle(), lb.device_handle(), l32.device_handle(), mean.device_handle(),
               rstd.device_handle());
    ln.forward(nullptr, rows, lx.device_handle(), lg.device_handle(), lb.device_handle(), l16.device_handle(), mean.device_handle(),
               rstd.device_handle());
    const std::size_t count = 4099;
    auto gx = to_device(random_vector(count, 35, -4.0f, 4.0f));
    buffer<float, cuda_space> g32(count);
    buffer<trident::bf16, cuda_space> g16(count), g16_odd(count);
    nn::cuda::activation_forward<nn::gelu>(gx.device_handle(), g32.device_handle(), nullptr);
    nn::cuda::activation_forward<nn::gelu>(gx.device_handle(), g16.device_handle(), nullptr);
    nn::cuda::activation_forward<nn::gelu>(gx.device_handle().subspan(1, count - 1), g16_odd.device_handle().subspan(0, count - 1), nullptr);
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    auto same_bits = [](const std::vector<float>& f, const std::vector<trident::bf16>& h, std::size_t from, std::size_t n) {
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i) wrong += h[i].bits() != trident::bf16(f[i + from]).bits();
      return wrong;
    };
    const auto ln32 = trident::to_vector(l32), gelu32 = trident::to_vector(g32);
    CHECK(same_bits(ln32, trident::to_vector(l16), 0, ln32.size()) == 0);
    CHECK(same_bits(gelu32, trident::to_vector(g16), 0, count) == 0);
    CHECK(same_bits(gelu32, trident::to_vector(g16_odd), 1, count - 1) == 0);
  }

  // dy already in bf16 (the cross-entropy's backward writes the head's so): dx and dW the bits of
  // the float dy that rounds to it, with x in float and in bf16; no bias gradient, only
  // gemm_math::bf16.
  {
    buffer<trident::bf16, cuda_space> dy16(dy.size()), x16(x.size());
    nn::cuda::round_to_bf16(d_dy.data(), dy16.data(), dy.size(), nullptr);
    nn::cuda::round_to_bf16(d_x.data(), x16.data(), x.size(), nullptr);
    const trident::device_span<const trident::bf16> cdy16 = dy16.device_handle(), cx16 = x16.device_handle();
    buffer<float, cuda_space> dx16(batch * in), dx32(batch * in);
    for (const bool x_in_bf16 : {false, true}) {
      auto d_dw16 = to_device(std::vector<float>(out * in, 0.0f)), d_dw32 = to_device(std::vector<float>(out * in, 0.0f));
      if (x_in_bf16) {
        fc.backward(blas, nullptr, batch, cx16, d_w.device_handle(), cdy16, dx16.device_handle(), d_dw16.device_handle(), {});
      } else {
        fc.backward(blas, nullptr, batch, d_x.device_handle(), d_w.device_handle(), cdy16, dx16.device_handle(),
                    d_dw16.device_handle(), {});
      }
      fc.backward(blas, nullptr, batch, d_x.device_handle(), d_w.device_handle(), d_dy.device_handle(), dx32.device_handle(),
                  d_dw32.device_handle(), {});
      TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
      INFO("backward on bf16 dy, x in ", std::string(x_in_bf16 ? "bf16" : "float"));
      CHECK(trident::to_vector(dx16) == trident::to_vector(dx32));
      CHECK(trident::to_vector(d_dw16) == trident::to_vector(d_dw32));
    }
    // Through the split parts too (what the tensor-parallel column layer runs): the copies hold dy itself.
    const auto r = fc.round_for_backward(blas, nullptr, batch, d_x.device_handle(), d_w.device_handle(), cdy16);
    CHECK(r.dy == dy16.data());
    CHECK_THROWS_WITH_AS(fc.backward(blas, nullptr, batch, d_x.device_handle(), d_w.device_handle(), cdy16, dx16.device_handle(),
                                     d_dw.device_handle(), d_db.device_handle()),
                         doctest::Contains("dy in bf16 takes no bias gradient"), trident::usage_error);
    nn::cublas_handle tf32;
    tf32.set_math(nn::gemm_math::tf32);
    CHECK_THROWS_WITH_AS(fc.backward(tf32, nullptr, batch, d_x.device_handle(), d_w.device_handle(), cdy16, dx16.device_handle(),
                                     d_dw.device_handle(), {}),
                         doctest::Contains("dy in bf16 needs gemm_math::bf16"), trident::usage_error);
  }

  // Empty shapes as the float path takes them: no output features (dx = 0, an empty sum), no rows.
  {
    const nn::cuda::linear none{.in_features = 8, .out_features = 0};
    auto d_x0 = to_device(random_vector(3 * 8, 31));
    auto d_dx0 = nans(3 * 8);
    buffer<float, cuda_space> empty_w(0), empty_dy(0), empty_dw(0), empty_db(0);
    none.backward(blas, nullptr, 3, d_x0.device_handle(), empty_w.device_handle(), empty_dy.device_handle(), d_dx0.device_handle(),
                  empty_dw.device_handle(), empty_db.device_handle());
    buffer<float, cuda_space> no_x(0), no_dx(0);
    fc.backward(blas, nullptr, 0, no_x.device_handle(), d_w.device_handle(), empty_dy.device_handle(), no_dx.device_handle(),
                d_dw.device_handle(), d_db.device_handle());
    TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(trident::to_vector(d_dx0) == std::vector<float>(3 * 8, 0.0f));
    check_close(trident::to_vector(d_dw), dw, 1e-4, 1e-5, "dW unchanged by no rows");
  }
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
  check_close(trident::to_vector(d_db), db, 2e-5, 1e-5, "db");  // a double tree against the host's float row order

  // The bias in cuBLASLt's epilogue (a cublas_handle) and as a second pass (a raw handle, no
  // cuBLASLt): the same y to float rounding (cuBLASLt's kernel sums in its own order: 2.6e-6
  // apart here on an H200); in TF32 math as well.
  CHECK(nn::cuda::gemm_bias(blas, stream, batch, out, in, d_x.data(), d_w.data(), d_b.data(), d_y.data()));
  CHECK_FALSE(nn::cuda::gemm_bias(nn::blas_ref{blas.get()}, stream, batch, out, in, d_x.data(), d_w.data(), d_b.data(), d_y.data()));
  buffer<float, cuda_space> d_y2(batch * out);
  fc.forward(nn::blas_ref{blas.get()}, stream, batch, d_x.device_handle(), d_w.device_handle(), d_b.device_handle(), d_y2.device_handle());
  TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream));
  check_close(trident::to_vector(d_y2), trident::to_vector(d_y), 2e-5, 1e-5, "y with the bias as a second pass");
  for (const auto math : {nn::gemm_math::fp32, nn::gemm_math::tf32}) {
    nn::cublas_handle h;
    h.set_math(math);
    fc.forward(h, stream, batch, d_x.device_handle(), d_w.device_handle(), d_b.device_handle(), d_y.device_handle());
    fc.forward(nn::blas_ref{h.get(), math}, stream, batch, d_x.device_handle(), d_w.device_handle(), d_b.device_handle(),
               d_y2.device_handle());
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream));
    check_close(trident::to_vector(d_y2), trident::to_vector(d_y), math == nn::gemm_math::tf32 ? 1e-2 : 2e-5, 1e-5, nn::name(math));
    check_close(trident::to_vector(d_y), y, math == nn::gemm_math::tf32 ? 1e-2 : 2e-5, 1e-5, "y against the host");
  }

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

  // 10007 elements ran as 2501 float4s and a tail of 3; views one float in are not 16-byte
  // aligned and take the scalar kernels: the same bits as the aligned run's elements.
  const auto y_quads = trident::to_vector(d_y), dx_quads = trident::to_vector(d_dx);
  const std::size_t n = x.size() - 1;
  buffer<float, cuda_space> d_y1(x.size()), d_dx1(x.size());
  nn::cuda::activation_forward<nn::gelu>(d_x.device_handle().subspan(1, n), d_y1.device_handle().subspan(1, n));
  nn::cuda::activation_backward<nn::gelu>(d_x.device_handle().subspan(1, n), d_dy.device_handle().subspan(1, n),
                                          d_dx1.device_handle().subspan(1, n));
  const auto y1 = trident::to_vector(d_y1), dx1 = trident::to_vector(d_dx1);
  CHECK(std::equal(y1.begin() + 1, y1.end(), y_quads.begin() + 1));
  CHECK(std::equal(dx1.begin() + 1, dx1.end(), dx_quads.begin() + 1));
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

TEST_CASE("cuda::layer_norm matches nn::layer_norm, accumulating dgamma and dbeta like the host") {
  // hidden: fewer and more columns than a warp's lanes, and GPT-2's; rows: more than a column
  // tile's 128 rows of threads, and with a scratch one chunk of 256 rows or three (the last short).
  for (const auto& [hidden, rows] : {std::pair<std::size_t, std::size_t>{7, 150}, {300, 150}, {768, 600}, {33, 600}}) {
    const nn::layer_norm host{hidden, 1e-5f};
    const nn::cuda::layer_norm dev{hidden, 1e-5f};
    auto x = random_vector(rows * hidden, 41, -2.0f, 2.0f);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += static_cast<float>(i % 5);  // a mean away from 0
    auto gamma = random_vector(hidden, 42, 0.5f, 1.5f), beta = random_vector(hidden, 43);
    const auto dy = random_vector(rows * hidden, 44);
    std::vector<float> y(x.size()), mean(rows), rstd(rows), dx(x.size());
    auto dgamma = random_vector(hidden, 45), dbeta = random_vector(hidden, 46);  // accumulated into
    auto d_x = to_device(x), d_gamma = to_device(gamma), d_beta = to_device(beta), d_dy = to_device(dy);
    auto d_dgamma = to_device(dgamma), d_dbeta = to_device(dbeta), s_dgamma = to_device(dgamma), s_dbeta = to_device(dbeta);
    buffer<float, cuda_space> d_y(x.size()), d_mean(rows), d_rstd(rows), d_dx(x.size()), s_dx(x.size());
    buffer<double, cuda_space> scratch(dev.backward_scratch_size(rows));
    CHECK(scratch.size() == 2 * ((rows + 255) / 256) * hidden);
    host.forward(rows, x, gamma, beta, y, mean, rstd);
    host.backward(rows, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
    dev.forward(0, rows, d_x.device_handle(), d_gamma.device_handle(), d_beta.device_handle(), d_y.device_handle(),
                d_mean.device_handle(), d_rstd.device_handle());
    dev.backward(0, rows, d_x.device_handle(), d_gamma.device_handle(), d_mean.device_handle(), d_rstd.device_handle(),
                 d_dy.device_handle(), d_dx.device_handle(), d_dgamma.device_handle(), d_dbeta.device_handle());
    dev.backward(0, rows, d_x.device_handle(), d_gamma.device_handle(), d_mean.device_handle(), d_rstd.device_handle(),
                 d_dy.device_handle(), s_dx.device_handle(), s_dgamma.device_handle(), s_dbeta.device_handle(),
                 scratch.device_handle());
    const std::string at = " (hidden " + std::to_string(hidden) + ", rows " + std::to_string(rows) + ")";
    // The host sums the parameter gradients over the rows in float (the GPU in double): its
    // rounding grows with the partial sums, about sqrt(rows) in size, whatever the total.
    const double sums_atol = std::max(1e-5, 2e-7 * static_cast<double>(rows));
    check_close(trident::to_vector(d_mean), mean, 1e-6, 1e-6, "mean" + at);
    check_close(trident::to_vector(d_rstd), rstd, 0, 1e-6, "rstd" + at);
    check_close(trident::to_vector(d_y), y, 1e-5, 1e-5, "y" + at);
    check_close(trident::to_vector(d_dx), dx, 1e-5, 1e-5, "dx" + at);
    check_close(trident::to_vector(d_dgamma), dgamma, sums_atol, 1e-5, "dgamma" + at);
    check_close(trident::to_vector(d_dbeta), dbeta, sums_atol, 1e-5, "dbeta" + at);
    // With the scratch: the parameter sums chunked (another order).
    check_close(trident::to_vector(s_dgamma), dgamma, sums_atol, 1e-5, "dgamma with a scratch" + at);
    check_close(trident::to_vector(s_dbeta), dbeta, sums_atol, 1e-5, "dbeta with a scratch" + at);
    // and close to the path without one: both sum in double, so they part at the float rounding
    check_close(trident::to_vector(s_dgamma), trident::to_vector(d_dgamma), 1e-6, 1e-6, "dgamma, scratch vs none" + at);
    check_close(trident::to_vector(s_dbeta), trident::to_vector(d_dbeta), 1e-6, 1e-6, "dbeta, scratch vs none" + at);
    // With a residual, dx = residual + the input gradient (float addition, as add_to): into
    // another buffer, and into the residual's own (it may be dx).
    {
      const auto residual = random_vector(x.size(), 47);
      auto d_residual = to_device(residual), in_place = to_device(residual);
      auto r_dgamma = to_device(dgamma), r_dbeta = to_device(dbeta);
      buffer<float, cuda_space> r_dx(x.size());
      dev.backward(0, rows, d_x.device_handle(), d_gamma.device_handle(), d_mean.device_handle(), d_rstd.device_handle(),
                   d_dy.device_handle(), r_dx.device_handle(), r_dgamma.device_handle(), r_dbeta.device_handle(), {},
                   d_residual.device_handle());
      dev.backward(0, rows, d_x.device_handle(), d_gamma.device_handle(), d_mean.device_handle(), d_rstd.device_handle(),
                   d_dy.device_handle(), in_place.device_handle(), r_dgamma.device_handle(), r_dbeta.device_handle(),
                   scratch.device_handle(), in_place.device_handle());
      auto want = trident::to_vector(d_dx);
      for (std::size_t i = 0; i < want.size(); ++i) want[i] = residual[i] + want[i];
      const bool added = trident::to_vector(r_dx) == want, added_in_place = trident::to_vector(in_place) == want;
      INFO("dx with a residual", at);
      CHECK(added);
      CHECK(added_in_place);
    }
    if (rows > 256) {  // a scratch one double short is refused by name
      buffer<double, cuda_space> small(scratch.size() - 1);
      CHECK_THROWS_WITH_AS(dev.backward(0, rows, d_x.device_handle(), d_gamma.device_handle(), d_mean.device_handle(),
                                        d_rstd.device_handle(), d_dy.device_handle(), s_dx.device_handle(),
                                        s_dgamma.device_handle(), s_dbeta.device_handle(), small.device_handle()),
                           doctest::Contains("expected at least backward_scratch_size"), trident::usage_error);
    }
  }
  // Shapes are checked on the host, before anything is launched.
  const nn::cuda::layer_norm ln{8};
  buffer<float, cuda_space> a(16), g(7), s(2);
  CHECK_THROWS_WITH_AS(ln.forward(0, 2, a.device_handle(), g.device_handle(), {}, a.device_handle(), s.device_handle(),
                                  s.device_handle()),
                       doctest::Contains("gamma has 7 elements, expected [hidden=8]"), trident::usage_error);
}

TEST_CASE("cuda::rms_norm matches nn::rms_norm, accumulating dgamma like the host") {
  for (const auto& [hidden, rows] : {std::pair<std::size_t, std::size_t>{7, 150}, {300, 150}, {768, 600}, {33, 600}}) {
    const nn::rms_norm host{hidden, 1e-6f};
    const nn::cuda::rms_norm dev{hidden, 1e-6f};
    const auto x = random_vector(rows * hidden, 71, -2.0f, 2.0f), gamma = random_vector(hidden, 72, 0.5f, 1.5f);
    const auto dy = random_vector(rows * hidden, 73);
    std::vector<float> y(x.size()), rrms(rows), dx(x.size());
    auto dgamma = random_vector(hidden, 74);
    auto d_x = to_device(x), d_gamma = to_device(gamma), d_dy = to_device(dy), d_dgamma = to_device(dgamma);
    auto s_dgamma = to_device(dgamma);
    buffer<float, cuda_space> d_y(x.size()), d_rrms(rows), d_dx(x.size()), s_dx(x.size());
    buffer<double, cuda_space> scratch(dev.backward_scratch_size(rows));
    host.forward(rows, x, gamma, y, rrms);
    host.backward(rows, x, gamma, rrms, dy, dx, dgamma);
    dev.forward(0, rows, d_x.device_handle(), d_gamma.device_handle(), d_y.device_handle(), d_rrms.device_handle());
    dev.backward(0, rows, d_x.device_handle(), d_gamma.device_handle(), d_rrms.device_handle(), d_dy.device_handle(),
                 d_dx.device_handle(), d_dgamma.device_handle());
    dev.backward(0, rows, d_x.device_handle(), d_gamma.device_handle(), d_rrms.device_handle(), d_dy.device_handle(),
                 s_dx.device_handle(), s_dgamma.device_handle(), scratch.device_handle());
    const std::string at = " (hidden " + std::to_string(hidden) + ", rows " + std::to_string(rows) + ")";
    // The host sums the parameter gradients over the rows in float (the GPU in double): its
    // rounding grows with the partial sums, about sqrt(rows) in size, whatever the total.
    const double sums_atol = std::max(1e-5, 2e-7 * static_cast<double>(rows));
    check_close(trident::to_vector(d_rrms), rrms, 0, 1e-6, "rrms" + at);
    check_close(trident::to_vector(d_y), y, 1e-5, 1e-5, "y" + at);
    check_close(trident::to_vector(d_dx), dx, 1e-5, 1e-5, "dx" + at);
    check_close(trident::to_vector(d_dgamma), dgamma, sums_atol, 1e-5, "dgamma" + at);
    check_close(trident::to_vector(s_dgamma), dgamma, sums_atol, 1e-5, "dgamma with a scratch" + at);
    check_close(trident::to_vector(s_dgamma), trident::to_vector(d_dgamma), 1e-6, 1e-6, "dgamma, scratch vs none" + at);
    {  // a residual (here dx's own buffer): dx = residual + the input gradient
      const auto residual = random_vector(x.size(), 75);
      auto in_place = to_device(residual), r_dgamma = to_device(dgamma);
      dev.backward(0, rows, d_x.device_handle(), d_gamma.device_handle(), d_rrms.device_handle(), d_dy.device_handle(),
                   in_place.device_handle(), r_dgamma.device_handle(), {}, in_place.device_handle());
      auto want = trident::to_vector(d_dx);
      for (std::size_t i = 0; i < want.size(); ++i) want[i] = residual[i] + want[i];
      const bool added = trident::to_vector(in_place) == want;
      INFO("dx with a residual", at);
      CHECK(added);
    }
  }
}

TEST_CASE("cuda::causal_attention matches nn::causal_attention; probabilities() is forward's softmax bit for bit") {
  // seq 70: more rows than the host's row blocks (64).
  const nn::causal_attention host{.seq = 70, .batch = 2, .heads = 3, .head_dim = 8};
  const nn::cuda::causal_attention dev{.seq = 70, .batch = 2, .heads = 3, .head_dim = 8};
  REQUIRE(dev.probs_size() == host.probs_size());
  const auto qkv = random_vector(host.qkv_size(), 51, -1.5f, 1.5f), dout = random_vector(host.out_size(), 52);
  std::vector<float> out(host.out_size()), probs(host.probs_size()), dqkv(host.qkv_size());
  host.forward(qkv, out, probs);
  host.backward(qkv, probs, dout, dqkv);

  trident::nn::cublas_handle blas;
  auto d_qkv = to_device(qkv), d_dout = to_device(dout);
  buffer<float, cuda_space> d_out(out.size()), d_probs(probs.size()), d_again(probs.size()), d_dqkv(qkv.size()),
      d_ds(probs.size());
  dev.forward(blas, 0, d_qkv.device_handle(), d_out.device_handle(), d_probs.device_handle());
  dev.probabilities(blas, 0, d_qkv.device_handle(), d_again.device_handle());
  dev.backward(blas, 0, d_qkv.device_handle(), d_probs.device_handle(), d_dout.device_handle(), d_dqkv.device_handle(),
               d_ds.device_handle());
  const auto got_probs = trident::to_vector(d_probs);
  check_close(got_probs, probs, 1e-6, 1e-5, "probs");
  CHECK(trident::to_vector(d_again) == got_probs);
  bool masked = true;  // zeros above the diagonal, exactly, in every (batch, head)
  for (std::size_t bh = 0; bh < 6; ++bh)
    for (std::size_t i = 0; i < 70; ++i)
      for (std::size_t j = i + 1; j < 70; ++j) masked = masked && got_probs[(bh * 70 + i) * 70 + j] == 0.0f;
  CHECK(masked);
  check_close(trident::to_vector(d_out), out, 1e-5, 1e-5, "out");
  check_close(trident::to_vector(d_dqkv), dqkv, 1e-5, 1e-5, "dqkv");

  buffer<float, cuda_space> small(10);
  CHECK_THROWS_WITH_AS(dev.backward(blas, 0, d_qkv.device_handle(), d_probs.device_handle(), d_dout.device_handle(),
                                    d_dqkv.device_handle(), small.device_handle()),
                       doctest::Contains("the scratch ds has 10 elements"), trident::usage_error);
}

TEST_CASE("cuda::flash_attention: the host emulation of its tiles (TF32 operands), and causal_attention to TF32's rounding") {
  int major = 0;
  TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 8) {
    MESSAGE("compute capability ", major, ".x: no TF32 tensor cores; flash_attention refuses it (checked below)");
  }
  for (const auto c : attention_cases) {
    INFO("seq ", c.seq, " batch ", c.batch, " heads ", c.heads, " head_dim ", c.head_dim);
    const nn::causal_attention host{.seq = c.seq, .batch = c.batch, .heads = c.heads, .head_dim = c.head_dim};
    const nn::cuda::flash_attention dev{.seq = c.seq, .batch = c.batch, .heads = c.heads, .head_dim = c.head_dim};
    const auto qkv = random_vector(host.qkv_size(), 61, -2.0f, 2.0f), dout = random_vector(host.out_size(), 62);
    // The exact attention, and the tiles emulated with TF32 operands.
    std::vector<float> out(host.out_size()), probs(host.probs_size()), dqkv(host.qkv_size());
    host.forward(qkv, out, probs);
    host.backward(qkv, probs, dout, dqkv);
    std::vector<float> e_out(host.out_size()), e_lse(dev.lse_size()), e_delta(dev.lse_size()), e_dqkv(host.qkv_size());
    nn::flash::emulate_forward(host, qkv, e_out, e_lse, true);
    nn::flash::emulate_backward(host, qkv, e_out, e_lse, dout, e_delta, e_dqkv, true);
    if (major < 8) {
      buffer<float, cuda_space> q1(host.qkv_size()), o1(host.out_size()), l1(dev.lse_size());
      CHECK_THROWS_WITH_AS(dev.forward(0, q1.device_handle(), o1.device_handle(), l1.device_handle()),
                           doctest::Contains("needs TF32 tensor cores"), trident::usage_error);
      return;
    }
    auto d_qkv = to_device(qkv), d_dout = to_device(dout);
    auto d_out = nans(host.out_size()), d_lse = nans(dev.lse_size()), d_dqkv = nans(host.qkv_size());
    buffer<float, cuda_space> d_delta(dev.lse_size());
    dev.forward(0, d_qkv.device_handle(), d_out.device_handle(), d_lse.device_handle());
    dev.backward(0, d_qkv.device_handle(), d_out.device_handle(), d_lse.device_handle(), d_dout.device_handle(),
                 d_delta.device_handle(), d_dqkv.device_handle());
    const auto g_out = trident::to_vector(d_out), g_lse = trident::to_vector(d_lse), g_dqkv = trident::to_vector(d_dqkv);
    MESSAGE("flash seq ", c.seq, " head_dim ", c.head_dim, ": out from the emulation ", normwise(g_out, e_out), ", from exact ",
            normwise(g_out, out), "; dqkv from the emulation ", normwise(g_dqkv, e_dqkv), ", from exact ", normwise(g_dqkv, dqkv));
    // The GPU's tiles are the emulated ones: only the tensor cores' summation order and exp's
    // last bits differ. A layout or indexing mistake would be O(1).
    CHECK(normwise(g_out, e_out) <= 2e-4);
    CHECK(normwise(g_lse, e_lse) <= 2e-4);
    CHECK(normwise(g_dqkv, e_dqkv) <= 5e-4);
    // Against the exact attention: TF32's rounding and no more.
    CHECK(normwise(g_out, out) <= 5e-3);
    CHECK(normwise(g_dqkv, dqkv) <= 1e-2);
    // Deterministic: no atomics.
    buffer<float, cuda_space> again(host.qkv_size());
    dev.backward(0, d_qkv.device_handle(), d_out.device_handle(), d_lse.device_handle(), d_dout.device_handle(),
                 d_delta.device_handle(), again.device_handle());
    CHECK(trident::to_vector(again) == g_dqkv);
  }
  const nn::cuda::flash_attention odd{.seq = 8, .batch = 1, .heads = 1, .head_dim = 48};
  buffer<float, cuda_space> q(8 * 3 * 48), o(8 * 48), l(8), small(3);
  CHECK_THROWS_WITH_AS(odd.forward(0, q.device_handle(), o.device_handle(), l.device_handle()),
                       doctest::Contains("head_dim 48 is not supported"), trident::usage_error);
  const nn::cuda::flash_attention fa{.seq = 8, .batch = 1, .heads = 1, .head_dim = 32};
  buffer<float, cuda_space> q32(8 * 3 * 32), o32(8 * 32);
  CHECK_THROWS_WITH_AS(fa.forward(0, q32.device_handle(), o32.device_handle(), small.device_handle()),
                       doctest::Contains("lse has 3 elements, expected [batch=1, heads=1, seq=8] = 8"), trident::usage_error);
}

TEST_CASE("cuda::flash_attention_bf16: the host emulation of its warps (bf16 fragments), and the exact attention to bf16's rounding, both directions") {
  int major = 0;
  TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  for (const auto c : attention_cases) {
    INFO("seq ", c.seq, " batch ", c.batch, " heads ", c.heads, " head_dim ", c.head_dim);
    const nn::causal_attention host{.seq = c.seq, .batch = c.batch, .heads = c.heads, .head_dim = c.head_dim};
    const nn::cuda::flash_attention_bf16 dev{.seq = c.seq, .batch = c.batch, .heads = c.heads, .head_dim = c.head_dim};
    const auto qkv = random_vector(host.qkv_size(), 63, -2.0f, 2.0f), dout = random_vector(host.out_size(), 64);
    std::vector<float> out(host.out_size()), probs(host.probs_size()), dqkv(host.qkv_size());
    host.forward(qkv, out, probs);
    host.backward(qkv, probs, dout, dqkv);
    std::vector<float> e_out(host.out_size()), e_lse(dev.lse_size()), e_delta(dev.lse_size()), e_dqkv(host.qkv_size());
    nn::flash_bf16::emulate_forward(host, qkv, e_out, e_lse);
    auto d_qkv = to_device(qkv), d_dout = to_device(dout);
    auto d_out = nans(host.out_size()), d_lse = nans(dev.lse_size()), d_dqkv = nans(host.qkv_size());
    buffer<float, cuda_space> d_delta(dev.lse_size());
    if (major < 8) {
      CHECK_THROWS_WITH_AS(dev.forward(0, d_qkv.device_handle(), d_out.device_handle(), d_lse.device_handle()),
                           doctest::Contains("needs bf16 tensor cores"), trident::usage_error);
      return;
    }
    dev.forward(0, d_qkv.device_handle(), d_out.device_handle(), d_lse.device_handle());
    const auto g_out = trident::to_vector(d_out), g_lse = trident::to_vector(d_lse);
    MESSAGE("flash bf16 seq ", c.seq, " head_dim ", c.head_dim, ": out from the emulation ", normwise(g_out, e_out),
            ", from exact ", normwise(g_out, out), "; lse from the emulation ", normwise(g_lse, e_lse));
    // The GPU's warps are the emulated ones: the tensor cores' summation order and exp's last
    // bits differ, and through them now and then a P rounded to the neighbouring bf16 value
    // (2^-8 of one term). A fragment in the wrong lane or register would be O(1).
    CHECK(normwise(g_out, e_out) <= 2e-3);
    CHECK(normwise(g_lse, e_lse) <= 1e-4);
    // Against the exact attention of the float inputs: bf16's rounding of q, k, v and P.
    CHECK(normwise(g_out, out) <= 3e-2);

    // Backward from the GPU's own out and lse, against the emulation from the same ones.
    nn::flash_bf16::emulate_backward(host, qkv, g_out, g_lse, dout, e_delta, e_dqkv);
    dev.backward(0, d_qkv.device_handle(), d_out.device_handle(), d_lse.device_handle(), d_dout.device_handle(),
                 d_delta.device_handle(), d_dqkv.device_handle());
    const auto g_dqkv = trident::to_vector(d_dqkv);
    MESSAGE("flash bf16 seq ", c.seq, " head_dim ", c.head_dim, ": dqkv from the emulation ", normwise(g_dqkv, e_dqkv),
            ", from exact ", normwise(g_dqkv, dqkv));
    CHECK(normwise(g_dqkv, e_dqkv) <= 4e-3);
    CHECK(normwise(g_dqkv, dqkv) <= 5e-2);
    buffer<float, cuda_space> again(host.qkv_size());  // deterministic: no atomics
    dev.backward(0, d_qkv.device_handle(), d_out.device_handle(), d_lse.device_handle(), d_dout.device_handle(),
                 d_delta.device_handle(), again.device_handle());
    CHECK(trident::to_vector(again) == g_dqkv);
  }
}

TEST_CASE("cuda::add_to is the host's float addition") {
  const auto x = random_vector(5003, 61), y0 = random_vector(5003, 62);
  auto d_x = to_device(x), d_y = to_device(y0);
  nn::cuda::add_to(d_x.device_handle(), d_y.device_handle());  // float4s and a tail of 3
  std::vector<float> y = y0;
  for (std::size_t i = 0; i < y.size(); ++i) y[i] += x[i];
  CHECK(trident::to_vector(d_y) == y);
  nn::cuda::add_to(d_x.device_handle().subspan(1, x.size() - 1), d_y.device_handle().subspan(1, x.size() - 1));  // unaligned
  for (std::size_t i = 1; i < y.size(); ++i) y[i] += x[i];
  CHECK(trident::to_vector(d_y) == y);
}
