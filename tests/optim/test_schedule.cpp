// Learning-rate schedules: the rules checked by hand here, and against the traces recorded
// from DeepSpeed and PyTorch themselves (tests/fixtures/lr_schedules.txt) when present.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "trident/optim/optimizers.hpp"
#include "trident/optim/schedule.hpp"

namespace optim = trident::optim;

TEST_CASE("warmup_lr (DeepSpeed WarmupLR): step k uses iteration k - 2") {
  optim::warmup_lr s{.min_lr = 0.1, .max_lr = 1.1, .warmup_steps = 10, .kind = optim::warmup_kind::linear};
  CHECK(s(1) == 0.1);  // set when the scheduler is made
  CHECK(s(2) == 0.1);  // iteration 0
  CHECK(s(3) == doctest::Approx(0.2));
  CHECK(s(11) == doctest::Approx(1.0));  // iteration 9
  CHECK(s(12) == 1.1);                   // iteration 10: warm
  CHECK(s(1000) == 1.1);
  optim::warmup_lr log{.min_lr = 0.0, .max_lr = 1.0, .warmup_steps = 100};
  CHECK(log(3) == doctest::Approx(std::log(2.0) / std::log(100.0)));
  CHECK_THROWS_AS((void)s(0), trident::usage_error);
  CHECK_THROWS_AS((void)optim::warmup_lr{.max_lr = NAN}(5), trident::usage_error);
}

TEST_CASE("warmup_decay_lr (DeepSpeed WarmupDecayLR): linear to 0 at total_steps") {
  optim::warmup_decay_lr s{{.min_lr = 0.0, .max_lr = 1.0, .warmup_steps = 10, .kind = optim::warmup_kind::linear}, 110};
  CHECK(s(12) == doctest::Approx(1.0));       // iteration 10: (110 - 10) / (110 - 10)
  CHECK(s(62) == doctest::Approx(0.5));       // iteration 60: (110 - 60) / (110 - 10)
  CHECK(s(112) == 0.0);                       // iteration 110
  CHECK(s(500) == 0.0);
}

TEST_CASE("warmup_cosine_lr (DeepSpeed WarmupCosineLR): the first step has lr 0, the floor holds") {
  optim::warmup_cosine_lr s{.lr = 2.0, .total_steps = 50, .warmup_min_ratio = 0.1, .warmup_steps = 10,
                            .cos_min_ratio = 0.05, .kind = optim::warmup_kind::linear};
  CHECK(s(1) == 0.0);
  CHECK(s(2) == doctest::Approx(0.2));  // ratio warmup_min_ratio at iteration 0
  CHECK(s(12) == doctest::Approx(2.0 * (0.05 + 0.95 * (1 + std::cos(M_PI / 40)) / 2)));
  CHECK(s(51) == doctest::Approx(2.0 * 0.05));  // iteration 49 = total - 1: end of the cosine
  CHECK(s(300) == doctest::Approx(0.1));       // clamped: no rising again
}

TEST_CASE("PyTorch-style schedules: LinearLR warm-up, then cosine or linear decay") {
  optim::linear_warmup_lr w{.lr = 1.0, .start_factor = 0.25, .warmup_steps = 4};
  CHECK(w(1) == 0.25);
  CHECK(w(3) == 0.625);
  CHECK(w(5) == 1.0);
  CHECK(w(99) == 1.0);
  optim::warmup_cosine_decay_lr c{.lr = 1.0, .start_factor = 0.5, .warmup_steps = 2, .decay_steps = 10, .eta_min = 0.1};
  CHECK(c(1) == 0.5);
  CHECK(c(3) == doctest::Approx(1.0));
  CHECK(c(8) == doctest::Approx(0.1 + 0.9 * 0.5));  // t = 5 of 10
  CHECK(c(13) == doctest::Approx(0.1));
  optim::warmup_linear_decay_lr l{.lr = 1.0, .start_factor = 0.5, .warmup_steps = 2, .decay_steps = 10, .end_factor = 0.2};
  CHECK(l(8) == doctest::Approx(0.6));
  CHECK(l(40) == doctest::Approx(0.2));
}

TEST_CASE("scheduled<Opt, S>: each step runs with the schedule's lr, bitwise like setting it by hand") {
  using opt_t = optim::scheduled<optim::adamw, optim::linear_warmup_lr>;
  opt_t scheduled{optim::adamw{}, optim::linear_warmup_lr{.lr = 1e-2, .start_factor = 0.1, .warmup_steps = 3}};
  optim::adamw manual;
  const std::size_t n = 64;
  std::vector<float> p1(n, 0.5f), p2(n, 0.5f), g(n), m1(n), v1(n), m2(n), v2(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = 0.01f * static_cast<float>(i) - 0.3f;
  for (std::int64_t t = 1; t <= 6; ++t) {
    scheduled.step(std::span<float>(p1), std::span<const float>(g), std::array<std::span<float>, 2>{m1, v1}, t);
    manual.opt.lr = static_cast<float>(scheduled.schedule(t));
    manual.step(std::span<float>(p2), std::span<const float>(g), std::array<std::span<float>, 2>{m2, v2}, t);
    CHECK(p1 == p2);
  }
  CHECK(manual.opt.lr == static_cast<float>(1e-2));
  CHECK(scheduled.opt.lr == optim::adamw{}.opt.lr);  // the wrapped options are left alone
}
