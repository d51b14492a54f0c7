// The host step's AVX-512 and AVX2 paths (optim/host_simd.hpp) against the element functor run
// one element at a time: every path this CPU has, forced in turn, must give the same bits for
// parameters, states and working copies: SGD (momentum, Nesterov, dampening, weight decay, the
// first step and later ones), Adam (L2) and AdamW; float, fp16 and bf16 gradients and working
// copies; lengths that are no multiple of a vector or a tile; unaligned starts; multipliers
// other than 1; and special values (zeros of both signs, subnormals, infinities, NaNs, numbers
// that overflow fp16, halfway cases of the fp16 / bf16 rounding). NaN payloads are compared
// exactly where one NaN flows through (the conversion tests), not where two meet.
#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "trident/core/half.hpp"
#include "trident/optim/host_simd.hpp"
#include "trident/optim/optimizers.hpp"

namespace optim = trident::optim;
using optim::detail::host_isa;
using trident::bf16;
using trident::fp16;

namespace {

const char* name(host_isa isa) {
  switch (isa) {
    case host_isa::avx512: return "avx512";
    case host_isa::avx2: return "avx2";
    default: return "portable";
  }
}

//! Forces one path for its lifetime.
struct forced_path {
  bool ok;
  explicit forced_path(host_isa isa) : ok(optim::detail::force_host_isa(isa)) {}
  ~forced_path() { optim::detail::unforce_host_isa(); }
  forced_path(const forced_path&) = delete;
  forced_path& operator=(const forced_path&) = delete;
};

std::vector<host_isa> available_paths() {
  std::vector<host_isa> paths;
  for (host_isa isa : {host_isa::portable, host_isa::avx2, host_isa::avx512}) {
    forced_path f(isa);
    if (f.ok) paths.push_back(isa);
  }
  return paths;
}

//! Random floats of many magnitudes, with the special values sprinkled in.
std::vector<float> values(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 6);
  std::uniform_int_distribution<int> pick(0, 63);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min() * 77,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::bit_cast<float>(0x7fc01234u),   // quiet NaN with a payload
                            std::bit_cast<float>(0xff812345u),   // signalling NaN, negative
                            70000.0f,                            // beyond fp16's range
                            1.0f + 0x1p-11f,                     // fp16 halfway (ties to even)
                            1.0f + 3 * 0x1p-11f,                 // fp16 halfway, rounds up
                            1.0f + 0x1p-8f,                      // bf16 halfway
                            1.0f + 3 * 0x1p-8f,                  // bf16 halfway, rounds up
                            0x1p-20f,                            // an fp16 subnormal
                            std::bit_cast<float>(0x7f7fffffu)};  // float max: bf16 rounds to inf
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int k = pick(rng);
    if (k < static_cast<int>(std::size(specials)) && pick(rng) < 8) v[i] = specials[k];
    else v[i] = scale * std::ldexp(normal(rng), exponent(rng) / 4);
  }
  return v;
}

template <class T>
std::vector<T> as(const std::vector<float>& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    std::vector<T> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = T(v[i]);
    return out;
  }
}

template <class T>
std::uint32_t bits(T x) {
  if constexpr (std::is_same_v<T, float>) return std::bit_cast<std::uint32_t>(x);
  else return x.bits();
}

//! Index of the first element whose bits differ, or -1. With `any_nan_payload`, two NaNs count
//! as equal: where two NaNs meet in one operation x86 returns the first operand's payload, and
//! compilers may swap the operands of a commutative operation (the portable tiles do; CUDA
//! returns a canonical NaN anyway). Where only one NaN flows, its payload is compared.
template <class T>
long first_difference(const std::vector<T>& a, const std::vector<T>& b, bool any_nan_payload = false) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (bits(a[i]) != bits(b[i]) &&
        !(any_nan_payload && std::isnan(static_cast<float>(a[i])) && std::isnan(static_cast<float>(b[i])))) {
      MESSAGE("element ", i, ": expected bits ", bits(a[i]), ", got ", bits(b[i]));
      return static_cast<long>(i);
    }
  return -1;
}

