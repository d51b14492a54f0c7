// Learning-rate schedules: the rules checked by hand here, and against the traces recorded
// from DeepSpeed and PyTorch themselves (tests/fixtures/lr_schedules.txt) when present.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <optional>

#include "support/fixtures.hpp"
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

// ---- against the libraries' own traces (tests/fixtures, recorded from DeepSpeed and PyTorch) ----

namespace {

// Any schedule as one type, so a trace's schedule can be chosen at run time.
struct any_schedule {
  std::function<double(std::int64_t)> f;
  double operator()(std::int64_t step) const { return f(step); }
};

optim::warmup_kind kind_of(const test_support::fixture_record& r) {
  return r.text("warmup_type") == "log" ? optim::warmup_kind::log : optim::warmup_kind::linear;
}

// Ours for a schedule record of lr_schedules.txt (none for a kind we do not have).
std::optional<any_schedule> make_schedule(const test_support::fixture_record& r) {
  const std::string kind = r.text("kind");
  const double base = r.number("base_lr");
  if (kind == "ds_warmup")
    return any_schedule{optim::warmup_lr{r.number("warmup_min_lr"), r.number("warmup_max_lr"), r.integer("warmup_num_steps"), kind_of(r)}};
  if (kind == "ds_warmup_decay")
    return any_schedule{optim::warmup_decay_lr{{r.number("warmup_min_lr"), r.number("warmup_max_lr"), r.integer("warmup_num_steps"), kind_of(r)},
                                               r.integer("total_num_steps")}};
  if (kind == "ds_warmup_cosine")
    return any_schedule{optim::warmup_cosine_lr{base, r.integer("total_num_steps"), r.number("warmup_min_ratio"),
                                                r.integer("warmup_num_steps"), r.number("cos_min_ratio"), kind_of(r)}};
  if (kind == "torch_linear")
    return any_schedule{optim::linear_warmup_lr{base, r.number("start_factor"), r.integer("total_iters"), r.number("end_factor")}};
  if (kind == "torch_constant")
    return any_schedule{optim::constant_factor_lr{base, r.number("factor"), r.integer("total_iters")}};
  if (kind == "torch_linear_then_cosine" && r.integer("milestone") == r.integer("total_iters") && r.number("end_factor") == 1.0)
    return any_schedule{optim::warmup_cosine_decay_lr{base, r.number("start_factor"), r.integer("total_iters"), r.integer("T_max"),
                                                      r.number("eta_min")}};
  if (kind == "torch_linear_then_linear" && r.integer("milestone") == r.integer("total_iters") && r.number("end_factor") == 1.0 &&
      r.number("decay_start_factor") == 1.0)
    return any_schedule{optim::warmup_linear_decay_lr{base, r.number("start_factor"), r.integer("total_iters"),
                                                      r.integer("decay_total_iters"), r.number("decay_end_factor")}};
  return std::nullopt;
}

}  // namespace

TEST_CASE("schedules: equal to DeepSpeed's and PyTorch's recorded lr, step by step") {
  int schedules = 0;
  for (const auto& r : test_support::read_fixture("lr_schedules.txt")) {
    if (r.keyword != "schedule") continue;
    const std::string name = r.text("name");
    CAPTURE(name);
    const auto ours = make_schedule(r);
    REQUIRE_MESSAGE(ours.has_value(), "no trident schedule for kind ", r.text("kind"));
    ++schedules;
    // DeepSpeed's closed forms are computed the same way in double: equal. PyTorch's come from
    // its chainable recursion: equal to the closed form within a few ulps.
    const bool deepspeed = r.text("kind").rfind("ds_", 0) == 0;
    double worst = 0;
    for (std::size_t k = 0; k < r.lines.size(); ++k) {
      const double want = r.row(k)[0];
      const double got = (*ours)(static_cast<std::int64_t>(k + 1));
      const double error = std::fabs(got - want) / std::max(std::fabs(want), 1e-300);
      worst = std::max(worst, want == 0 ? std::fabs(got) : error);
    }
    if (deepspeed) CHECK_MESSAGE(worst <= 1e-15, name, ": worst relative difference ", worst);
    else CHECK_MESSAGE(worst <= 1e-13, name, ": worst relative difference ", worst);
  }
  CHECK(schedules >= 20);
}

namespace {

template <class Opt>
std::vector<std::vector<float>> run_trace(Opt opt, const std::vector<float>& init, const std::vector<std::vector<float>>& grads,
                                          const std::optional<any_schedule>& schedule) {
  std::vector<float> p = init;
  std::array<std::vector<float>, Opt::state_count> state;
  for (auto& s : state) s.assign(p.size(), 0.0f);
  std::array<std::span<float>, Opt::state_count> views;
  for (std::size_t i = 0; i < state.size(); ++i) views[i] = state[i];
  std::vector<std::vector<float>> after;
  for (std::size_t k = 0; k < grads.size(); ++k) {
    const auto t = static_cast<std::int64_t>(k + 1);
    if (schedule) optim::scheduled<Opt, any_schedule>(opt, *schedule).step(std::span<float>(p), std::span<const float>(grads[k]), views, t);
    else opt.step(std::span<float>(p), std::span<const float>(grads[k]), views, t);
    after.push_back(p);
  }
  return after;
}

}  // namespace

