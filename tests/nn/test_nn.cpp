// The host reference layers against double-precision references written here (naive loops,
// PyTorch's formulas), against central finite differences of the library's own forward, and for
// the properties trainers rely on: gradient accumulation across micro-batches, dx overwritten,
// shape errors that name the expected shape, and results independent of threads and repetition.
// Built twice: with trident's own GEMM (nn.host) and, where OpenBLAS is found, with
// TRIDENT_HAS_CBLAS=1 (nn.host_cblas).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/random.hpp"
#include "trident/core/error.hpp"
#include "trident/nn/activation.hpp"
#include "trident/nn/attention.hpp"
#include "trident/nn/flash_attention.hpp"
#include "trident/nn/flash_bf16.hpp"
#include "trident/nn/gemm.hpp"
#include "trident/optim/host_simd.hpp"
#include "trident/nn/linear.hpp"
#include "trident/nn/norm.hpp"
#include "trident/nn/loss.hpp"

namespace nn = trident::nn;
using nn::op;

namespace {

using test_support::random_vector;

// |got - want| <= atol + rtol |want|, reporting the worst element.
void check_close(std::span<const float> got, std::span<const double> want, double atol, double rtol,
                 const std::string& what) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  std::size_t where = 0;
  bool ok = true;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double excess = err - (atol + rtol * std::abs(want[i]));
    if (!(excess <= 0)) ok = false;  // NaN fails too
    if (!(err <= worst)) {
      worst = err;
      where = i;
    }
  }
  INFO(what, ": worst error ", worst, " at ", where, " (got ", got.empty() ? 0.0 : got[where], ", want ",
       want.empty() ? 0.0 : want[where], ")");
  CHECK(ok);
}

std::vector<double> as_double(std::span<const float> v) { return {v.begin(), v.end()}; }

// ---- double-precision references ---------------------------------------------------------------

// Row-major C = alpha op(A) op(B) + beta C in double, with element accessors from the op flags.
std::vector<double> naive_gemm(op op_a, op op_b, std::size_t m, std::size_t n, std::size_t k, double alpha,
                               const std::vector<float>& a, std::size_t lda, const std::vector<float>& b,
                               std::size_t ldb, double beta, const std::vector<float>& c, std::size_t ldc) {
  std::vector<double> out(c.begin(), c.end());
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double acc = 0;
      for (std::size_t p = 0; p < k; ++p) {
        const double av = op_a == op::n ? a[i * lda + p] : a[p * lda + i];
        const double bv = op_b == op::n ? b[p * ldb + j] : b[j * ldb + p];
        acc += av * bv;
      }
      out[i * ldc + j] = alpha * acc + (beta == 0 ? 0.0 : beta * c[i * ldc + j]);
    }
  return out;
}

struct linear_ref {
  std::size_t batch, in, out;
  std::vector<double> forward(const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>& b) const {
    std::vector<double> y(batch * out);
    for (std::size_t r = 0; r < batch; ++r)
      for (std::size_t o = 0; o < out; ++o) {
        double acc = b.empty() ? 0.0 : b[o];
        for (std::size_t i = 0; i < in; ++i) acc += static_cast<double>(x[r * in + i]) * w[o * in + i];
        y[r * out + o] = acc;
      }
    return y;
  }
  // dx[r, i] = sum_o dy[r, o] W[o, i];  dW[o, i] = sum_r dy[r, o] x[r, i];  db[o] = sum_r dy[r, o]
  void backward(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& dy,
                std::vector<double>& dx, std::vector<double>& dw, std::vector<double>& db) const {
    dx.assign(batch * in, 0.0);
    dw.assign(out * in, 0.0);
    db.assign(out, 0.0);
    for (std::size_t r = 0; r < batch; ++r)
      for (std::size_t o = 0; o < out; ++o) {
        const double g = dy[r * out + o];
        db[o] += g;
        for (std::size_t i = 0; i < in; ++i) {
          dx[r * in + i] += g * w[o * in + i];
          dw[o * in + i] += g * x[r * in + i];
        }
      }
  }
};

double gelu_ref(double x) {
  const double pi = 3.14159265358979323846;
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}
// d/dx of gelu_ref, differentiated by hand independently of ATen's arrangement.
double gelu_grad_ref(double x) {
  const double pi = 3.14159265358979323846;
  const double c = std::sqrt(2.0 / pi);
  const double u = c * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

// Central differences of f at v (perturbing v in place), in double.
std::vector<double> central_differences(std::vector<float>& v, float h, const std::function<double()>& f) {
  std::vector<double> grad(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float saved = v[i];
    v[i] = saved + h;
    const double plus = f();
    v[i] = saved - h;
    const double minus = f();
    v[i] = saved;
    // The step actually taken, after float rounding of saved +- h.
    const double step = static_cast<double>(saved + h) - static_cast<double>(saved - h);
    grad[i] = (plus - minus) / step;
  }
  return grad;
}

double dot(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

template <class Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const trident::usage_error& e) {
    return e.message();
  }
  return "(no usage_error)";
}

}  // namespace

// ---- gemm ----------------------------------------------------------------------------------------

