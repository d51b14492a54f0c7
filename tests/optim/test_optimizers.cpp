// The host optimizers against PyTorch's update rules evaluated in double precision (written
// here from torch/optim/sgd.py, adam.py, adamw.py, independently of the library's float code),
// plus the properties the ZeRO step relies on: the multiplier is a pre-scaling, half gradients
// and working copies, results independent of threads and chunking, argument checks, gradient
// statistics and clipping.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/random.hpp"
#include "trident/core/error.hpp"
#include "trident/core/half.hpp"
#include "trident/optim/optimizers.hpp"

namespace optim = trident::optim;
using trident::bf16;
using trident::fp16;

namespace {

using test_support::random_vector;

// ---- double-precision references (PyTorch's formulas) -------------------------------------------

struct sgd_ref {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
  std::vector<double> p, buf;
  void step(const std::vector<double>& grad, std::int64_t t) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      double d_p = grad[i];
      if (weight_decay != 0) d_p += weight_decay * p[i];
      if (momentum != 0) {
        buf[i] = t == 1 ? d_p : momentum * buf[i] + (1 - dampening) * d_p;
        d_p = nesterov ? d_p + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d_p;
    }
  }
};

struct adam_ref {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;
  std::vector<double> p, m, v;
  void step(const std::vector<double>& grad, std::int64_t t) {
    const double bc1 = 1 - std::pow(beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(beta2, static_cast<double>(t));
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      if (decoupled) p[i] *= 1 - lr * weight_decay;
      else g += weight_decay * p[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = beta2 * v[i] + (1 - beta2) * g * g;
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + eps;
      p[i] -= lr / bc1 * m[i] / denom;
    }
  }
};

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// |a - b| <= tol * max(|b|, floor): relative, with a floor for values near zero.
void check_close(const std::vector<float>& got, const std::vector<double>& want, double tol, const char* what,
                 double floor = 1e-1) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  std::size_t where = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]) / std::max(std::abs(want[i]), floor);
    if (!(err <= worst)) {
      worst = err;
      where = i;
    }
  }
  INFO(what, ": worst relative error ", worst, " at ", where, " (got ", got[where], ", want ", want[where], ")");
  CHECK(worst <= tol);
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) {
      if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
    } else {
      if (a[i].bits() != b[i].bits()) return false;
    }
  }
  return true;
}

constexpr std::size_t n_small = 3000 + 17;  // full tiles and a tail
constexpr int steps = 12;

void run_sgd_case(optim::sgd::options o) {
  optim::sgd opt{o};
  auto p = random_vector(n_small, 1);
  std::vector<float> buf(n_small, 123.0f);  // garbage: the first step must not read it
  sgd_ref ref{o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, to_double(p), std::vector<double>(n_small)};
  for (int t = 1; t <= steps; ++t) {
    const auto g = random_vector(n_small, 100 + static_cast<std::uint32_t>(t));
    opt.step(std::span<float>(p), std::span<const float>(g), {std::span<float>(buf)}, t);
    ref.step(to_double(g), t);
  }
  check_close(p, ref.p, 1e-5, "sgd params");
  if (o.momentum != 0) check_close(buf, ref.buf, 1e-5, "sgd momentum buffer");
}

template <class Opt>
void run_adam_case(typename Opt::options o, bool decoupled) {
  Opt opt{o};
  auto p = random_vector(n_small, 2);
  std::vector<float> m(n_small, 0.0f), v(n_small, 0.0f);
  adam_ref ref{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, decoupled, to_double(p), std::vector<double>(n_small),
               std::vector<double>(n_small)};
  for (int t = 1; t <= steps; ++t) {
    const auto g = random_vector(n_small, 200 + static_cast<std::uint32_t>(t));
    opt.step(std::span<float>(p), std::span<const float>(g), {std::span<float>(m), std::span<float>(v)}, t);
    ref.step(to_double(g), t);
  }
  check_close(p, ref.p, 1e-5, "adam params");
  check_close(m, ref.m, 1e-5, "adam exp_avg", 1e-2);
  check_close(v, ref.v, 1e-5, "adam exp_avg_sq", 1e-3);
}