TEST_CASE("optimizers with schedules: close to torch.optim float32 over 200 steps (Adam/AdamW/AMSGrad 1e-5, SGD 1e-4)") {
  const auto records = test_support::read_fixture("torch_optim.txt");
  std::map<std::string, any_schedule> schedules;
  for (const auto& r : test_support::read_fixture("lr_schedules.txt"))
    if (r.keyword == "schedule") schedules.emplace(r.text("name"), *make_schedule(r));
  std::vector<float> init;
  std::vector<std::vector<float>> grads;
  int traces = 0, amsgrad_traces = 0;
  for (const auto& r : records) {
    auto floats = [&](std::size_t i) {
      std::vector<float> v;
      for (double x : r.row(i)) v.push_back(static_cast<float>(x));
      return v;
    };
    if (r.keyword == "init") init = floats(0);
    if (r.keyword == "grads")
      for (std::size_t i = 0; i < r.lines.size(); ++i) grads.push_back(floats(i));
    if (r.keyword != "trace") continue;
    const std::string name = r.text("name");
    CAPTURE(name);
    std::optional<any_schedule> schedule;
    if (r.text("schedule") != "constant") schedule = schedules.at(r.text("schedule"));
    const std::string which = r.text("optimizer");
    std::vector<std::vector<float>> ours;
    if (which == "sgd") {
      optim::sgd o;
      o.opt.lr = static_cast<float>(r.number("lr"));
      o.opt.momentum = static_cast<float>(r.number("momentum"));
      o.opt.dampening = static_cast<float>(r.number("dampening"));
      o.opt.weight_decay = static_cast<float>(r.number("weight_decay"));
      o.opt.nesterov = r.integer("nesterov") != 0;
      ours = run_trace(o, init, grads, schedule);
    } else {
      auto fill = [&](auto& o) {
        o.opt.lr = static_cast<float>(r.number("lr"));
        o.opt.beta1 = static_cast<float>(r.number("beta1"));
        o.opt.beta2 = static_cast<float>(r.number("beta2"));
        o.opt.eps = static_cast<float>(r.number("eps"));
        o.opt.weight_decay = static_cast<float>(r.number("weight_decay"));
      };
      const bool amsgrad = r.integer("amsgrad") != 0;
      auto run = [&]<class O>() {
        O o;
        fill(o);
        ours = run_trace(o, init, grads, schedule);
      };
      if (which == "adam") {
        if (amsgrad) run.template operator()<optim::adam_amsgrad>();
        else run.template operator()<optim::adam>();
      } else {
        if (amsgrad) run.template operator()<optim::adamw_amsgrad>();
        else run.template operator()<optim::adamw>();
      }
      if (amsgrad) ++amsgrad_traces;
    }
    ++traces;
    double worst = 0;
    for (std::size_t k = 0; k < r.lines.size(); ++k) {
      const auto row = r.row(k);
      if (schedule) CHECK(static_cast<float>((*schedule)(static_cast<std::int64_t>(k + 1))) == static_cast<float>(row[0]));
      for (std::size_t i = 0; i < ours[k].size(); ++i) {
        const double want = static_cast<float>(row[i + 1]);
        worst = std::max(worst, std::fabs(ours[k][i] - want) / std::max(std::fabs(want), 1e-3));
      }
    }
    // torch's CPU kernels fuse SGD's `add(x, alpha=a)` into fused multiply-adds; ours rounds the
    // product first (so the host and CUDA steps agree bitwise), which drifts by about an ulp per
    // step: 2.4e-5 to 6.6e-5 after 200 steps. Adam's and AdamW's stay within 1.3e-7.
    const double tolerance = which == "sgd" ? 1e-4 : 1e-5;
    CHECK_MESSAGE(worst <= tolerance, name, ": worst relative difference over 200 steps ", worst);
  }
  CHECK(traces >= 20);
  CHECK(amsgrad_traces == 2);  // adam_amsgrad and adamw_amsgrad
  MESSAGE(traces, " traces compared, ", amsgrad_traces, " of them AMSGrad");
}

TEST_CASE("schedules: bad values are refused by name, not handed on as a NaN or negative lr") {
  using trident::usage_error;
  auto refused = [](auto schedule, std::int64_t step, const char* what) {
    INFO(std::string(what));
    CHECK_THROWS_WITH_AS((void)schedule(step), doctest::Contains(what), usage_error);
  };
  refused(optim::constant_lr{.lr = NAN}, 1, "constant_lr: lr must be finite and >= 0");
  refused(optim::constant_lr{.lr = -1}, 1, "constant_lr: lr must be finite and >= 0");
  refused(optim::constant_factor_lr{.lr = -1}, 1, "constant_factor_lr: lr must be finite");
  refused(optim::constant_factor_lr{.total_iters = -3}, 1, "total_iters must be >= 0");
  refused(optim::warmup_cosine_lr{.cos_min_ratio = NAN}, 5, "cos_min_ratio must be in [0, 1]");
  refused(optim::warmup_cosine_lr{.cos_min_ratio = 5}, 5, "cos_min_ratio must be in [0, 1]");
  refused(optim::warmup_cosine_lr{.warmup_min_ratio = -1}, 5, "warmup_min_ratio must be in [0, 1]");
  refused(optim::warmup_cosine_lr{.total_steps = INT64_MIN}, 5, "total_steps must be >= 0");
  // After the warm-up, too (the decay's lr was not checked there).
  refused(optim::warmup_cosine_decay_lr{.lr = -1, .warmup_steps = 0}, 1, "warmup_cosine_decay_lr: lr must be finite");
  refused(optim::warmup_linear_decay_lr{.lr = -1, .warmup_steps = 0}, 1, "warmup_linear_decay_lr: lr must be finite");
  refused(optim::warmup_linear_decay_lr{.warmup_steps = INT64_MIN}, 10, "warmup_steps must be >= 0");
  CHECK(optim::warmup_linear_decay_lr{.lr = 1.0, .warmup_steps = 0, .decay_steps = 10, .end_factor = 0.5}(1) == 1.0);
}