TEST_CASE("gemm matches a naive triple loop for every op pair, odd sizes and block edges") {
  struct shape {
    std::size_t m, n, k;
  };
  const shape shapes[] = {{1, 1, 1}, {7, 13, 5}, {64, 33, 17}, {3, 1, 9}, {1, 17, 4}, {5, 8, 0},
                          {65, 9, 257}, {70, 515, 300}};
  std::uint32_t seed = 1;
  for (const auto [m, n, k] : shapes)
    for (const op op_a : {op::n, op::t})
      for (const op op_b : {op::n, op::t})
        for (const float beta : {0.0f, 1.0f, -0.5f}) {
          // Leading dimensions wider than the rows: the operands are windows of larger matrices.
          const std::size_t a_rows = op_a == op::n ? m : k, a_cols = op_a == op::n ? k : m;
          const std::size_t b_rows = op_b == op::n ? k : n, b_cols = op_b == op::n ? n : k;
          const std::size_t lda = a_cols + 3, ldb = b_cols + 1, ldc = n + 2;
          const auto a = random_vector(std::max<std::size_t>(a_rows * lda, 1), seed++);
          const auto b = random_vector(std::max<std::size_t>(b_rows * ldb, 1), seed++);
          auto c = random_vector(m * ldc, seed++);
          if (beta == 0.0f)  // beta == 0 must not read C: NaN there must not leak through
            for (std::size_t i = 0; i < m; ++i)
              for (std::size_t j = 0; j < n; ++j) c[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
          const float alpha = 0.75f;
          auto want = naive_gemm(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
          nn::gemm(op_a, op_b, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
          // Padding columns between rows are untouched.
          bool padding_kept = true;
          for (std::size_t i = 0; i < m; ++i)
            for (std::size_t j = n; j < ldc; ++j) padding_kept = padding_kept && c[i * ldc + j] == want[i * ldc + j];
          INFO("m=", m, " n=", n, " k=", k, " op_a=", op_a == op::n ? "n" : "t", " op_b=", op_b == op::n ? "n" : "t",
               " beta=", beta);
          CHECK(padding_kept);
          // Each product is below 1 in magnitude: k ulps of the largest partial sum bound the error.
          check_close(c, want, 4e-7 * static_cast<double>(k + 2), 1e-6, "gemm");
        }
}

TEST_CASE("gemm is deterministic: the same bits on every call and on every thread") {
  const std::size_t m = 67, n = 130, k = 300;
  const auto a = random_vector(m * k, 11), b = random_vector(k * n, 12);
  std::vector<float> first(m * n);
  nn::gemm(op::n, op::n, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, first.data(), n);
  std::vector<std::vector<float>> results(4, std::vector<float>(m * n));
  std::vector<std::thread> threads;
  for (auto& r : results)
    threads.emplace_back([&] {
      for (int rep = 0; rep < 3; ++rep) nn::gemm(op::n, op::n, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, r.data(), n);
    });
  for (auto& t : threads) t.join();
  for (const auto& r : results) CHECK(r == first);
}

TEST_CASE("gemm: the AVX2 and AVX-512 paths give the portable path's bits (every op pair, odd sizes, block edges)") {
  namespace simd = trident::optim::detail;
  struct shape {
    std::size_t m, n, k;
  };
  const shape shapes[] = {{1, 1, 1}, {7, 13, 5}, {65, 33, 17}, {3, 17, 9}, {70, 515, 300}, {9, 1030, 40}};
  std::uint32_t seed = 100;
  int compared = 0;
  for (const auto [m, n, k] : shapes)
    for (const op op_a : {op::n, op::t})
      for (const op op_b : {op::n, op::t})
        for (const float beta : {0.0f, -0.5f}) {
          const std::size_t lda = (op_a == op::n ? k : m) + 1, ldb = (op_b == op::n ? n : k) + 2, ldc = n + 1;
          const auto a = random_vector((op_a == op::n ? m : k) * lda, seed++);
          const auto b = random_vector((op_b == op::n ? k : n) * ldb, seed++);
          const auto c0 = random_vector(m * ldc, seed++);
          auto run = [&](simd::host_isa isa) {
            REQUIRE(simd::force_host_isa(isa));
            auto c = c0;
            nn::gemm(op_a, op_b, m, n, k, 0.75f, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
            simd::unforce_host_isa();
            return c;
          };
          const auto portable = run(simd::host_isa::portable);
          for (const auto isa : {simd::host_isa::avx2, simd::host_isa::avx512}) {
            if (static_cast<int>(isa) > static_cast<int>(simd::detected_host_isa())) continue;  // this CPU lacks it
            INFO("isa ", static_cast<int>(isa), " m=", m, " n=", n, " k=", k, " beta=", beta);
            CHECK(run(isa) == portable);
            ++compared;
          }
        }
  MESSAGE("wide paths compared with the portable one: ", compared, " (0: this CPU has neither AVX2 nor AVX-512)");
}

// ---- linear --------------------------------------------------------------------------------------

TEST_CASE("linear forward matches y = x W^T + b in double, with and without bias") {
  struct shape {
    std::size_t batch, in, out;
  };
  for (const auto [batch, in, out] : {shape{1, 1, 1}, shape{7, 13, 5}, shape{64, 33, 17}, shape{3, 300, 2}}) {
    const nn::linear fc{.in_features = in, .out_features = out};
    CHECK(fc.weight_size() == in * out);
    CHECK(fc.bias_size() == out);
    const auto x = random_vector(batch * in, 1), w = random_vector(out * in, 2), b = random_vector(out, 3);
    std::vector<float> y(batch * out);
    const linear_ref ref{batch, in, out};
    INFO("batch=", batch, " in=", in, " out=", out);

    fc.forward(batch, x, w, b, y);
    check_close(y, ref.forward(x, w, b), 1e-6 * static_cast<double>(in + 1), 1e-6, "y");

    fc.forward(batch, x, w, {}, y);
    check_close(y, ref.forward(x, w, {}), 1e-6 * static_cast<double>(in + 1), 1e-6, "y without bias");
  }
}

TEST_CASE("linear backward matches the analytic gradients and central differences") {
  const std::size_t batch = 6, in = 9, out = 5;
  const nn::linear fc{.in_features = in, .out_features = out};
  auto x = random_vector(batch * in, 21), w = random_vector(out * in, 22), b = random_vector(out, 23);
  const auto g = random_vector(batch * out, 24);  // dL/dy for L = sum(g * y)

  std::vector<float> dx(batch * in, std::numeric_limits<float>::quiet_NaN());  // overwritten
  std::vector<float> dw(out * in, 0.0f), db(out, 0.0f);
  fc.backward(batch, x, w, g, dx, dw, db);

  const linear_ref ref{batch, in, out};
  std::vector<double> rdx, rdw, rdb;
  ref.backward(x, w, g, rdx, rdw, rdb);
  check_close(dx, rdx, 1e-6, 1e-6, "dx vs analytic");
  check_close(dw, rdw, 1e-6, 1e-6, "dW vs analytic");
  check_close(db, rdb, 1e-6, 1e-6, "db vs analytic");

  // L is linear in each input, so central differences are exact but for the float rounding of y.
  std::vector<float> y(batch * out);
  const auto loss = [&] {
    fc.forward(batch, x, w, b, y);
    return dot(y, g);
  };
  const float h = 1e-2f;
  check_close(dx, central_differences(x, h, loss), 2e-4, 1e-3, "dx vs finite differences");
  check_close(dw, central_differences(w, h, loss), 2e-4, 1e-3, "dW vs finite differences");
  check_close(db, central_differences(b, h, loss), 2e-4, 1e-3, "db vs finite differences");
}

TEST_CASE("linear backward accumulates dW and db across micro-batches, overwrites dx, may skip dx") {
  const std::size_t batch = 8, half = 4, in = 7, out = 3;
  const nn::linear fc{.in_features = in, .out_features = out};
  const auto x = random_vector(batch * in, 31), w = random_vector(out * in, 32), dy = random_vector(batch * out, 33);
  const auto dw0 = random_vector(out * in, 34), db0 = random_vector(out, 35);  // existing .grad

  // Whole batch at once, on top of existing gradients.
  std::vector<float> dw_full = dw0, db_full = db0, dx_full(batch * in);
  fc.backward(batch, x, w, dy, dx_full, dw_full, db_full);
  {
    const linear_ref ref{batch, in, out};
    std::vector<double> rdx, rdw, rdb;
    ref.backward(x, w, dy, rdx, rdw, rdb);
    for (std::size_t i = 0; i < rdw.size(); ++i) rdw[i] += dw0[i];
    for (std::size_t i = 0; i < rdb.size(); ++i) rdb[i] += db0[i];
    check_close(dw_full, rdw, 1e-6, 1e-6, "dW = dW0 + dy^T x");
    check_close(db_full, rdb, 1e-6, 1e-6, "db = db0 + sum dy");
  }

  // Two micro-batches, each into the same gradients: the sum of both (as autograd's .grad).
  std::vector<float> dw_micro = dw0, db_micro = db0, dx_first(half * in), dx_second(half * in);
  const std::span<const float> xs{x}, dys{dy};
  fc.backward(half, xs.first(half * in), w, dys.first(half * out), dx_first, dw_micro, db_micro);
  fc.backward(half, xs.last(half * in), w, dys.last(half * out), dx_second, dw_micro, db_micro);
  check_close(dw_micro, as_double(dw_full), 1e-6, 1e-6, "micro-batches dW");
  check_close(db_micro, as_double(db_full), 1e-6, 1e-6, "micro-batches db");
  // dx is per micro-batch and not accumulated.
  CHECK(std::equal(dx_first.begin(), dx_first.end(), dx_full.begin()));
  CHECK(std::equal(dx_second.begin(), dx_second.end(), dx_full.begin() + static_cast<std::ptrdiff_t>(half * in)));

  // dx skipped (first layer): dW and db as before.
  std::vector<float> dw_skip = dw0, db_skip = db0;
  fc.backward(batch, x, w, dy, {}, dw_skip, db_skip);
  CHECK(dw_skip == dw_full);
  CHECK(db_skip == db_full);

  // No bias: db empty, dW unchanged in meaning.
  std::vector<float> dw_nobias = dw0;
  fc.backward(batch, x, w, dy, {}, dw_nobias, {});
  CHECK(dw_nobias == dw_full);

  // An empty batch adds nothing.
  std::vector<float> dw_empty = dw0, db_empty = db0;
  fc.backward(0, {}, w, {}, {}, dw_empty, db_empty);
  CHECK(dw_empty == dw0);
  CHECK(db_empty == db0);
}

TEST_CASE("linear rejects wrong sizes, naming the expected shape") {
  const nn::linear fc{.in_features = 4, .out_features = 3};
  std::vector<float> x(2 * 4), w(3 * 4), b(3), y(2 * 3), dx(2 * 4), dw(3 * 4), db(3);
  CHECK_NOTHROW(fc.forward(2, x, w, b, y));
  CHECK_THROWS_AS(fc.forward(3, x, w, b, y), trident::usage_error);
  // An output over an input: the product read what it had overwritten (wrong values, no error).
  std::vector<float> xy(2 * 4, 1.0f);
  CHECK(message_of([&] { fc.forward(2, xy, w, b, std::span<float>(xy).first(6)); }).find("y shares memory with x") !=
        std::string::npos);
  CHECK(message_of([&] { fc.backward(2, x, w, std::span<const float>(xy).first(6), xy, dw, db); }).find("shares memory") !=
        std::string::npos);
  // A batch whose products wrap (2^62 x 4 = 0) with empty arrays: refused, not run on them.
  const std::size_t huge = std::size_t{1} << 62;
  CHECK(message_of([&] { fc.forward(huge, {}, w, b, {}); }).find("[batch=4611686018427387904, in=4, out=3] has more elements") !=
        std::string::npos);
  CHECK(message_of([&] { fc.backward(huge, {}, w, {}, {}, dw, db); }).find("has more elements than std::size_t counts") !=
        std::string::npos);
  CHECK(message_of([&] { fc.forward(3, x, w, b, y); }) ==
        "linear::forward: x has 8 elements, expected [batch=3, in=4] = 12");
  CHECK(message_of([&] { fc.forward(2, x, std::span<const float>{w}.first(11), b, y); }) ==
        "linear::forward: W has 11 elements, expected [out=3, in=4] = 12");
  CHECK(message_of([&] { fc.forward(2, x, w, std::span<const float>{b}.first(2), y); }).find("b has 2 elements") !=
        std::string::npos);
  CHECK(message_of([&] { fc.forward(2, x, w, b, std::span<float>{y}.first(5)); }).find("expected [batch=2, out=3]") !=
        std::string::npos);
  CHECK_NOTHROW(fc.backward(2, x, w, y, dx, dw, db));
  CHECK(message_of([&] { fc.backward(2, x, w, std::span<const float>{y}.first(4), dx, dw, db); }).find("dy has 4") !=
        std::string::npos);
  CHECK(message_of([&] { fc.backward(2, x, w, y, std::span<float>{dx}.first(3), dw, db); }).find("dx has 3") !=
        std::string::npos);
  CHECK(message_of([&] { fc.backward(2, x, w, y, dx, std::span<float>{dw}.first(3), db); }).find("dW has 3") !=
        std::string::npos);
  // Without dx (a first layer) the weights are not needed; with dx they are.
  std::vector<float> dw_with_w(3 * 4, 0.0f), dw_without_w(3 * 4, 0.0f), db_a(3, 0.0f), db_b(3, 0.0f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = 0.5f - 0.125f * static_cast<float>(i);
  fc.backward(2, x, w, y, {}, dw_with_w, db_a);
  CHECK_NOTHROW(fc.backward(2, x, {}, y, {}, dw_without_w, db_b));
  CHECK(dw_without_w == dw_with_w);
  CHECK(db_b == db_a);
  CHECK(message_of([&] { fc.backward(2, x, {}, y, dx, dw, db); }) ==
        "linear::backward: W has 0 elements, expected [out=3, in=4] = 12");
  CHECK(message_of([&] { fc.backward(2, x, w, y, dx, dw, std::span<float>{db}.first(1)); }).find("db has 1") !=
        std::string::npos);
}

// ---- activations ---------------------------------------------------------------------------------

TEST_CASE("relu forward and backward, the gradient at 0 being 0") {
  const std::vector<float> x = {-2.0f, -0.0f, 0.0f, 1e-30f, 3.5f, -1e-30f};
  const std::vector<float> dy = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  std::vector<float> y(x.size()), dx(x.size());
  nn::relu::forward(x, y);
  CHECK(y == std::vector<float>{0.0f, 0.0f, 0.0f, 1e-30f, 3.5f, 0.0f});
  nn::relu::backward(x, dy, dx);
  CHECK(dx == std::vector<float>{0.0f, 0.0f, 0.0f, 4.0f, 5.0f, 0.0f});

  // In place, and against central differences away from the kink.
  auto v = random_vector(50, 41, -3.0f, 3.0f);
  for (auto& e : v)
    if (std::abs(e) < 0.05f) e = 0.5f;
  const auto g = random_vector(v.size(), 42);
  std::vector<float> out(v.size()), grad(v.size());
  nn::relu::backward(v, g, grad);
  const auto loss = [&] {
    nn::relu::forward(v, out);
    return dot(out, g);
  };
  check_close(grad, central_differences(v, 1e-2f, loss), 1e-5, 1e-4, "relu vs finite differences");
  auto w = v;
  nn::relu::forward(w, w);
  nn::relu::forward(v, out);
  CHECK(w == out);
}

TEST_CASE("gelu and relu: the AVX2 and AVX-512 paths give the portable path's bits") {
  namespace simd = trident::optim::detail;
  for (const std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{64}, std::size_t{1000}}) {
    auto x = random_vector(n, 71, -12.0f, 12.0f);
    if (n > 3) x[3] = std::numeric_limits<float>::quiet_NaN();
    const auto dy = random_vector(n, 72);
    auto run = [&](simd::host_isa isa) {
      REQUIRE(simd::force_host_isa(isa));
      std::vector<float> y(n), dx(n), r(n);
      nn::gelu::forward(x, y);
      nn::gelu::backward(x, dy, dx);
      nn::relu::forward(x, r);
      simd::unforce_host_isa();
      std::vector<std::uint32_t> bits;
      for (const auto* v : {&y, &dx, &r})
        for (float f : *v) bits.push_back(std::bit_cast<std::uint32_t>(f));
      return bits;
    };
    const auto portable = run(simd::host_isa::portable);
    for (const auto isa : {simd::host_isa::avx2, simd::host_isa::avx512}) {
      if (static_cast<int>(isa) > static_cast<int>(simd::detected_host_isa())) continue;  // this CPU lacks it
      INFO("isa ", static_cast<int>(isa), " n=", n);
      CHECK(run(isa) == portable);
    }
  }
}

TEST_CASE("gelu's tanh: within 2e-7 of tanh over [-10, 10], odd, +-1 in saturation, NaN kept") {
  double worst = 0, worst_relative = 0;
  bool odd = true;
  for (int i = -1000000; i <= 1000000; ++i) {
    const float z = static_cast<float>(i) * 1e-5f;
    const double want = std::tanh(static_cast<double>(z));
    const float got = nn::detail::tanh_float(z);
    worst = std::max(worst, std::abs(got - want));
    if (std::abs(z) > 1e-3f) worst_relative = std::max(worst_relative, std::abs(got - want) / std::abs(want));
    odd = odd && nn::detail::tanh_float(-z) == -got;
  }
  CHECK(odd);
  MESSAGE("tanh_float over [-10, 10]: worst absolute error ", worst, ", relative (|z| > 1e-3) ", worst_relative);
  CHECK(worst <= 2e-7);
  CHECK(worst_relative <= 5e-7);
  for (float z : {9.1f, 10.0f, 50.0f, std::numeric_limits<float>::infinity()}) {
    CHECK(nn::detail::tanh_float(z) == 1.0f);
    CHECK(nn::detail::tanh_float(-z) == -1.0f);
  }
  CHECK(nn::detail::tanh_float(0.0f) == 0.0f);
  CHECK(std::signbit(nn::detail::tanh_float(-0.0f)));
  CHECK(std::isnan(nn::detail::tanh_float(std::numeric_limits<float>::quiet_NaN())));
  std::vector<float> nan_in{std::numeric_limits<float>::quiet_NaN()}, nan_out(1);
  nn::gelu::forward(nan_in, nan_out);
  CHECK(std::isnan(nan_out[0]));  // a NaN in the activations reaches the loss, as overflow checks need
}

TEST_CASE("the softmax's exp: within 2e-7 relative of exp on (-87, 0], 0 from -87 down, NaN kept") {
  double worst = 0;
  for (int i = 0; i < 8700000; ++i) {  // x in (-87, 0]
    const float x = -static_cast<float>(i) * 1e-5f;
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(nn::detail::exp_nonpositive(x) - want) / want);
  }
  MESSAGE("exp_nonpositive over (-87, 0]: worst relative error ", worst);
  CHECK(worst <= 2e-7);
  CHECK(nn::detail::exp_nonpositive(0.0f) == 1.0f);
  CHECK(nn::detail::exp_nonpositive(-0.0f) == 1.0f);
  for (float x : {-87.0f, -87.5f, -100.0f, -1e30f, -std::numeric_limits<float>::infinity()}) CHECK(nn::detail::exp_nonpositive(x) == 0.0f);
  CHECK(std::isnan(nn::detail::exp_nonpositive(std::numeric_limits<float>::quiet_NaN())));
}

namespace {
// Causal attention in double, straight from its definition: out and dqkv for qkv and dout in the
// layouts of nn::causal_attention.
void attention_in_double(const nn::causal_attention& a, const std::vector<float>& qkv, const std::vector<float>& dout,
                         std::vector<double>& out, std::vector<double>& dqkv) {
  const std::size_t T = a.seq, B = a.batch, H = a.heads, D = a.head_dim;
  const auto at = [&](std::size_t i, std::size_t b, std::size_t h, std::size_t w, std::size_t d) {
    return (((i * B + b) * H + h) * 3 + w) * D + d;
  };
  const auto ot = [&](std::size_t i, std::size_t b, std::size_t h, std::size_t d) { return ((i * B + b) * H + h) * D + d; };
  out.assign(a.out_size(), 0.0);
  dqkv.assign(a.qkv_size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i) {
        std::vector<double> p(i + 1), dp(i + 1);
        double max = -INFINITY, sum = 0, dot = 0;
        for (std::size_t j = 0; j <= i; ++j) {
          for (std::size_t d = 0; d < D; ++d) p[j] += double{qkv[at(i, b, h, 0, d)]} * qkv[at(j, b, h, 1, d)];
          p[j] *= scale;
          max = std::max(max, p[j]);
        }
        for (std::size_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - max));
        for (std::size_t j = 0; j <= i; ++j) {
          p[j] /= sum;
          for (std::size_t d = 0; d < D; ++d) {
            out[ot(i, b, h, d)] += p[j] * qkv[at(j, b, h, 2, d)];
            dp[j] += double{dout[ot(i, b, h, d)]} * qkv[at(j, b, h, 2, d)];
            dqkv[at(j, b, h, 2, d)] += p[j] * dout[ot(i, b, h, d)];
          }
          dot += p[j] * dp[j];
        }
        for (std::size_t j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - dot) * scale;
          for (std::size_t d = 0; d < D; ++d) {
            dqkv[at(i, b, h, 0, d)] += ds * qkv[at(j, b, h, 1, d)];
            dqkv[at(j, b, h, 1, d)] += ds * qkv[at(i, b, h, 0, d)];
          }
        }
      }
}
}  // namespace

TEST_CASE("causal_attention: out and dqkv within 2e-6 of the definition in double (rows past the 16-wide chunks)") {
  // seq 37: rows of 1..37 columns, so the softmax's chunks of 16, their tails and the row
  // blocks of 64 (one partial block) all occur; 150 also crosses a row block.
  for (const std::size_t seq : {std::size_t{37}, std::size_t{150}}) {
    const nn::causal_attention a{.seq = seq, .batch = 2, .heads = 3, .head_dim = 8};
    const auto qkv = random_vector(a.qkv_size(), 81, -2.0f, 2.0f), dout = random_vector(a.out_size(), 82);
    std::vector<float> out(a.out_size()), probs(a.probs_size()), dqkv(a.qkv_size());
    a.forward(qkv, out, probs);
    a.backward(qkv, probs, dout, dqkv);
    std::vector<double> want_out, want_dqkv;
    attention_in_double(a, qkv, dout, want_out, want_dqkv);
    const auto normwise = [](const std::vector<float>& got, const std::vector<double>& want) {
      double diff = 0, norm = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        diff = std::max(diff, std::abs(got[i] - want[i]));
        norm = std::max(norm, std::abs(want[i]));
      }
      return diff / norm;
    };
    INFO("seq ", seq);
    CHECK(normwise(out, want_out) <= 2e-6);
    CHECK(normwise(dqkv, want_dqkv) <= 2e-6);
    bool masked = true, sums = true;  // every (batch, head): 0 above the diagonal, rows summing to 1
    for (std::size_t r = 0; r < a.batch * a.heads * seq; ++r) {
      const std::size_t i = r % seq;
      double sum = 0;
      for (std::size_t j = 0; j < seq; ++j) (j <= i ? sum += probs[r * seq + j] : masked = masked && probs[r * seq + j] == 0.0f);
      sums = sums && std::abs(sum - 1.0) <= 1e-6;
    }
    CHECK(masked);
    CHECK(sums);
  }
}

