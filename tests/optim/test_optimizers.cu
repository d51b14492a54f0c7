// The CUDA step against the host step (same element code: bitwise, or within 2 ulp where the
// host compiler contracts into FMA), on the vectorised path, on odd sizes with scalar tails and
// on unaligned shards; the device gradient_stats against the host one. Skipped without a device.
#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "support/random.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/half.hpp"
#include "trident/optim/cuda/step.cuh"
#include "trident/optim/optimizers.hpp"

namespace optim = trident::optim;
using trident::bf16;
using trident::buffer;
using trident::cuda_space;
using trident::device_span;
using trident::fp16;

namespace {

using test_support::random_vector;

std::int64_t ulp_distance(float a, float b) {
  auto key = [](float x) {
    const auto i = std::bit_cast<std::int32_t>(x);
    return i < 0 ? static_cast<std::int64_t>(std::numeric_limits<std::int32_t>::min()) - i : static_cast<std::int64_t>(i);
  };
  return std::llabs(key(a) - key(b));
}

void check_ulps(const std::vector<float>& device, const std::vector<float>& host, const char* what) {
  REQUIRE(device.size() == host.size());
  std::int64_t worst = 0;
  std::size_t where = 0;
  for (std::size_t i = 0; i < host.size(); ++i) {
    const std::int64_t d = ulp_distance(device[i], host[i]);
    if (d > worst) {
      worst = d;
      where = i;
    }
  }
  INFO(what, ": worst ", worst, " ulp at ", where);
  CHECK(worst <= 2);
}

// `offset` elements into each allocation: 0 for the vectorised path, 1 for unaligned shards.
template <class Opt, class Grad, class Working>
void device_vs_host(const Opt& opt, std::size_t n, std::size_t offset, bool with_working, int steps = 5) {
  INFO("n = ", n, ", offset = ", offset, ", working copy = ", with_working);
  constexpr std::size_t S = Opt::state_count;
  std::vector<float> p = random_vector(n, 7);
  std::array<std::vector<float>, S> states;
  for (auto& s : states) s.assign(n, 0.0f);
  std::vector<Working> w(with_working ? n : 0);

  buffer<float, cuda_space> d_p(n + offset);
  buffer<Grad, cuda_space> d_g(n + offset);
  std::array<buffer<float, cuda_space>, S> d_s;
  for (auto& s : d_s) {
    s = buffer<float, cuda_space>(n + offset);
    trident::fill_zero(s);
  }
  buffer<Working, cuda_space> d_w(n + offset);
  TRIDENT_CUDA_CHECK(cudaMemcpy(d_p.data() + offset, p.data(), n * sizeof(float), cudaMemcpyHostToDevice));

  for (int t = 1; t <= steps; ++t) {
    const auto gf = random_vector(n, 100 + static_cast<std::uint32_t>(t), -3.0f, 3.0f);
    std::vector<Grad> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = Grad(gf[i]);
    TRIDENT_CUDA_CHECK(cudaMemcpy(d_g.data() + offset, g.data(), n * sizeof(Grad), cudaMemcpyHostToDevice));
    const float multiplier = 0.75f;

    std::array<std::span<float>, S> hs;
    std::array<device_span<float>, S> ds;
    for (std::size_t s = 0; s < S; ++s) {
      hs[s] = std::span<float>(states[s]);
      ds[s] = d_s[s].device_handle().subspan(offset, n);
    }
    opt.step(std::span<float>(p), std::span<const Grad>(g), hs, t, multiplier, std::span<Working>(w));
    trident::cuda::step(opt, d_p.device_handle().subspan(offset, n), device_span<const Grad>(d_g.data() + offset, n), ds, t,
                        multiplier, with_working ? d_w.device_handle().subspan(offset, n) : device_span<Working>{});
  }
  TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> dp(n);
  TRIDENT_CUDA_CHECK(cudaMemcpy(dp.data(), d_p.data() + offset, n * sizeof(float), cudaMemcpyDeviceToHost));
  check_ulps(dp, p, "params");
  for (std::size_t s = 0; s < S; ++s) {
    if constexpr (std::is_same_v<Opt, optim::sgd>) {
      if (opt.opt.momentum == 0) break;  // the buffer is untouched
    }
    std::vector<float> ds(n);
    TRIDENT_CUDA_CHECK(cudaMemcpy(ds.data(), d_s[s].data() + offset, n * sizeof(float), cudaMemcpyDeviceToHost));
    check_ulps(ds, states[s], "state");
  }
  if (with_working) {
    std::vector<Working> dw(n);
    TRIDENT_CUDA_CHECK(cudaMemcpy(dw.data(), d_w.data() + offset, n * sizeof(Working), cudaMemcpyDeviceToHost));
    std::vector<float> dwf(dw.begin(), dw.end()), hwf(w.begin(), w.end());
    check_ulps(dwf, hwf, "working copy");  // rounded from params within 2 ulp: at most 1 ulp apart here
  }
}

template <class Opt>
void all_shapes(const Opt& opt) {
  for (const std::size_t n : {std::size_t{1} << 20, std::size_t{1000003}, std::size_t{3}, std::size_t{4099}}) {
    for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
      device_vs_host<Opt, float, float>(opt, n, offset, false);
      device_vs_host<Opt, bf16, bf16>(opt, n, offset, true);
      device_vs_host<Opt, fp16, fp16>(opt, n, offset, true);
    }
  }
}

}  // namespace