// Runs `steps` steps of opt over one state set and returns params + states, gradients from seed.
template <class Opt, class Grad = float, class Working = float>
struct run_result {
  std::vector<float> params;
  std::vector<std::vector<float>> states;
  std::vector<Working> working;
};

template <class Opt, class Grad = float, class Working = float>
run_result<Opt, Grad, Working> run(const Opt& opt, std::size_t n, std::size_t chunk, int count, float multiplier,
                                   bool with_working, const std::vector<std::vector<Grad>>& grads) {
  run_result<Opt, Grad, Working> r{random_vector(n, 3), std::vector<std::vector<float>>(Opt::state_count, std::vector<float>(n)),
                                   std::vector<Working>(with_working ? n : 0)};
  for (int t = 1; t <= count; ++t) {
    for (std::size_t at = 0; at < n; at += chunk) {
      const std::size_t len = std::min(chunk, n - at);
      std::array<std::span<float>, Opt::state_count> state;
      for (std::size_t s = 0; s < Opt::state_count; ++s) state[s] = std::span<float>(r.states[s]).subspan(at, len);
      std::span<Working> w = with_working ? std::span<Working>(r.working).subspan(at, len) : std::span<Working>{};
      opt.step(std::span<float>(r.params).subspan(at, len), std::span<const Grad>(grads[static_cast<std::size_t>(t - 1)]).subspan(at, len),
               state, t, multiplier, w);
    }
  }
  return r;
}

template <class Grad>
std::vector<std::vector<Grad>> random_grads(std::size_t n, int count, std::uint32_t seed, float scale = 1.0f) {
  std::vector<std::vector<Grad>> out;
  for (int t = 0; t < count; ++t) {
    const auto g = random_vector(n, seed + static_cast<std::uint32_t>(t), -scale, scale);
    std::vector<Grad> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = Grad(g[i]);
    out.push_back(std::move(h));
  }
  return out;
}

optim::sgd sgd_nesterov() {
  optim::sgd o;
  o.opt = {.lr = 0.05f, .momentum = 0.9f, .dampening = 0, .weight_decay = 1e-3f, .nesterov = true};
  return o;
}

}  // namespace

TEST_CASE("the types opt in to the optimizer concepts") {
  static_assert(optim::optimizer<optim::sgd> && optim::optimizer<optim::adam> && optim::optimizer<optim::adamw>);
  static_assert(optim::sgd::state_count == 1 && optim::adam::state_count == 2 && optim::adamw::state_count == 2);
  static_assert(!optim::optimizer<int>);
  CHECK(optim::adamw{}.opt.weight_decay == doctest::Approx(1e-2));
  CHECK(optim::adam{}.opt.weight_decay == 0);
  CHECK(optim::sgd{}.opt.lr == doctest::Approx(1e-2));
}

TEST_CASE("sgd matches torch.optim.SGD in double precision") {
  SUBCASE("plain") { run_sgd_case({.lr = 0.1f}); }
  SUBCASE("weight decay") { run_sgd_case({.lr = 0.1f, .weight_decay = 1e-2f}); }
  SUBCASE("momentum") { run_sgd_case({.lr = 0.05f, .momentum = 0.9f}); }
  SUBCASE("momentum, dampening") { run_sgd_case({.lr = 0.05f, .momentum = 0.9f, .dampening = 0.3f}); }
  SUBCASE("momentum, dampening, weight decay") {
    run_sgd_case({.lr = 0.05f, .momentum = 0.8f, .dampening = 0.1f, .weight_decay = 5e-3f});
  }
  SUBCASE("nesterov") { run_sgd_case({.lr = 0.05f, .momentum = 0.9f, .nesterov = true}); }
  SUBCASE("nesterov, weight decay") { run_sgd_case({.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-2f, .nesterov = true}); }
}