TEST_CASE("causal_attention: the AVX2 and AVX-512 softmax paths give the portable path's bits") {
  namespace simd = trident::optim::detail;
  const nn::causal_attention a{.seq = 53, .batch = 2, .heads = 2, .head_dim = 8};
  auto qkv = random_vector(a.qkv_size(), 83, -6.0f, 6.0f);
  const auto dout = random_vector(a.out_size(), 84);
  auto run = [&](simd::host_isa isa) {
    REQUIRE(simd::force_host_isa(isa));
    std::vector<float> out(a.out_size()), probs(a.probs_size()), dqkv(a.qkv_size());
    a.forward(qkv, out, probs);
    a.backward(qkv, probs, dout, dqkv);
    simd::unforce_host_isa();
    std::vector<std::uint32_t> bits;
    for (const auto* v : {&out, &probs, &dqkv})
      for (float f : *v) bits.push_back(std::bit_cast<std::uint32_t>(f));
    return bits;
  };
  const auto portable = run(simd::host_isa::portable);
  for (const auto isa : {simd::host_isa::avx2, simd::host_isa::avx512}) {
    if (static_cast<int>(isa) > static_cast<int>(simd::detected_host_isa())) continue;  // this CPU lacks it
    INFO("isa ", static_cast<int>(isa));
    CHECK(run(isa) == portable);
  }
  // A NaN in one query reaches that head's rows (as overflow checks need), not the others.
  qkv[0] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(a.out_size()), probs(a.probs_size());
  a.forward(qkv, out, probs);
  CHECK(std::isnan(out[0]));
  CHECK(!std::isnan(out[a.head_dim]));  // batch 0, head 1
}