struct run_state {
  std::vector<float> params;
  std::array<std::vector<float>, 2> states;
  std::vector<float> working_float;
  std::vector<fp16> working_fp16;
  std::vector<bf16> working_bf16;
  template <class W>
  std::vector<W>& working() {
    if constexpr (std::is_same_v<W, float>) return working_float;
    else if constexpr (std::is_same_v<W, fp16>) return working_fp16;
    else return working_bf16;
  }
};

run_state initial(std::size_t n, std::uint32_t seed) {
  run_state s;
  s.params = values(n, seed, 1.0f);
  s.states[0] = values(n, seed + 1, 0.1f);
  s.states[1] = values(n, seed + 2, 0.01f);
  for (float& v : s.states[1]) v = std::fabs(v);  // exp_avg_sq is never negative
  s.working_float.assign(n, 0.0f);
  s.working_fp16.assign(n, fp16(0.0f));
  s.working_bf16.assign(n, bf16(0.0f));
  return s;
}

//! What every path must equal: the optimizer's own element functor, element by element.
template <class Opt, class Grad, class Working>
void reference_step(const Opt& opt, run_state& s, const std::vector<Grad>& g, std::int64_t t, float multiplier,
                    std::size_t offset, bool with_working) {
  opt.visit_update(t, [&](const auto& u) {
    for (std::size_t i = offset; i < s.params.size(); ++i) {
      u(s.params[i], static_cast<float>(g[i]) * multiplier, s.states[0][i], s.states[1][i]);
      if (with_working) s.working<Working>()[i] = Working(s.params[i]);
    }
  });
}

template <class Opt, class Grad, class Working>
void library_step(const Opt& opt, run_state& s, const std::vector<Grad>& g, std::int64_t t, float multiplier,
                  std::size_t offset, bool with_working) {
  const std::size_t n = s.params.size() - offset;
  std::array<std::span<float>, Opt::state_count> states;
  for (std::size_t k = 0; k < Opt::state_count; ++k) states[k] = std::span<float>(s.states[k]).subspan(offset, n);
  std::span<Working> working;
  if (with_working) working = std::span<Working>(s.working<Working>()).subspan(offset, n);
  opt.step(std::span<float>(s.params).subspan(offset, n), std::span<const Grad>(g).subspan(offset, n), states, t,
           multiplier, working);
}

template <class Opt, class Grad, class Working>
void check_paths(const Opt& opt, const std::string& what) {
  // Lengths around vector and tile sizes, one above the threads' threshold; starts offset by
  // 0-3 floats so that the aligned head runs too.
  const std::size_t lengths[] = {1, 7, 15, 17, 31, 33, 1023, 1025, 4099, optim::detail::parallel_threshold + 37};
  const float multipliers[] = {1.0f, 0.37f, 3.0f};
  const std::vector<host_isa> paths = available_paths();
  std::uint32_t seed = 1;
  for (const std::size_t n : lengths) {
    for (const bool with_working : {false, true}) {
      const std::size_t offset = seed % 4;
      const float multiplier = multipliers[seed % 3];
      ++seed;
      const std::size_t total = n + offset;
      std::vector<Grad> g[3];
      for (int t = 0; t < 3; ++t) g[t] = as<Grad>(values(total, seed * 7 + static_cast<std::uint32_t>(t), 0.5f));
      const run_state start = initial(total, seed);
      run_state expected = start;
      for (std::int64_t t = 1; t <= 3; ++t)
        reference_step<Opt, Grad, Working>(opt, expected, g[t - 1], t, multiplier, offset, with_working);
      for (const host_isa isa : paths) {
        run_state actual = start;
        for (std::int64_t t = 1; t <= 3; ++t) {
          forced_path forced(isa);
          REQUIRE(forced.ok);
          REQUIRE(optim::detail::active_host_isa() == isa);
          library_step<Opt, Grad, Working>(opt, actual, g[t - 1], t, multiplier, offset, with_working);
        }
        const std::string where = what + " on the " + name(isa) + " path, n = " + std::to_string(n) + ", offset " +
                                  std::to_string(offset) + ", multiplier " + std::to_string(multiplier) +
                                  (with_working ? ", with" : ", without") + " a working copy";
        INFO(where);
        CHECK(first_difference(expected.params, actual.params, true) == -1);
        for (std::size_t k = 0; k < Opt::state_count; ++k)
          CHECK(first_difference(expected.states[k], actual.states[k], true) == -1);
        if (with_working) CHECK(first_difference(expected.working<Working>(), actual.working<Working>(), true) == -1);
      }
    }
  }
}