TEST_CASE("the first momentum step takes the gradient undampened") {
  optim::sgd opt{{.lr = 1.0f, .momentum = 0.9f, .dampening = 0.5f}};
  std::vector<float> p{0.0f}, buf{42.0f}, g{2.0f};
  opt.step(std::span<float>(p), std::span<const float>(g), {std::span<float>(buf)}, 1);
  CHECK(buf[0] == 2.0f);  // clone(d_p), not (1 - dampening) * d_p, and the old contents ignored
  CHECK(p[0] == -2.0f);
  opt.step(std::span<float>(p), std::span<const float>(g), {std::span<float>(buf)}, 2);
  CHECK(buf[0] == doctest::Approx(0.9 * 2 + 0.5 * 2));
}

TEST_CASE("adam and adamw match torch.optim.Adam / AdamW in double precision") {
  SUBCASE("adam") { run_adam_case<optim::adam>({.lr = 1e-2f}, false); }
  SUBCASE("adam, L2 weight decay") { run_adam_case<optim::adam>({.lr = 1e-2f, .weight_decay = 0.1f}, false); }
  SUBCASE("adam, other betas and eps") {
    run_adam_case<optim::adam>({.lr = 3e-3f, .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f}, false);
  }
  SUBCASE("adamw, default decay") { run_adam_case<optim::adamw>({.lr = 1e-2f}, true); }
  SUBCASE("adamw, strong decay") { run_adam_case<optim::adamw>({.lr = 1e-2f, .weight_decay = 0.5f}, true); }
  SUBCASE("adamw, no decay is adam") {
    optim::adamw w{{.lr = 1e-2f, .weight_decay = 0}};
    optim::adam a{{.lr = 1e-2f}};
    const auto g = random_grads<float>(n_small, 5, 7);
    CHECK(bitwise_equal(run(w, n_small, n_small, 5, 1.0f, false, g).params, run(a, n_small, n_small, 5, 1.0f, false, g).params));
  }
}

TEST_CASE("adam's decoupled and L2 weight decay differ") {
  const auto g = random_grads<float>(64, 3, 9);
  const auto a = run(optim::adam{{.lr = 1e-2f, .weight_decay = 0.1f}}, 64, 64, 3, 1.0f, false, g).params;
  const auto w = run(optim::adamw{{.lr = 1e-2f, .weight_decay = 0.1f}}, 64, 64, 3, 1.0f, false, g).params;
  CHECK_FALSE(bitwise_equal(a, w));
}

TEST_CASE("the multiplier is the same as pre-scaled gradients") {
  const float multiplier = 1.0f / 1024.0f * 0.37f;  // unscale and a clip factor
  const auto scaled = random_grads<float>(n_small, 4, 11, 1000.0f);
  std::vector<std::vector<float>> prescaled = scaled;
  for (auto& g : prescaled)
    for (auto& x : g) x *= multiplier;
  SUBCASE("sgd") {
    CHECK(bitwise_equal(run(sgd_nesterov(), n_small, n_small, 4, multiplier, false, scaled).params,
                        run(sgd_nesterov(), n_small, n_small, 4, 1.0f, false, prescaled).params));
  }
  SUBCASE("adamw") {
    const auto a = run(optim::adamw{}, n_small, n_small, 4, multiplier, false, scaled);
    const auto b = run(optim::adamw{}, n_small, n_small, 4, 1.0f, false, prescaled);
    CHECK(bitwise_equal(a.params, b.params));
    CHECK(bitwise_equal(a.states[1], b.states[1]));
  }
}

template <class Half>
void check_half_gradients_and_working() {
  const auto half_grads = random_grads<Half>(n_small, 4, 21);
  std::vector<std::vector<float>> widened;
  for (const auto& g : half_grads) widened.emplace_back(g.begin(), g.end());
  optim::adamw opt{{.lr = 1e-2f}};
  const auto h = run<optim::adamw, Half, Half>(opt, n_small, n_small, 4, 0.5f, true, half_grads);
  const auto f = run<optim::adamw, float, float>(opt, n_small, n_small, 4, 0.5f, false, widened);
  CHECK(bitwise_equal(h.params, f.params));  // a half gradient is its float value, nothing else
  std::vector<Half> rounded(n_small);
  for (std::size_t i = 0; i < n_small; ++i) rounded[i] = Half(h.params[i]);
  CHECK(bitwise_equal(h.working, rounded));

  // And against the double reference with the same (rounded) gradients.
  adam_ref ref{1e-2, 0.9f, 0.999f, 1e-8f, 1e-2f, true, to_double(random_vector(n_small, 3)), std::vector<double>(n_small),
               std::vector<double>(n_small)};
  for (int t = 1; t <= 4; ++t) {
    auto g = to_double(widened[static_cast<std::size_t>(t - 1)]);
    for (auto& x : g) x *= 0.5;
    ref.step(g, t);
  }
  check_close(h.params, ref.p, 1e-5, "adamw with half gradients");

  // float working copy: a plain copy of the parameters.
  const auto fw = run<optim::sgd, Half, float>(sgd_nesterov(), n_small, n_small, 2, 1.0f, true, half_grads);
  CHECK(bitwise_equal(fw.working, fw.params));
}