TEST_CASE("flash attention's tiles (emulated on the host): out, lse and dqkv of causal_attention, any seq") {
  // seq 1, 37 (one partial tile), 64 (one whole), 130 (two whole and a 2-row one); head_dim 32 and 64.
  for (const std::size_t head_dim : {std::size_t{32}, std::size_t{64}})
    for (const std::size_t seq : {std::size_t{1}, std::size_t{37}, std::size_t{64}, std::size_t{130}}) {
      INFO("seq ", seq, " head_dim ", head_dim);
      const nn::causal_attention a{.seq = seq, .batch = 2, .heads = 2, .head_dim = head_dim};
      const auto qkv = random_vector(a.qkv_size(), 101, -3.0f, 3.0f), dout = random_vector(a.out_size(), 102);
      std::vector<float> out(a.out_size()), probs(a.probs_size()), dqkv(a.qkv_size());
      a.forward(qkv, out, probs);
      a.backward(qkv, probs, dout, dqkv);
      const std::size_t rows = a.batch * a.heads * seq;
      std::vector<float> f_out(a.out_size(), NAN), lse(rows, NAN), delta(rows), f_dqkv(a.qkv_size(), NAN);
      nn::flash::emulate_forward(a, qkv, f_out, lse);
      nn::flash::emulate_backward(a, qkv, f_out, lse, dout, delta, f_dqkv);
      const auto normwise = [](const std::vector<float>& got, const std::vector<float>& want) {
        double diff = 0, norm = 0;  // a NaN left anywhere (an element not written) fails
        for (std::size_t i = 0; i < got.size(); ++i) {
          diff = std::isnan(got[i]) ? INFINITY : std::max(diff, static_cast<double>(std::abs(got[i] - want[i])));
          norm = std::max(norm, static_cast<double>(std::abs(want[i])));
        }
        return diff / norm;
      };
      CHECK(normwise(f_out, out) <= 2e-6);
      CHECK(normwise(f_dqkv, dqkv) <= 2e-6);
      // lse against log sum_j exp(scale q_i . k_j) in double, from the saved probabilities'
      // definition: p_ij = exp(s_ij - lse_i), so lse_i = s_ii - log p_ii.
      double worst = 0;
      const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
      for (std::size_t bh = 0; bh < a.batch * a.heads; ++bh)
        for (std::size_t i = 0; i < seq; ++i) {
          const auto at = [&](std::size_t pos, std::size_t which) { return ((pos * a.batch * a.heads + bh) * 3 + which) * head_dim; };
          double max = -INFINITY;
          std::vector<double> sc(i + 1);
          for (std::size_t j = 0; j <= i; ++j) {
            for (std::size_t d = 0; d < head_dim; ++d) sc[j] += double{qkv[at(i, 0) + d]} * qkv[at(j, 1) + d];
            max = std::max(max, sc[j] *= scale);
          }
          double sum = 0;
          for (double x : sc) sum += std::exp(x - max);
          worst = std::max(worst, std::abs(lse[bh * seq + i] - (max + std::log(sum))));
        }
      CHECK(worst <= 1e-5);
      // With the GPU's TF32 operands (what tests/nn/test_nn.cu compares the device against): the
      // rounding shows, and stays at TF32's size.
      std::vector<float> t_out(a.out_size()), t_lse(rows), t_dqkv(a.qkv_size());
      nn::flash::emulate_forward(a, qkv, t_out, t_lse, true);
      nn::flash::emulate_backward(a, qkv, t_out, t_lse, dout, delta, t_dqkv, true);
      CHECK(normwise(t_out, out) <= 5e-3);
      CHECK(normwise(t_dqkv, dqkv) <= 1e-2);
      if (seq > 1) CHECK(normwise(t_dqkv, dqkv) > 10 * normwise(f_dqkv, dqkv));
    }
  const nn::causal_attention odd{.seq = 8, .batch = 1, .heads = 1, .head_dim = 48};
  std::vector<float> x(odd.qkv_size()), y(odd.out_size()), l(8);
  CHECK_THROWS_WITH_AS(nn::flash::emulate_forward(odd, x, y, l), doctest::Contains("head_dim 48 is not supported; expected 32 or 64"),
                       trident::usage_error);
  // The tiles move 16-byte quads: a tensor starting one float into an allocation is named.
  const nn::causal_attention a{.seq = 8, .batch = 1, .heads = 1, .head_dim = 32};
  std::vector<float> qkv(a.qkv_size() + 1), out(a.out_size() + 1), lse(8), delta(8), dqkv(a.qkv_size() + 1);
  const std::span<const float> shifted(qkv.data() + 1, a.qkv_size());
  CHECK_THROWS_WITH_AS(nn::flash::emulate_forward(a, shifted, std::span<float>(out.data(), a.out_size()), lse),
                       doctest::Contains("qkv at"), trident::usage_error);
  CHECK_THROWS_WITH_AS(nn::flash::emulate_forward(a, shifted, std::span<float>(out.data(), a.out_size()), lse),
                       doctest::Contains("is not 16-byte aligned"), trident::usage_error);
  const std::span<const float> qkv0(qkv.data(), a.qkv_size()), dout1(out.data() + 1, a.out_size());
  CHECK_THROWS_WITH_AS(nn::flash::emulate_backward(a, qkv0, dout1, lse, dout1, delta, std::span<float>(dqkv.data(), a.qkv_size())),
                       doctest::Contains("dout at"), trident::usage_error);
  CHECK_THROWS_WITH_AS(nn::flash::emulate_backward(a, qkv0, qkv0.first(a.out_size()), lse, qkv0.first(a.out_size()), delta,
                                                   std::span<float>(dqkv.data() + 1, a.qkv_size())),
                       doctest::Contains("dqkv at"), trident::usage_error);
}

