// The loss scalers: DeepSpeed's DynamicLossScaler step for step. The hand-written cases below
// pin the rules; the traces in tests/fixtures/deepspeed_loss_scaler.txt, recorded from DeepSpeed
// itself (scripts/reference/make_fixtures.sh), are the oracle.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/fixtures.hpp"
#include "trident/precision/loss_scaler.hpp"
#include "trident/precision/mixed_precision.hpp"

using trident::dynamic_loss_scaler;

TEST_CASE("dynamic_loss_scaler: the scale grows after window + 1 clean steps, as DeepSpeed >= 0.17.1") {
  dynamic_loss_scaler::options o;
  o.window = 3;
  dynamic_loss_scaler s(o);
  CHECK(s.scale() == 65536.0);
  // iterations 0..2: clean steps since the last overflow (at -1), not counting the first: 0, 1, 2
  for (int i = 0; i < 3; ++i) CHECK(s.update(false));
  CHECK(s.scale() == 65536.0);  // the rule before 0.17.1 grew here
  CHECK(s.update(false));       // iteration 3: stable interval 3 = window
  CHECK(s.scale() == 131072.0);
  CHECK_FALSE(s.update(true));  // hysteresis 2 -> 1, scale kept, step skipped
  CHECK(s.scale() == 131072.0);
  CHECK(s.hysteresis_left() == 1);
  CHECK_FALSE(s.update(true));  // now it shrinks
  CHECK(s.scale() == 65536.0);
  CHECK(s.hysteresis_left() == 1);  // not refilled by shrinking
  for (int i = 0; i < 3; ++i) CHECK(s.update(false));
  CHECK(s.scale() == 65536.0);
  CHECK(s.update(false));  // four clean steps after the overflow
  CHECK(s.scale() == 131072.0);
  CHECK(s.hysteresis_left() == 2);  // growing refills it
  CHECK(s.iteration() == 10);
}

TEST_CASE("dynamic_loss_scaler: consecutive hysteresis refills on every clean step") {
  dynamic_loss_scaler::options o;
  o.hysteresis = 3;
  o.consecutive_hysteresis = true;
  dynamic_loss_scaler s(o);
  CHECK_FALSE(s.update(true));
  CHECK_FALSE(s.update(true));
  CHECK(s.hysteresis_left() == 1);
  CHECK(s.update(false));
  CHECK(s.hysteresis_left() == 3);
  CHECK(s.scale() == 65536.0);
}

TEST_CASE("dynamic_loss_scaler: an overflow at the minimum scale is an error by default, or skipped when asked") {
  dynamic_loss_scaler::options o;
  o.initial_scale = 2.0;
  o.hysteresis = 1;
  dynamic_loss_scaler s(o);
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 1.0);
  CHECK_THROWS_WITH_AS(s.update(true), doctest::Contains("already at its minimum (1)"), trident::loss_scale_error);
  CHECK(s.scale() == 1.0);       // the state is as before the call, as in DeepSpeed
  CHECK(s.iteration() == 1);
  o.raise_error_at_min_scale = false;
  dynamic_loss_scaler quiet(o);
  for (int i = 0; i < 5; ++i) CHECK_FALSE(quiet.update(true));
  CHECK(quiet.scale() == 1.0);  // never below min_scale
}

TEST_CASE("dynamic_loss_scaler: the scale stays finite through any number of clean steps") {
  dynamic_loss_scaler::options o;
  o.window = 1;
  dynamic_loss_scaler s(o);
  for (int i = 0; i < 5000; ++i) s.update(false);
  CHECK(std::isfinite(s.scale()));
  CHECK(s.scale() == 0x1p127);
  CHECK(std::isfinite(static_cast<float>(s.scale())));
  CHECK_FALSE(s.update(true));
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 0x1p126);  // and it comes back down (DeepSpeed's inf would not)
}