template <class Grad, class Working>
void check_every_optimizer() {
  // Under the sanitizers (tests/CMakeLists.txt) one setting per optimizer, every length and
  // path (157 s at -O0 with every access checked for all eight): the other settings change the
  // arithmetic, not what memory the paths touch.
#if !defined(TRIDENT_TEST_SANITIZED)
  check_paths<optim::sgd, Grad, Working>(optim::sgd{{.lr = 0.1f}}, "sgd");
  check_paths<optim::sgd, Grad, Working>(optim::sgd{{.lr = 0.05f, .momentum = 0.9f, .dampening = 0.25f}},
                                         "sgd momentum dampening");
  check_paths<optim::sgd, Grad, Working>(optim::sgd{{.lr = 0.03f, .weight_decay = 0.1f}}, "sgd weight decay");
  check_paths<optim::adam, Grad, Working>(optim::adam{{.lr = 1e-3f}}, "adam");
  check_paths<optim::adamw, Grad, Working>(optim::adamw{{.lr = 1e-3f, .weight_decay = 0}}, "adamw no decay");
#endif
  check_paths<optim::sgd, Grad, Working>(
      optim::sgd{{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-2f, .nesterov = true}},
      "sgd nesterov weight decay");
  check_paths<optim::adam, Grad, Working>(optim::adam{{.lr = 1e-3f, .weight_decay = 1e-2f}}, "adam l2");
  check_paths<optim::adamw, Grad, Working>(optim::adamw{{.lr = 3e-3f, .beta1 = 0.8f, .beta2 = 0.99f}}, "adamw");
}

}  // namespace

TEST_CASE("the host step's paths: which ones this CPU runs") {
  const host_isa detected = optim::detail::detected_host_isa();
  MESSAGE("host step paths tested here: ", [] {
    std::string s;
    for (host_isa isa : available_paths()) s += std::string(s.empty() ? "" : ", ") + name(isa);
    return s;
  }());
  CHECK(optim::detail::active_host_isa() == detected);
  CHECK(optim::detail::force_host_isa(host_isa::portable));
  CHECK(optim::detail::active_host_isa() == host_isa::portable);
  optim::detail::unforce_host_isa();
  CHECK(optim::detail::active_host_isa() == detected);
  if (detected != host_isa::avx512) {
    CHECK_FALSE(optim::detail::force_host_isa(host_isa::avx512));  // refused: the CPU lacks it
    CHECK(optim::detail::active_host_isa() == detected);
  }
}

TEST_CASE("every path gives the element functor's bits") {
  SUBCASE("float gradients, float working copy") { check_every_optimizer<float, float>(); }
  SUBCASE("float gradients, bf16 working copy") { check_every_optimizer<float, bf16>(); }
  SUBCASE("float gradients, fp16 working copy") { check_every_optimizer<float, fp16>(); }
  SUBCASE("bf16 gradients, bf16 working copy") { check_every_optimizer<bf16, bf16>(); }
  SUBCASE("fp16 gradients, fp16 working copy") { check_every_optimizer<fp16, fp16>(); }
  SUBCASE("fp16 gradients, bf16 working copy") { check_every_optimizer<fp16, bf16>(); }
}