TEST_CASE("bf16 flash tiles (emulated on the host): the attention of the bf16-rounded inputs, any seq") {
  // The reference: nn::causal_attention on q, k and v rounded to bf16, which is what the tiles
  // multiply; what remains is P's rounding to bf16 before P v (about 2^-9 per term) for out, and
  // float sums for lse. A fragment placed in the wrong lane, a mask off by one or a softmax
  // statistic kept per lane instead of per row moves out by a sizeable part of its range.
  for (const std::size_t head_dim : {std::size_t{32}, std::size_t{64}})
    for (const std::size_t seq : {std::size_t{1}, std::size_t{37}, std::size_t{64}, std::size_t{130}}) {
      INFO("seq ", seq, " head_dim ", head_dim);
      const nn::causal_attention a{.seq = seq, .batch = 2, .heads = 2, .head_dim = head_dim};
      auto qkv = random_vector(a.qkv_size(), 111, -3.0f, 3.0f);
      for (float& x : qkv) x = static_cast<float>(trident::bf16(x));
      std::vector<float> out(a.out_size()), probs(a.probs_size());
      a.forward(qkv, out, probs);
      const std::size_t rows = a.batch * a.heads * seq;
      std::vector<float> b_out(a.out_size(), NAN), b_lse(rows, NAN), f_out(a.out_size()), f_lse(rows);
      nn::flash_bf16::emulate_forward(a, qkv, b_out, b_lse);
      nn::flash::emulate_forward(a, qkv, f_out, f_lse);  // the float tiles, exact products
      double diff = 0, norm = 0, lse_diff = 0;  // a NaN left anywhere (an element not written) fails
      for (std::size_t i = 0; i < out.size(); ++i) {
        diff = std::isnan(b_out[i]) ? INFINITY : std::max(diff, static_cast<double>(std::abs(b_out[i] - out[i])));
        norm = std::max(norm, static_cast<double>(std::abs(out[i])));
      }
      for (std::size_t i = 0; i < rows; ++i)
        lse_diff = std::isnan(b_lse[i]) ? INFINITY : std::max(lse_diff, static_cast<double>(std::abs(b_lse[i] - f_lse[i])));
      MESSAGE("out within ", diff / norm, " of its largest element, lse within ", lse_diff);
      CHECK(diff / norm <= 5e-3);
      CHECK(lse_diff <= 1e-5);
      if (seq > 1) CHECK(diff / norm > 1e-5);  // P's rounding shows: the products did run in bf16

      // Backward from the tiles' own out and lse, against the exact gradient of the rounded
      // inputs: P and dS are rounded to bf16 before their products.
      auto dout = random_vector(a.out_size(), 112);
      for (float& x : dout) x = static_cast<float>(trident::bf16(x));
      std::vector<float> dqkv(a.qkv_size()), b_dqkv(a.qkv_size(), NAN), delta(rows);
      a.backward(qkv, probs, dout, dqkv);
      nn::flash_bf16::emulate_backward(a, qkv, b_out, b_lse, dout, delta, b_dqkv);
      double g_diff = 0, g_norm = 0;
      for (std::size_t i = 0; i < dqkv.size(); ++i) {
        g_diff = std::isnan(b_dqkv[i]) ? INFINITY : std::max(g_diff, static_cast<double>(std::abs(b_dqkv[i] - dqkv[i])));
        g_norm = std::max(g_norm, static_cast<double>(std::abs(dqkv[i])));
      }
      MESSAGE("dqkv within ", g_diff / g_norm, " of its largest element");
      CHECK(g_diff / g_norm <= 1e-2);
      if (seq > 1) CHECK(g_diff / g_norm > 1e-5);
    }
}