TEST_CASE("bf16 and fp16 gradients and working copies") {
  SUBCASE("bf16") { check_half_gradients_and_working<bf16>(); }
  SUBCASE("fp16") { check_half_gradients_and_working<fp16>(); }
}

TEST_CASE("results do not depend on the thread count or on chunking") {
  // Above the threshold the step runs on several threads; chunks of 1000 (not a tile multiple)
  // run on one. Every element must come out bitwise the same.
  const std::size_t n = optim::detail::parallel_threshold * 2 + 37;
  INFO("worker threads for the large call: ", optim::detail::worker_count(n));
  CHECK(optim::detail::worker_count(1000) == 1);
  SUBCASE("adamw, bf16 gradients, bf16 working copy") {
    const auto g = random_grads<bf16>(n, 3, 31);
    const auto whole = run<optim::adamw, bf16, bf16>(optim::adamw{}, n, n, 3, 0.25f, true, g);
    const auto chunked = run<optim::adamw, bf16, bf16>(optim::adamw{}, n, 1000, 3, 0.25f, true, g);
    CHECK(bitwise_equal(whole.params, chunked.params));
    CHECK(bitwise_equal(whole.states[0], chunked.states[0]));
    CHECK(bitwise_equal(whole.states[1], chunked.states[1]));
    CHECK(bitwise_equal(whole.working, chunked.working));
  }
  SUBCASE("sgd nesterov, float gradients") {
    const auto g = random_grads<float>(n, 3, 41);
    const auto whole = run(sgd_nesterov(), n, n, 3, 1.0f, false, g);
    const auto chunked = run(sgd_nesterov(), n, 777, 3, 1.0f, false, g);
    CHECK(bitwise_equal(whole.params, chunked.params));
    CHECK(bitwise_equal(whole.states[0], chunked.states[0]));
  }
}

TEST_CASE("bad arguments are usage errors naming the sizes") {
  optim::adamw opt;
  std::vector<float> p(10), g(10), m(10), v(10), short_state(9);
  std::vector<bf16> w(10), short_w(3);
  auto message = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const trident::usage_error& e) {
      return e.message();
    }
    return "no error";
  };
  const std::span<float> ps(p), ms(m), vs(v);
  const std::span<const float> gs(g);
  CHECK(message([&] { opt.step(ps, gs.first(9), {ms, vs}, 1); }) == "adamw::step: 10 parameters but 9 gradients");
  CHECK(message([&] { opt.step(ps, gs, {ms, std::span<float>(short_state)}, 1); }).find("state 1 has 9 elements") != std::string::npos);
  CHECK(message([&] { opt.step(ps, gs, {ms, vs}, 1, 1.0f, std::span<bf16>(short_w)); }).find("working copy has 3") != std::string::npos);
  CHECK(message([&] { opt.step(ps, gs, {ms, vs}, 0); }).find("1-based") != std::string::npos);
  CHECK(message([&] { opt.step(ps, gs, {ms, ms}, 1); }).find("overlap") != std::string::npos);
  CHECK(message([&] { opt.step(ps, gs, {ps, vs}, 1); }).find("overlaps the parameters") != std::string::npos);
  CHECK(message([&] { opt.step(ps, std::span<const float>(p), {ms, vs}, 1); }).find("overlap") != std::string::npos);
  CHECK(message([&] { opt.step(ps, gs, {ms, vs}, 1, 1.0f, std::span<bf16>(w)); }) == "no error");

  // SGD without momentum needs no buffer; Nesterov needs momentum and no dampening.
  optim::sgd plain{{.lr = 0.1f}};
  CHECK(message([&] { plain.step(ps, gs, {std::span<float>{}}, 1); }) == "no error");
  optim::sgd with_momentum{{.lr = 0.1f, .momentum = 0.9f}};
  CHECK(message([&] { with_momentum.step(ps, gs, {std::span<float>{}}, 1); }).find("state 0 has 0 elements") != std::string::npos);
  optim::sgd bad_nesterov{{.lr = 0.1f, .momentum = 0.9f, .dampening = 0.1f, .nesterov = true}};
  CHECK(message([&] { bad_nesterov.step(ps, gs, {ms}, 1); }).find("Nesterov") != std::string::npos);

  // Empty shards are fine (a rank may own nothing of a small bucket).
  CHECK(message([&] { opt.step(std::span<float>{}, std::span<const float>{}, {std::span<float>{}, std::span<float>{}}, 1); }) == "no error");
}