TEST_CASE("cuda::step agrees with the host step: sgd") {
  SUBCASE("plain") { all_shapes(optim::sgd{{.lr = 0.1f}}); }
  SUBCASE("momentum, dampening, weight decay") {
    all_shapes(optim::sgd{{.lr = 0.05f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 1e-3f}});
  }
  SUBCASE("nesterov") { all_shapes(optim::sgd{{.lr = 0.05f, .momentum = 0.9f, .nesterov = true}}); }
}

TEST_CASE("cuda::step agrees with the host step: adam, adamw (with and without amsgrad)") {
  SUBCASE("adam") { all_shapes(optim::adam{{.lr = 1e-2f}}); }
  SUBCASE("adam, L2") { all_shapes(optim::adam{{.lr = 1e-2f, .weight_decay = 0.1f}}); }
  SUBCASE("adamw") { all_shapes(optim::adamw{{.lr = 1e-2f}}); }
  SUBCASE("float working copy") { device_vs_host<optim::adamw, bf16, float>(optim::adamw{}, 12345, 0, true); }
  SUBCASE("adam, amsgrad") { all_shapes(optim::adam_amsgrad{{.lr = 1e-2f, .weight_decay = 0.1f}}); }
  SUBCASE("adamw, amsgrad") { all_shapes(optim::adamw_amsgrad{{.lr = 1e-2f}}); }
}

TEST_CASE("cuda::step checks its arguments like the host") {
  buffer<float, cuda_space> p(10), g(9), m(10), v(10);
  CHECK_THROWS_AS(trident::cuda::step(optim::adamw{}, p.device_handle(), device_span<const float>(g.device_handle()),
                                      {m.device_handle(), v.device_handle()}, 1),
                  trident::usage_error);
}

// The device's sum is CUB's (optim/cuda/step.cuh): the host's within 1e-12 relative (CUB adds
// in its own order), and the same bits every time on one GPU.
TEST_CASE("cuda::gradient_stats is the host's within 1e-12, and repeatable bit for bit") {
  auto bits = [](double x) { return std::bit_cast<std::uint64_t>(x); };
  for (const std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{65536}, std::size_t{1000003}}) {
    INFO("n = ", n);
    const auto gf = random_vector(n, 9, -5.0f, 5.0f);
    std::vector<bf16> gb(n);
    for (std::size_t i = 0; i < n; ++i) gb[i] = bf16(gf[i]);
    buffer<float, cuda_space> d_f(n);
    buffer<bf16, cuda_space> d_b(n);
    trident::copy(std::span<const float>(gf), d_f);
    trident::copy(std::span<const bf16>(gb), d_b);
    const auto hf = optim::gradient_stats(std::span<const float>(gf), 0.5f);
    const auto df = trident::cuda::gradient_stats(device_span<const float>(d_f.device_handle()), 0.5f);
    CHECK(df.finite);
    CHECK(df.sum_squares == doctest::Approx(hf.sum_squares).epsilon(1e-12));
    const auto hb = optim::gradient_stats(std::span<const bf16>(gb), 2.0f);
    const auto db = trident::cuda::gradient_stats(device_span<const bf16>(d_b.device_handle()), 2.0f);
    CHECK(db.sum_squares == doctest::Approx(hb.sum_squares).epsilon(1e-12));
    if (n == 0) CHECK(bits(df.sum_squares) == bits(0.0));
    // The form ZeRO's step uses: the sum into a slot of its own, CUB's storage in a scratch reused
    // across calls (and gradient types), nothing allocated or waited for until the slots are read.
    buffer<double, cuda_space> slots(3), partials(trident::cuda::gradient_stats_scratch_size(n));
    const std::vector<double> unwritten(3, -1.0);  // so that a slot never written shows
    trident::copy(std::span<const double>(unwritten), slots);
    trident::cuda::gradient_stats_async(device_span<const float>(d_f.device_handle()), 0.5f, slots.data(), partials.device_handle());
    trident::cuda::gradient_stats_async(device_span<const bf16>(d_b.device_handle()), 2.0f, slots.data() + 1,
                                        partials.device_handle());
    trident::cuda::gradient_stats_async(device_span<const float>(d_f.device_handle()), 0.5f, slots.data() + 2,
                                        partials.device_handle());
    const auto all = trident::to_vector(slots);
    CHECK(bits(all[0]) == bits(df.sum_squares));
    CHECK(bits(all[1]) == bits(db.sum_squares));
    CHECK(bits(all[2]) == bits(all[0]));
    // Too small a scratch is an error naming the sizes, not a write past its end.
    if (n > 0) {
      CHECK_THROWS_WITH_AS(trident::cuda::gradient_stats_async(device_span<const float>(d_f.device_handle()), 0.5f, slots.data(),
                                                               device_span<double>(partials.data(), 0)),
                           doctest::Contains("needs"), trident::usage_error);
    }
  }
  SUBCASE("non-finite gradients are found") {
    std::vector<fp16> g(200000, fp16(1.0f));
    g[123456] = std::numeric_limits<fp16>::quiet_NaN();
    buffer<fp16, cuda_space> d(g.size());
    trident::copy(std::span<const fp16>(g), d);
    CHECK_FALSE(trident::cuda::gradient_stats(device_span<const fp16>(d.device_handle())).finite);
  }
}