TEST_CASE("layer_norm: the AVX2 and AVX-512 paths give the portable path's bits (with and without beta, ragged rows)") {
  namespace simd = trident::optim::detail;
  for (const std::size_t hidden : {std::size_t{7}, std::size_t{37}, std::size_t{128}})
    for (const bool with_beta : {false, true}) {
      const std::size_t rows = 5;
      const nn::layer_norm ln{.hidden = hidden};
      const auto x = random_vector(rows * hidden, 91, -3.0f, 5.0f), gamma = random_vector(hidden, 92),
                 beta = random_vector(hidden, 93), dy = random_vector(rows * hidden, 94);
      auto run = [&](simd::host_isa isa) {
        REQUIRE(simd::force_host_isa(isa));
        std::vector<float> y(rows * hidden), mean(rows), rstd(rows), dx(rows * hidden), dgamma(hidden, 0.5f),
            dbeta(with_beta ? hidden : 0, 0.25f);
        ln.forward(rows, x, gamma, with_beta ? std::span<const float>(beta) : std::span<const float>(), y, mean, rstd);
        ln.backward(rows, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
        simd::unforce_host_isa();
        std::vector<std::uint32_t> bits;
        for (const auto* v : {&y, &mean, &rstd, &dx, &dgamma, &dbeta})
          for (float f : *v) bits.push_back(std::bit_cast<std::uint32_t>(f));
        return bits;
      };
      const auto portable = run(simd::host_isa::portable);
      for (const auto isa : {simd::host_isa::avx2, simd::host_isa::avx512}) {
        if (static_cast<int>(isa) > static_cast<int>(simd::detected_host_isa())) continue;  // this CPU lacks it
        INFO("isa ", static_cast<int>(isa), " hidden ", hidden, " beta ", with_beta);
        CHECK(run(isa) == portable);
      }
    }
}

TEST_CASE("gelu (tanh) matches PyTorch's values, its double formula, and central differences") {
  // torch.nn.functional.gelu(torch.tensor([...]), approximate='tanh')
  const std::vector<float> x = {-3.0f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 3.0f};
  const std::vector<double> torch = {-0.0036373544, -0.1588079929, -0.1542859972, 0.0, 0.3457140028, 0.8411920071,
                                     2.9963626456};
  std::vector<float> y(x.size());
  nn::gelu::forward(x, y);
  check_close(y, torch, 1e-6, 1e-6, "gelu vs PyTorch");

  auto v = random_vector(200, 51, -6.0f, 6.0f);
  std::vector<double> want(v.size()), want_grad(v.size());
  const auto g = random_vector(v.size(), 52);
  for (std::size_t i = 0; i < v.size(); ++i) {
    want[i] = gelu_ref(v[i]);
    want_grad[i] = g[i] * gelu_grad_ref(v[i]);
  }
  std::vector<float> out(v.size()), grad(v.size());
  nn::gelu::forward(v, out);
  check_close(out, want, 1e-6, 1e-6, "gelu vs double");
  nn::gelu::backward(v, g, grad);
  check_close(grad, want_grad, 1e-6, 1e-5, "gelu backward vs double");
  const auto loss = [&] {
    nn::gelu::forward(v, out);
    return dot(out, g);
  };
  check_close(grad, central_differences(v, 1e-2f, loss), 2e-4, 1e-3, "gelu vs finite differences");

  // dx may alias dy.
  auto inplace = g;
  nn::gelu::backward(v, inplace, inplace);
  CHECK(inplace == grad);

  CHECK_THROWS_AS(nn::gelu::forward(v, std::span<float>{out}.first(3)), trident::usage_error);
  CHECK_THROWS_AS(nn::relu::backward(v, std::span<const float>{g}.first(3), grad), trident::usage_error);
}

// ---- losses --------------------------------------------------------------------------------------

TEST_CASE("mse_loss is the mean over all elements, with its gradient") {
  auto pred = random_vector(37, 61);
  const auto target = random_vector(37, 62);
  double want = 0;
  for (std::size_t i = 0; i < pred.size(); ++i) want += (static_cast<double>(pred[i]) - target[i]) * (pred[i] - target[i]);
  want /= static_cast<double>(pred.size());
  CHECK(nn::mse_loss::forward(pred, target) == doctest::Approx(want).epsilon(1e-6));

  std::vector<float> grad(pred.size(), std::numeric_limits<float>::quiet_NaN());
  nn::mse_loss::backward(pred, target, grad);
  std::vector<double> analytic(pred.size());
  for (std::size_t i = 0; i < pred.size(); ++i)
    analytic[i] = 2.0 * (static_cast<double>(pred[i]) - target[i]) / static_cast<double>(pred.size());
  check_close(grad, analytic, 1e-7, 1e-6, "mse backward vs analytic");
  const auto loss = [&] { return static_cast<double>(nn::mse_loss::forward(pred, target)); };
  check_close(grad, central_differences(pred, 1e-2f, loss), 1e-5, 1e-3, "mse vs finite differences");

  // dloss scales the gradient (a loss scale, or a rank's share of a global mean).
  std::vector<float> scaled(pred.size());
  nn::mse_loss::backward(pred, target, scaled, 0.25f);
  for (auto& a : analytic) a *= 0.25;
  check_close(scaled, analytic, 1e-7, 1e-6, "mse backward with dloss");

  CHECK_THROWS_AS(nn::mse_loss::forward(pred, std::span<const float>{target}.first(3)), trident::usage_error);
  CHECK_THROWS_AS(nn::mse_loss::forward({}, {}), trident::usage_error);
  CHECK_THROWS_AS(nn::mse_loss::backward(pred, target, std::span<float>{grad}.first(2)), trident::usage_error);
}

TEST_CASE("softmax_cross_entropy: mean of log-sum-exp minus the target logit, stable, with its gradient") {
  const std::size_t batch = 5, classes = 7;
  auto logits = random_vector(batch * classes, 71, -3.0f, 3.0f);
  const std::vector<std::int32_t> targets = {0, 6, 3, 3, 1};

  const auto reference = [&](const std::vector<float>& z, std::vector<double>* grad) {
    double total = 0;
    if (grad) grad->assign(z.size(), 0.0);
    for (std::size_t r = 0; r < batch; ++r) {
      double m = -INFINITY;
      for (std::size_t c = 0; c < classes; ++c) m = std::max(m, static_cast<double>(z[r * classes + c]));
      double s = 0;
      for (std::size_t c = 0; c < classes; ++c) s += std::exp(z[r * classes + c] - m);
      total += m + std::log(s) - z[r * classes + static_cast<std::size_t>(targets[r])];
      if (grad)
        for (std::size_t c = 0; c < classes; ++c)
          (*grad)[r * classes + c] =
              (std::exp(z[r * classes + c] - m) / s - (static_cast<std::int32_t>(c) == targets[r] ? 1.0 : 0.0)) /
              static_cast<double>(batch);
    }
    return total / static_cast<double>(batch);
  };

  std::vector<double> want_grad;
  const double want = reference(logits, &want_grad);
  CHECK(nn::softmax_cross_entropy::forward(batch, classes, logits, targets) == doctest::Approx(want).epsilon(1e-6));

  std::vector<float> grad(logits.size(), std::numeric_limits<float>::quiet_NaN());
  nn::softmax_cross_entropy::backward(batch, classes, logits, targets, grad);
  check_close(grad, want_grad, 1e-7, 1e-6, "cross-entropy backward vs analytic");
  const auto loss = [&] { return static_cast<double>(nn::softmax_cross_entropy::forward(batch, classes, logits, targets)); };
  check_close(grad, central_differences(logits, 1e-2f, loss), 2e-5, 1e-3, "cross-entropy vs finite differences");
  for (std::size_t r = 0; r < batch; ++r) {  // each row's gradient sums to zero
    double s = 0;
    for (std::size_t c = 0; c < classes; ++c) s += grad[r * classes + c];
    CHECK(std::abs(s) < 1e-7);
  }

  std::vector<float> scaled(grad.size());
  nn::softmax_cross_entropy::backward(batch, classes, logits, targets, scaled, 4.0f);
  for (auto& v : want_grad) v *= 4.0;
  check_close(scaled, want_grad, 1e-7, 1e-6, "cross-entropy backward with dloss");

  // Huge logits: log-sum-exp must not overflow.
  const std::vector<float> huge = {1000.0f, 0.0f, -1000.0f, 3e4f, 3e4f, 3e4f};
  const std::vector<std::int32_t> huge_targets = {0, 2};
  const float l = nn::softmax_cross_entropy::forward(2, 3, huge, huge_targets);
  CHECK(std::isfinite(l));
  CHECK(l == doctest::Approx((0.0 + std::log(3.0)) / 2).epsilon(1e-6));
  std::vector<float> huge_grad(huge.size());
  nn::softmax_cross_entropy::backward(2, 3, huge, huge_targets, huge_grad);
  for (float v : huge_grad) CHECK(std::isfinite(v));

  // Errors: targets out of range (naming the row), sizes.
  const std::vector<std::int32_t> bad = {0, 6, 7, 3, 1};
  CHECK(message_of([&] { nn::softmax_cross_entropy::forward(batch, classes, logits, bad); })
            .find("target 7 of row 2 is outside [0, 7)") != std::string::npos);
  const std::vector<std::int32_t> negative = {0, -1, 1, 3, 1};
  CHECK_THROWS_AS(nn::softmax_cross_entropy::backward(batch, classes, logits, negative, grad), trident::usage_error);
  CHECK_THROWS_AS(nn::softmax_cross_entropy::forward(batch, classes + 1, logits, targets), trident::usage_error);
  CHECK_THROWS_AS(nn::softmax_cross_entropy::forward(batch - 1, classes, std::span<const float>{logits}.first(28),
                                                     targets),
                  trident::usage_error);
  CHECK_THROWS_AS(nn::softmax_cross_entropy::forward(0, classes, {}, {}), trident::usage_error);
}

// ---- a whole step ------------------------------------------------------------------------------

TEST_CASE("an MLP (linear, gelu, linear, cross-entropy) has the gradients of central differences") {
  const std::size_t batch = 4, in = 6, hidden = 8, classes = 5;
  const nn::linear l0{.in_features = in, .out_features = hidden};
  const nn::linear l1{.in_features = hidden, .out_features = classes};
  auto w0 = random_vector(l0.weight_size(), 81), b0 = random_vector(l0.bias_size(), 82);
  auto w1 = random_vector(l1.weight_size(), 83), b1 = random_vector(l1.bias_size(), 84);
  const auto x = random_vector(batch * in, 85, -2.0f, 2.0f);
  const std::vector<std::int32_t> targets = {1, 4, 0, 2};

  std::vector<float> h(batch * hidden), a(batch * hidden), z(batch * classes);
  const auto loss = [&] {
    l0.forward(batch, x, w0, b0, h);
    nn::gelu::forward(h, a);
    l1.forward(batch, a, w1, b1, z);
    return static_cast<double>(nn::softmax_cross_entropy::forward(batch, classes, z, targets));
  };
  loss();
  std::vector<float> dz(z.size()), da(a.size()), dh(h.size());
  std::vector<float> dw0(w0.size(), 0.0f), db0(b0.size(), 0.0f), dw1(w1.size(), 0.0f), db1(b1.size(), 0.0f);
  nn::softmax_cross_entropy::backward(batch, classes, z, targets, dz);
  l1.backward(batch, a, w1, dz, da, dw1, db1);
  nn::gelu::backward(h, da, dh);
  l0.backward(batch, x, w0, dh, {}, dw0, db0);

  const float step = 1e-2f;
  check_close(dw0, central_differences(w0, step, loss), 5e-5, 2e-3, "dW0");
  check_close(db0, central_differences(b0, step, loss), 5e-5, 2e-3, "db0");
  check_close(dw1, central_differences(w1, step, loss), 5e-5, 2e-3, "dW1");
  check_close(db1, central_differences(b1, step, loss), 5e-5, 2e-3, "db1");
}