TEST_CASE("gradient_stats: sum of squares and finiteness") {
  SUBCASE("sum of squares against double, several blocks and threads") {
    const std::size_t n = optim::detail::parallel_threshold * 2 + 1001;
    const auto g = random_vector(n, 51, -4.0f, 4.0f);
    const float multiplier = 0.125f;
    double want = 0;
    for (const float x : g) want += static_cast<double>(x * multiplier) * static_cast<double>(x * multiplier);
    const auto s = optim::gradient_stats(std::span<const float>(g), multiplier);
    CHECK(s.finite);
    CHECK(s.sum_squares == doctest::Approx(want).epsilon(1e-12));
    const auto again = optim::gradient_stats(std::span<const float>(g), multiplier);
    CHECK(std::bit_cast<std::uint64_t>(again.sum_squares) == std::bit_cast<std::uint64_t>(s.sum_squares));
  }
  SUBCASE("bf16 and fp16") {
    const std::vector<bf16> b{bf16(1.0f), bf16(-2.0f), bf16(0.5f)};
    CHECK(optim::gradient_stats(std::span<const bf16>(b)).sum_squares == 5.25);
    const std::vector<fp16> h{fp16(3.0f), fp16(4.0f)};
    CHECK(optim::gradient_stats(std::span<const fp16>(h), 2.0f).sum_squares == 100.0);
    CHECK(optim::gradient_stats(std::span<const fp16>{}).sum_squares == 0.0);
    CHECK(optim::gradient_stats(std::span<const fp16>{}).finite);
  }
  SUBCASE("NaN and infinity anywhere are found") {
    std::vector<float> g = random_vector(100000, 52);
    CHECK(optim::gradient_stats(std::span<const float>(g)).finite);
    g[77777] = std::numeric_limits<float>::quiet_NaN();
    CHECK_FALSE(optim::gradient_stats(std::span<const float>(g)).finite);
    g[77777] = -std::numeric_limits<float>::infinity();
    CHECK_FALSE(optim::gradient_stats(std::span<const float>(g)).finite);
    std::vector<fp16> h(1000, fp16(1.0f));
    h[999] = std::numeric_limits<fp16>::infinity();
    CHECK_FALSE(optim::gradient_stats(std::span<const fp16>(h)).finite);
  }
  SUBCASE("the multiplied value is what is checked") {
    const std::vector<float> g{1e30f, 1.0f};
    CHECK(optim::gradient_stats(std::span<const float>(g)).finite);  // squares in double do not overflow
    CHECK_FALSE(optim::gradient_stats(std::span<const float>(g), 1e10f).finite);  // 1e40 is not a float
  }
}