TEST_CASE("every path converts to fp16 and bf16 like trident::fp16 and trident::bf16, for any float") {
  // SGD with lr 0 leaves a finite parameter as it is (p + -0 * g), so the working copy is the
  // conversion of arbitrary float bit patterns: every 4099th one, plus the neighbourhood of
  // every rounding boundary pattern (low 13 / 16 bits near halfway) of a sample of exponents.
  std::vector<float> p;
  for (std::uint64_t b = 0; b <= 0xffffffffu; b += 4099) p.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(b)));
  for (std::uint32_t high = 0; high < 0x10000u; high += 37) {
    for (const std::uint32_t low : {0x0fffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u, 0x2fffu, 0x3000u})
      p.push_back(std::bit_cast<float>((high << 16) | low));
  }
  const std::size_t n = p.size();
  const std::vector<float> zero(n, 0.0f);
  const optim::sgd opt{{.lr = 0.0f}};
  std::vector<fp16> want16(n);
  std::vector<bf16> want_b(n);
  opt.visit_update(1, [&](const auto& u) {
    for (std::size_t i = 0; i < n; ++i) {
      float x = p[i], unused = 0;
      u(x, 0.0f, unused, unused);
      want16[i] = fp16(x);
      want_b[i] = bf16(x);
    }
  });
  for (const host_isa isa : available_paths()) {
    forced_path forced(isa);
    REQUIRE(forced.ok);
    std::vector<float> params = p;
    std::vector<fp16> w16(n);
    opt.step(std::span<float>(params), std::span<const float>(zero), {std::span<float>{}}, 1, 1.0f, std::span<fp16>(w16));
    params = p;
    std::vector<bf16> wb(n);
    opt.step(std::span<float>(params), std::span<const float>(zero), {std::span<float>{}}, 1, 1.0f, std::span<bf16>(wb));
    const std::string where = std::string("path ") + name(isa);
    INFO(where);
    CHECK(first_difference(want16, w16) == -1);
    CHECK(first_difference(want_b, wb) == -1);
  }
}

TEST_CASE("every path reads every fp16 and bf16 gradient like the conversion operators") {
  // All 65536 bit patterns as gradients of SGD with lr 1 from zero: the parameter becomes
  // 0 + -1 * float(g), which carries the conversion's bits (NaN payloads included) through.
  std::vector<fp16> g16(65536);
  std::vector<bf16> gb(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) {
    g16[b] = fp16::from_bits(static_cast<std::uint16_t>(b));
    gb[b] = bf16::from_bits(static_cast<std::uint16_t>(b));
  }
  const optim::sgd opt{{.lr = 1.0f}};
  auto reference = [&](const auto& g) {
    std::vector<float> p(g.size(), 0.0f);
    opt.visit_update(1, [&](const auto& u) {
      float unused = 0;
      for (std::size_t i = 0; i < g.size(); ++i) u(p[i], static_cast<float>(g[i]), unused, unused);
    });
    return p;
  };
  const std::vector<float> want16 = reference(g16), want_b = reference(gb);
  for (const host_isa isa : available_paths()) {
    forced_path forced(isa);
    REQUIRE(forced.ok);
    std::vector<float> p16(65536, 0.0f), pb(65536, 0.0f);
    opt.step(std::span<float>(p16), std::span<const fp16>(g16), {std::span<float>{}}, 1);
    opt.step(std::span<float>(pb), std::span<const bf16>(gb), {std::span<float>{}}, 1);
    const std::string where = std::string("path ") + name(isa);
    INFO(where);
    CHECK(first_difference(want16, p16) == -1);
    CHECK(first_difference(want_b, pb) == -1);
  }
}