TEST_CASE("dynamic_loss_scaler: bad options are usage errors naming the option") {
  auto with = [](auto set) {
    dynamic_loss_scaler::options o;
    set(o);
    return o;
  };
  CHECK_THROWS_WITH_AS(dynamic_loss_scaler(with([](auto& o) { o.initial_scale = 0; })), doctest::Contains("initial_scale"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(dynamic_loss_scaler(with([](auto& o) { o.initial_scale = NAN; })), doctest::Contains("initial_scale"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(dynamic_loss_scaler(with([](auto& o) { o.factor = 1; })), doctest::Contains("factor"), trident::usage_error);
  CHECK_THROWS_WITH_AS(dynamic_loss_scaler(with([](auto& o) { o.window = 0; })), doctest::Contains("window"), trident::usage_error);
  CHECK_THROWS_WITH_AS(dynamic_loss_scaler(with([](auto& o) { o.hysteresis = 0; })), doctest::Contains("hysteresis"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(dynamic_loss_scaler(with([](auto& o) { o.min_scale = -1; })), doctest::Contains("min_scale"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS(dynamic_loss_scaler(with([](auto& o) { o.max_scale = INFINITY; })), doctest::Contains("max_scale"),
                       trident::usage_error);
}

TEST_CASE("static_loss_scaler and the precision policies") {
  trident::static_loss_scaler s{128.0};
  CHECK(s.scale() == 128.0);
  CHECK(s.update(false));
  CHECK_FALSE(s.update(true));
  static_assert(std::is_same_v<trident::mixed_precision<trident::fp16>::scaler_type, dynamic_loss_scaler>);
  static_assert(std::is_same_v<trident::mixed_precision<trident::bf16>::scaler_type, trident::static_loss_scaler>);
  static_assert(trident::mixed_precision<trident::bf16>::has_master && !trident::full_precision::has_master);
}

TEST_CASE("dynamic_loss_scaler: identical to DeepSpeed's DynamicLossScaler on every recorded trace") {
  const auto records = test_support::read_fixture("deepspeed_loss_scaler.txt");
  int traces = 0, raised = 0, capped = 0;
  long long steps_compared = 0;
  for (const auto& r : records) {
    if (r.keyword != "trace") continue;
    ++traces;
    const std::string name = r.text("name");
    CAPTURE(name);
    dynamic_loss_scaler::options o;
    o.initial_scale = r.number("init_scale");
    o.factor = r.number("scale_factor");
    o.window = r.integer("scale_window");
    o.min_scale = r.number("min_scale");
    o.hysteresis = static_cast<int>(r.integer("delayed_shift"));
    o.consecutive_hysteresis = r.integer("consecutive_hysteresis") != 0;
    o.raise_error_at_min_scale = r.integer("raise_error_at_min_scale") != 0;
    dynamic_loss_scaler ours(o);
    const long long n = r.integer("steps");
    const std::string exception = r.text("exception");
    // The sparse lines: step, overflow, scale after, hysteresis after, raised.
    std::size_t next = 0;
    double want_scale = o.initial_scale;
    int want_hysteresis = o.hysteresis;
    bool stopped = false;
    for (long long step = 1; step <= n && !stopped; ++step) {
      bool overflow = false, raises = false;
      if (next < r.lines.size() && static_cast<long long>(r.row(next)[0]) == step) {
        const auto row = r.row(next++);
        overflow = row[1] != 0;
        want_scale = row[2];
        want_hysteresis = static_cast<int>(row[3]);
        raises = row[4] != 0;
      }
      if (want_scale > o.max_scale) {
        // DeepSpeed's float kept doubling (to inf, after which it raises OverflowError on its next
        // overflow); ours stops at max_scale. Identical up to here; then ours is finite.
        CHECK(ours.scale() == o.max_scale);
        CHECK(std::isfinite(ours.scale()));
        ++capped;
        stopped = true;
        break;
      }
      if (raises) {
        CHECK(exception == "Exception");  // the error at the minimum scale
        CHECK_THROWS_AS(ours.update(overflow), trident::loss_scale_error);
        ++raised;
        stopped = true;
      } else {
        CHECK(ours.update(overflow) == !overflow);  // skipped exactly when it overflowed
      }
      if (ours.scale() != want_scale || ours.hysteresis_left() != want_hysteresis) {
        FAIL_CHECK("step ", step, ": DeepSpeed has scale ", want_scale, " hysteresis ", want_hysteresis, ", ours ", ours.scale(),
                   " ", ours.hysteresis_left());
        stopped = true;
      }
      ++steps_compared;
    }
  }
  MESSAGE(traces, " traces, ", steps_compared, " steps compared, ", raised, " raised at the minimum scale, ", capped,
          " stopped at max_scale where DeepSpeed's scale grows past 2^127");
  CHECK(traces >= 100);
  CHECK(raised > 0);
  CHECK(capped > 0);
}