TEST_CASE("clip_multiplier is clip_grad_norm_'s coefficient") {
  CHECK(optim::clip_multiplier(0.5, 1.0f) == 1.0f);
  CHECK(optim::clip_multiplier(0.0, 1.0f) == 1.0f);
  CHECK(optim::clip_multiplier(10.0, 1.0f) == static_cast<float>(1.0 / (10.0 + 1e-6)));
  CHECK(optim::clip_multiplier(4.0, 2.0f) == doctest::Approx(0.5).epsilon(1e-6));
  CHECK(std::isnan(optim::clip_multiplier(std::nan(""), 1.0f)));
  CHECK(optim::clip_multiplier(std::numeric_limits<double>::infinity(), 1.0f) == 0.0f);
  CHECK_THROWS_AS(optim::clip_multiplier(1.0, 0.0f), trident::usage_error);
}

TEST_CASE("bad hyperparameters are usage errors naming the option and the value (torch.optim's ranges)") {
  std::vector<float> p(8, 1.0f), g(8, 0.5f), m(8), v(8);
  auto adamw_with = [&](auto set) {
    trident::optim::adamw o;
    set(o.opt);
    o.step(std::span<float>(p), std::span<const float>(g), {std::span<float>(m), std::span<float>(v)}, 1);
  };
  CHECK_THROWS_WITH_AS(adamw_with([](auto& o) { o.lr = NAN; }), doctest::Contains("adamw: lr = nan is out of range"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(adamw_with([](auto& o) { o.lr = -1e-3f; }), doctest::Contains("lr = -0.001"), trident::usage_error);
  CHECK_THROWS_WITH_AS(adamw_with([](auto& o) { o.beta1 = 1.0f; }), doctest::Contains("beta1 = 1"), trident::usage_error);
  CHECK_THROWS_WITH_AS(adamw_with([](auto& o) { o.beta2 = -0.1f; }), doctest::Contains("beta2"), trident::usage_error);
  CHECK_THROWS_WITH_AS(adamw_with([](auto& o) { o.eps = NAN; }), doctest::Contains("eps"), trident::usage_error);
  CHECK_THROWS_WITH_AS(adamw_with([](auto& o) { o.weight_decay = INFINITY; }), doctest::Contains("weight_decay"),
                       trident::usage_error);
  CHECK(p == std::vector<float>(8, 1.0f));  // nothing was touched
  trident::optim::adam a{{.lr = NAN}};
  CHECK_THROWS_WITH_AS(a.step(std::span<float>(p), std::span<const float>(g), {std::span<float>(m), std::span<float>(v)}, 1),
                       doctest::Contains("adam: lr"), trident::usage_error);
  trident::optim::sgd s{{.lr = 0.1f, .momentum = -0.9f}};
  CHECK_THROWS_WITH_AS(s.step(std::span<float>(p), std::span<const float>(g), {std::span<float>(m)}, 1),
                       doctest::Contains("sgd: momentum = -0.9"), trident::usage_error);
  s.opt = {.lr = NAN};
  CHECK_THROWS_WITH_AS(s.step(std::span<float>(p), std::span<const float>(g), {std::span<float>(m)}, 1),
                       doctest::Contains("sgd: lr"), trident::usage_error);
  trident::optim::adamw zero_lr{{.lr = 0.0f}};  // legal, as in torch (DeepSpeed's first cosine step uses it)
  zero_lr.step(std::span<float>(p), std::span<const float>(g), {std::span<float>(m), std::span<float>(v)}, 1);
}

TEST_CASE("step takes gradients in any contiguous range: a std::vector steps exactly like its span") {
  const std::vector<float> init{0.5f, -1.0f, 2.0f, 0.25f, -0.75f};
  const std::vector<trident::bf16> grads{trident::bf16(0.1f), trident::bf16(-0.2f), trident::bf16(0.3f),
                                         trident::bf16(0.05f), trident::bf16(-0.4f)};
  auto run = [&](auto&& grads_arg) {
    optim::adamw o{{.lr = 1e-2f}};
    std::vector<float> p = init, m(init.size()), v(init.size());
    std::vector<trident::bf16> working(init.size());
    for (std::int64_t t = 1; t <= 3; ++t) o.step(p, grads_arg, {m, v}, t, 0.5f, std::span<trident::bf16>(working));
    return p;
  };
  CHECK(run(grads) == run(std::span<const trident::bf16>(grads)));
  CHECK(run(grads) != init);
}
